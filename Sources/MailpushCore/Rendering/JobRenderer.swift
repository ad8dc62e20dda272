import MailpushMultiBufferRSA

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
    /// The alert's title and body together, as UTF-8: they travel in every iOS job's APNs payload, whose 4096 bytes
    /// must keep room for the sealed data (about 1 KB for a short email and an RSA-2048 key).
    public static let maxAlertBytes = 1024
    public var ttlSeconds: Int64
    /// Up to 100 years: with `EmailReceived.receivedAtRange`, an expiry in milliseconds is always a positive `Int64`.
    public static let ttlSecondsRange: ClosedRange<Int64> = 1...3_153_600_000
    /// Endpoint for com method 3 devices; without it they get no job.
    public var sponsorWebhookURL: String?
    /// Where the RSA operations of many sealings go together, eight at a time (`encryptFreshKeys`); nil: one at a time.
    public var multiBufferRSA: MultiBufferRSA?

    public init(
        alertTitle: String = "New email", alertBody: String = "You have a new message",
        ttlSeconds: Int64 = 2_419_200, sponsorWebhookURL: String? = nil
    ) {
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

    /// What the `mailpush-error` header and logs say; an id in it is escaped where the header is written.
    public var reason: String {
        switch self {
        case .payloadTooLarge: return "sealed payload exceeds \(JobRenderer.maxPushPayloadBytes) bytes"
        case .noSponsorWebhook: return "no sponsor webhook URL configured for com method 3 devices"
        case .missingKey(let id): return "no public key for address \(id)"
        case .sealingFailed(let why): return "sealing failed: \(why)"
        }
    }
}

/// Renders PushJob v1 records (CONTRACT §7): the fields every job has, then the part of its
/// output kind (APNsJob.swift, FCMJob.swift, WebhookJob.swift). The 4096-byte arithmetic is in
/// PayloadBudget.swift.
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
    let apnsHead: [UInt8]

    public init(options: RenderOptions) {
        self.options = options
        self.apnsHead = Self.apnsPayloadHead(options)
    }

    /// Renders the job for one device. `key` may be `nil` only for webhook devices (nothing is
    /// sealed for them).
    public func render(
        event: EmailReceived, device: DeviceRegistration, key: AddressKey?,
        source: SourceRef, nowMs: Int64
    ) throws(RenderError) -> RenderedJob {
        try render(prepare(event: event, key: key), device: device, source: source, nowMs: nowMs)
    }

    /// What every job of `event` shares, for `render(_:device:source:nowMs:)`.
    public func prepare(event: EmailReceived, key: AddressKey?) -> PreparedEmail {
        PreparedEmail(event: event, key: key, renderer: self)
    }

    /// A fresh AES key encrypted for each of `keys`, one per job to seal (`render(_:device:source:nowMs:encryptedKey:)`):
    /// their RSA operations together, eight at a time when `options.multiBufferRSA` is set.
    public func encryptFreshKeys(for keys: [AddressKey]) -> [EncryptedAESKey?] {
        Sealer.encryptFreshKeys(for: keys, multiBuffer: options.multiBufferRSA)
    }

    /// Renders the job of a prepared email for one device. `encryptedKey`, from `encryptFreshKeys` for the email's key
    /// and given to this job alone, is what its sealing uses instead of an RSA operation of its own.
    public func render(
        _ email: PreparedEmail, device: DeviceRegistration, source: SourceRef, nowMs: Int64,
        encryptedKey: EncryptedAESKey? = nil
    ) throws(RenderError) -> RenderedJob {
        let event = email.event
        let jobId = JobID.make(emailAddressId: event.emailAddressId, messageId: event.messageId, deviceId: device.deviceId)
        let expiresAtMs = event.receivedAtEpochMs &+ options.ttlSeconds &* 1000

        var w = JSONWriter(capacity: email.jobCapacity)
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
            try writeWebhook(sponseeDetails: sponseeDetails, event: event, to: &w)
        case .apns(let token):
            guard let sealing = email.sealing else { throw .missingKey(emailAddressId: event.emailAddressId) }
            try writeAPNs(
                token: token, sealing: sealing, encryptedKey: encryptedKey, device: device, jobId: jobId, expiresAtMs: expiresAtMs,
                to: &w)
        case .fcm(let token):
            guard let sealing = email.sealing else { throw .missingKey(emailAddressId: event.emailAddressId) }
            try writeFCM(token: token, sealing: sealing, encryptedKey: encryptedKey, jobId: jobId, to: &w)
        }
        w.endObject()
        return RenderedJob(jobId: jobId, deviceId: device.deviceId, platform: device.platform, value: w.bytes)
    }
}

/// What all the jobs of one email share, worked out once per email rather than once per device: its
/// notification plaintext, shortened to fit where it must, and the sealed payload's framing around the address key.
public struct PreparedEmail: Sendable {
    public let event: EmailReceived
    /// With a key, what sealing for it needs; nil without one (webhook devices only).
    let sealing: Sealing?

    struct Sealing: Sendable {
        let key: AddressKey
        /// `apns.payload` and `fcm.message.data` up to the base64 of the sealed bytes.
        let apnsPrefix: [UInt8]
        let fcmPrefix: [UInt8]
        /// What each frame's jobs seal: the plaintext, shortened once for the frame when it does not fit
        /// (`JobRenderer.fittedPlaintext`); nil when it cannot be made to fit (`payloadTooLarge`).
        let apnsPlaintext: [UInt8]?
        let fcmPlaintext: [UInt8]?

        init(event: EmailReceived, key: AddressKey, renderer: JobRenderer) {
            self.key = key
            let plaintext = notificationPlaintext(event)
            (apnsPrefix, fcmPrefix) = key.payloadFraming(apnsHead: renderer.apnsHead) {
                (renderer.payloadPrefix(key: key, frame: .apns), renderer.payloadPrefix(key: key, frame: .fcm))
            }
            apnsPlaintext = JobRenderer.fittedPlaintext(plaintext, event: event, key: key, prefix: apnsPrefix, frame: .apns)
            fcmPlaintext = JobRenderer.fittedPlaintext(plaintext, event: event, key: key, prefix: fcmPrefix, frame: .fcm)
        }
    }

    /// Room for a job of this email, so that its buffer is made once at about its final size: the largest
    /// sealed payload, and a kilobyte for the rest (ids, token, closing) — more only for unusually long ids or
    /// tokens. A buffer of the largest job's size (5 KB) for every job held twice the memory the jobs in flight
    /// need (the benchmark's drain peaked at 150 MB of RSS with it, 121 MB without).
    let jobCapacity: Int

    init(event: EmailReceived, key: AddressKey?, renderer: JobRenderer) {
        self.event = event
        sealing = key.map { Sealing(event: event, key: $0, renderer: renderer) }
        let payload = sealing.map { sealing in
            let plaintextCount = max(sealing.apnsPlaintext?.count ?? 0, sealing.fcmPlaintext?.count ?? 0)
            return max(sealing.apnsPrefix.count, sealing.fcmPrefix.count)
                + Base64.encodedLength(Sealer.sealedLength(plaintextCount: plaintextCount, key: sealing.key))
        }
        jobCapacity = min(payload ?? 0, JobRenderer.maxPushPayloadBytes) + 1024
    }
}
