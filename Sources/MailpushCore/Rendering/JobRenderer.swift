/// The input record a push job came from; also the `mailpush-source` header.
public struct SourceRef: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }

    /// `topic/partition/offset`.
    public var headerValue: String { "\(topic)/\(partition)/\(offset)" }
}

public struct RenderOptions: Sendable {
    /// The iOS alert placeholder; the Notification Service Extension replaces it after
    /// decrypting (iOS ignores an extension's changes when the alert is missing).
    public var alertTitle: String
    public var alertBody: String
    public var ttlSeconds: Int64
    /// Endpoint for com method 3 devices; without it they get no job.
    public var sponsorWebhookURL: String?

    public init(alertTitle: String = "New email", alertBody: String = "You have a new message",
                ttlSeconds: Int64 = 2_419_200, sponsorWebhookURL: String? = nil) {
        self.alertTitle = alertTitle
        self.alertBody = alertBody
        self.ttlSeconds = ttlSeconds
        self.sponsorWebhookURL = sponsorWebhookURL
    }
}

/// A serialized PushJob v1, ready to produce (key = `deviceId`).
public struct RenderedJob: Sendable {
    public var jobId: String
    public var deviceId: String
    public var platform: String
    public var value: [UInt8]

    public init(jobId: String, deviceId: String, platform: String, value: [UInt8]) {
        self.jobId = jobId
        self.deviceId = deviceId
        self.platform = platform
        self.value = value
    }
}

public enum RenderError: Error, Sendable, Equatable {
    /// Even with subject and display names shortened, the payload exceeds the push limit.
    case payloadTooLarge
    /// A com method 3 device, and no `--sponsor-webhook-url` configured.
    case noSponsorWebhook
    /// An APNs/FCM device and no key for the address (the caller should have checked).
    case missingKey(emailAddressId: String)
    /// The crypto library refused to seal (not expected with a key that decoded).
    case sealingFailed(String)

    /// One line for the `mailpush-error` header and logs.
    public var reason: String {
        switch self {
        case .payloadTooLarge: return "sealed payload exceeds \(JobRenderer.maxPushPayloadBytes) bytes"
        case .noSponsorWebhook: return "no sponsor webhook URL configured for com method 3 devices"
        case .missingKey(let id): return "no public key for address \(id)"
        case .sealingFailed(let why): return "sealing failed: \(why)"
        }
    }
}

/// Renders PushJob v1 records (CONTRACT §7).
///
/// Cost per job: one RSA encryption, one AES pass and a few KiB of byte appends. Payload sizes
/// are computed before sealing — the sealed length depends only on the plaintext length, and
/// base64 never needs JSON escaping at any nesting level — so nothing is sealed twice.
public struct JobRenderer: Sendable {
    public static let schemaVersion: Int64 = 1
    /// APNs' limit for the payload, and FCM's for the data of a message.
    public static let maxPushPayloadBytes = 4096

    public let options: RenderOptions
    /// `apns.payload` up to where the sudoplatform `data` string starts; depends only on the
    /// options, so it is serialized once.
    private let apnsHead: [UInt8]

    public init(options: RenderOptions) {
        self.options = options
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
        self.apnsHead = w.bytes + Self.sudoplatformHead
    }

