extension JobRenderer {
    /// The `fcm` object of a job for an FCM device.
    func writeFCM(
        token: String, sealing: PreparedEmail.Sealing, encryptedKey: EncryptedAESKey?, jobId: String, to w: inout JSONWriter
    ) throws(RenderError) {
        w.key("fcm")
        w.beginObject()
        w.key("message")
        w.beginObject()
        w.field("token", token)
        w.key("android")
        w.beginObject()
        w.field("priority", "high")
        w.field("ttl", "\(fcmTTLSeconds())s")
        w.endObject()
        w.key("data")
        try writeSealedPayload(sealing: sealing, encryptedKey: encryptedKey, jobId: jobId, frame: .fcm, to: &w)
        w.endObject()
        w.endObject()
    }

    /// FCM refuses a `ttl` outside 0…28 days (its HTTP v1 `AndroidConfig.ttl`).
    static let fcmMaxTTLSeconds: Int64 = 2_419_200

    /// FCM's `ttl` is the configured TTL, as `expiresAtEpochMs` is, up to FCM's own limit: a longer one made
    /// FCM refuse every Android job. The time left until expiry would be 0 for a backfilled old email, and FCM
    /// drops a 0 s message it cannot deliver at once; the sender can still drop jobs past `expiresAtEpochMs`.
    func fcmTTLSeconds() -> Int64 {
        min(max(options.ttlSeconds, 0), Self.fcmMaxTTLSeconds)
    }
}
