extension JobRenderer {
    /// The `apns` object of a job for an APNs device.
    func writeAPNs(
        token: String, sealing: PreparedEmail.Sealing, encryptedKey: EncryptedAESKey?, device: DeviceRegistration, jobId: String,
        expiresAtMs: Int64, to w: inout JSONWriter
    ) throws(RenderError) {
        w.key("apns")
        w.beginObject()
        w.key("headers")
        w.beginObject()
        w.field("apns-push-type", "alert")
        w.field("apns-priority", "10")
        // Without a bundle id the sender's default topic applies; never invent one.
        if let bundleId = device.bundleId { w.field("apns-topic", bundleId) }
        w.field("apns-expiration", String(Self.floorDiv(expiresAtMs, 1000)))
        w.endObject()
        w.field("deviceToken", token)
        w.key("payload")
        try writeSealedPayload(sealing: sealing, encryptedKey: encryptedKey, jobId: jobId, frame: .apns, to: &w)
        w.endObject()
    }

    /// `apns.payload` up to where the sudoplatform `data` string starts.
    static func apnsPayloadHead(_ options: RenderOptions) -> [UInt8] {
        var w = JSONWriter(capacity: 256)
        w.beginObject()
        w.key("aps")
        w.beginObject()
        w.key("alert")
        w.beginObject()
        w.field("title", options.alertTitle)
        w.field("body", options.alertBody)
        w.endObject()
        w.field("mutable-content", Int64(1))
        w.endObject()
        w.key("sudoplatform")
        return w.bytes + sudoplatformHead
    }

    static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 {
        let q = a / b
        return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q
    }
}