    /// Renders the job for one device. `key` may be `nil` only for webhook devices (nothing is
    /// sealed for them).
    public func render(event: EmailReceived, device: DeviceRegistration, key: AddressKey?,
                       source: SourceRef, nowMs: Int64) throws(RenderError) -> RenderedJob {
        let jobId = JobID.make(emailAddressId: event.emailAddressId, messageId: event.messageId, deviceId: device.deviceId)
        let expiresAtMs = event.receivedAtEpochMs &+ options.ttlSeconds &* 1000

        var w = JSONWriter(capacity: 5120)
        w.beginObject()
        w.field("version", Self.schemaVersion)
        w.field("jobId", jobId)
        w.field("deviceId", device.deviceId)
        w.field("owner", device.owner)
        w.field("platform", device.platform)
        // Sponsor (com method) devices may have no bundle id: then the key is left out, never null.
        if let bundleId = device.bundleId { w.field("bundleId", bundleId) }
        w.field("createdAtEpochMs", nowMs)
        w.field("expiresAtEpochMs", expiresAtMs)
        w.key("source")
        w.beginObject()
        w.field("topic", source.topic)
        w.field("partition", Int64(source.partition))
        w.field("offset", source.offset)
        w.endObject()

        switch device.target {
        case .webhook(let sponseeDetails):
            guard let url = options.sponsorWebhookURL else { throw .noSponsorWebhook }
            w.key("webhook")
            w.beginObject()
            w.field("url", url)
            w.key("body")
            w.beginObject()
            w.field("msgId", event.messageId)
            w.field("sponseeDetails", sponseeDetails)
            w.key("metaData")
            w.beginObject()
            w.field("msgType", EmailReceived.messageReceivedType)
            w.endObject()
            w.endObject()
            w.endObject()

        case .apns(let token):
            guard let key else { throw .missingKey(emailAddressId: event.emailAddressId) }
            let payload = try sealedPayload(event: event, key: key, jobId: jobId, frame: .apns)
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
            w.rawValue(payload)
            w.endObject()

        case .fcm(let token):
            guard let key else { throw .missingKey(emailAddressId: event.emailAddressId) }
            let data = try sealedPayload(event: event, key: key, jobId: jobId, frame: .fcm)
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
            w.rawValue(data)
            w.endObject()
            w.endObject()
        }
        w.endObject()
        return RenderedJob(jobId: jobId, deviceId: device.deviceId, platform: device.platform, value: w.bytes)
    }

    /// FCM's `ttl` is the configured TTL, as `expiresAtEpochMs` is. The time left until expiry
    /// would be 0 for a backfilled old email, and FCM drops a 0 s message it cannot deliver at
    /// once; the sender can still drop jobs past `expiresAtEpochMs`.
    func fcmTTLSeconds() -> Int64 {
        max(options.ttlSeconds, 0)
    }

    // MARK: - Sealed payload

    enum Frame {
        /// `apns.payload`: `{"aps":{…},"sudoplatform":{…},"jobId":…}`.
        case apns
        /// `fcm.message.data`: `{"sudoplatform":"<JSON text>","jobId":…}`.
        case fcm
    }

    /// Serialized `apns.payload` / `fcm.message.data`, within `maxPushPayloadBytes`.
    func sealedPayload(event: EmailReceived, key: AddressKey, jobId: String, frame: Frame) throws(RenderError) -> [UInt8] {
        let (prefix, suffix) = payloadFrame(key: key, jobId: jobId, frame: frame)
        let budget = Self.maxPushPayloadBytes - prefix.count - suffix.count
        let rsaBytes = key.publicKey.keySizeInBits / 8
        guard let plaintextLimit = Self.largestPlaintext(base64Budget: budget, algorithm: key.algorithm, rsaBytes: rsaBytes) else {
            throw .payloadTooLarge
        }

        var text = NotificationText(event)
        var plaintext = text.plaintext(event)
        if plaintext.count > plaintextLimit {
            guard text.shorten(currentLength: plaintext.count, toFit: plaintextLimit) != nil else { throw .payloadTooLarge }
            plaintext = text.plaintext(event)
        }

        var payload = prefix
        do {
            try Sealer.sealBase64(plaintext, with: key, into: &payload)
        } catch {
            throw .sealingFailed("\(error)")
        }
        payload.append(contentsOf: suffix)
        // Cannot happen while the size arithmetic matches the serialization (the tests check
        // it does); if it ever stopped matching, dead-letter rather than send an oversized push.
        guard payload.count <= Self.maxPushPayloadBytes else {
            assertionFailure("size computation out of step with serialization")
            throw .payloadTooLarge
        }
        return payload
    }

    /// The payload serialized around the base64 of the sealed bytes: `prefix ‖ base64 ‖ suffix`
    /// is the whole payload. Escaping works byte by byte and base64 needs none, so each part can
    /// be escaped on its own, however deeply the data string is nested:
    ///
    ///     data         = {"keyId":…,"algorithm":…,"type":"messageReceived","sealed":"<base64>"}
    ///     sudoplatform = {"servicename":"emService","data":"<data, escaped>"}
    ///     apns.payload = {"aps":{…},"sudoplatform":<sudoplatform>,"jobId":…}
    ///     fcm data     = {"sudoplatform":"<sudoplatform, escaped>","jobId":…}
    func payloadFrame(key: AddressKey, jobId: String, frame: Frame) -> (prefix: [UInt8], suffix: [UInt8]) {
        var dataHead: [UInt8] = []
        dataHead.reserveCapacity(96 + key.keyId.utf8.count)
        dataHead.append(contentsOf: Self.keyIdHead)
        JSONWriter.appendQuoted(key.keyId, to: &dataHead)
        dataHead.append(contentsOf: key.algorithm == .rsaOAEPAESCBC ? Self.cbcTail : Self.gcmTail)

        var prefix: [UInt8] = []
        prefix.reserveCapacity(Self.maxPushPayloadBytes)
        var suffix: [UInt8] = []
        suffix.reserveCapacity(64)
        switch frame {
        case .apns:
            prefix.append(contentsOf: apnsHead)
            JSONWriter.appendEscaped(utf8: dataHead, to: &prefix)
            suffix.append(contentsOf: Self.apnsTail)
        case .fcm:
            prefix.append(contentsOf: Self.fcmHead)
            var once: [UInt8] = []
            once.reserveCapacity(dataHead.count + 16)
            JSONWriter.appendEscaped(utf8: dataHead, to: &once)
            JSONWriter.appendEscaped(utf8: once, to: &prefix)
            suffix.append(contentsOf: Self.fcmTail)
        }
        suffix.append(contentsOf: Self.jobIdKey)
        JSONWriter.appendQuoted(jobId, to: &suffix)
        suffix.append(UInt8(ascii: "}"))
        return (prefix, suffix)
    }

    // Constant fragments of the frame, derived from their unescaped forms so that the nested
    // escaping is done by the same code as everywhere else.
    private static let sudoplatformHead: [UInt8] = Array(#"{"servicename":"emService","data":""#.utf8)
    private static let keyIdHead: [UInt8] = Array(#"{"keyId":"#.utf8)
    private static let cbcTail = dataTail(.rsaOAEPAESCBC)
    private static let gcmTail = dataTail(.rsaOAEP256AESGCM)
    private static let dataClose: [UInt8] = Array(#""}"#.utf8)
    /// `"}` closing `data`, escaped once, then `"}` closing sudoplatform.
    private static let apnsTail: [UInt8] = escaped(dataClose) + dataClose
    private static let fcmHead: [UInt8] = Array(#"{"sudoplatform":""#.utf8) + escaped(sudoplatformHead)
    private static let fcmTail: [UInt8] = escaped(escaped(dataClose)) + escaped(dataClose) + [UInt8(ascii: "\"")]
    private static let jobIdKey: [UInt8] = Array(#","jobId":"#.utf8)

    private static func dataTail(_ algorithm: SealingAlgorithm) -> [UInt8] {
        Array(#","algorithm":"\#(algorithm.rawValue)","type":"\#(EmailReceived.messageReceivedType)","sealed":""#.utf8)
    }

    private static func escaped(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        JSONWriter.appendEscaped(utf8: bytes, to: &out)
        return out
    }

    /// The longest plaintext whose sealed base64 fits in `base64Budget` bytes, or `nil`.
    /// The sealed length only grows with the plaintext length, so binary search applies.
    static func largestPlaintext(base64Budget: Int, algorithm: SealingAlgorithm, rsaBytes: Int) -> Int? {
        func fits(_ n: Int) -> Bool {
            Base64.encodedLength(Sealer.sealedLength(plaintextCount: n, algorithm: algorithm, rsaBytes: rsaBytes)) <= base64Budget
        }
        guard fits(0) else { return nil }
        var low = 0  // fits
        var high = max(base64Budget, 1)  // sealed ≥ plaintext, base64 ≥ sealed: does not fit
        while high - low > 1 {
            let mid = (low + high) / 2
            if fits(mid) { low = mid } else { high = mid }
        }
        return low
    }

    static func floorDiv(_ a: Int64, _ b: Int64) -> Int64 {
        let q = a / b
        return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q
    }
}
