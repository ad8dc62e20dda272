import Foundation
import MailpushTestSupport
import Testing

@testable import MailpushCore

/// PushJob v1 rendering (CONTRACT §7), checked the way a sender and a client see the job.
@Suite("Rendering push jobs")
struct RenderTests {
    static let source = SourceRef(topic: "email.received", partition: 0, offset: 42)
    static let receivedAt: Int64 = 1_718_330_541_336
    static let now: Int64 = receivedAt + 5_000
    static let renderer = JobRenderer(options: RenderOptions(sponsorWebhookURL: "https://sponsor.example/push"))

    static func event(_ fixture: JSONObjectFixture = Fixtures.event()) throws -> EmailReceived {
        try EmailReceived.decode(fixture.bytes)
    }

    static func device(_ target: Fixtures.DeviceTarget, bundleId: String? = "com.example.mail") throws -> DeviceRegistration {
        try DeviceRegistration.decode(Fixtures.device(bundleId: bundleId, target: target).bytes)
    }

    static func render(
        _ event: EmailReceived, _ target: Fixtures.DeviceTarget,
        key: AddressKey? = nil, renderer: JobRenderer = renderer, now: Int64 = now
    ) throws -> (RenderedJob, JSONValue) {
        let k = try key ?? TestKeys.addressKey()
        let job = try renderer.render(event: event, device: try device(target), key: k, source: source, nowMs: now)
        return (job, try JSONValue.parse(job.value))
    }

    /// The serialized bytes of a member object, cut out of the job as produced (not re-encoded).
    static func rawMember(_ job: [UInt8], _ name: String) throws -> [UInt8] {
        let text = String(decoding: job, as: UTF8.self)
        let start = try #require(text.range(of: "\"\(name)\":", options: .backwards)).upperBound
        var depth = 0
        var inString = false
        var escaped = false
        var index = start
        while index < text.endIndex {
            let c = text[index]
            if inString {
                if escaped { escaped = false } else if c == "\\" { escaped = true } else if c == "\"" { inString = false }
            } else if c == "\"" {
                inString = true
            } else if c == "{" {
                depth += 1
            } else if c == "}" {
                depth -= 1
                if depth == 0 { return Array(text[start...index].utf8) }
            }
            index = text.index(after: index)
        }
        Issue.record("unterminated \(name)")
        return []
    }

    static let expectedJobId = JobID.make(emailAddressId: "em-add-1", messageId: "em-msg-1", deviceId: "dev-1")

    @Test func iosJob() throws {
        let event = try Self.event()
        let (job, json) = try Self.render(event, .ios(token: "apns-token-1"))
        let text = String(decoding: job.value, as: UTF8.self)
        let expires = Self.receivedAt + 2_419_200_000
        let jobId = Self.expectedJobId
        let expectedPrefix = [
            #"{"version":1,"jobId":"\#(jobId)","deviceId":"dev-1","owner":"user-1","platform":"ios","#,
            #""bundleId":"com.example.mail","createdAtEpochMs":\#(Self.now),"expiresAtEpochMs":\#(expires),"#,
            #""source":{"topic":"email.received","partition":0,"offset":42},"apns":{"headers":{"apns-push-type":"alert","#,
            #""apns-priority":"10","apns-topic":"com.example.mail","apns-expiration":"\#(expires / 1000)"},"#,
            #""deviceToken":"apns-token-1","payload":{"aps":{"alert":{"title":"New email","body":"You have a new message"},"#,
            #""mutable-content":1},"sudoplatform":{"servicename":"emService","data":"{\"keyId\":\"key-1\","#,
            #"\"algorithm\":\"RSAEncryptionOAEPAESCBC\",\"type\":\"messageReceived\",\"sealed\":\""#,
        ].joined()
        #expect(text.hasPrefix(expectedPrefix))
        #expect(text.hasSuffix(#"\"}"},"jobId":"\#(Self.expectedJobId)"}}}"#))
        #expect(job.jobId == Self.expectedJobId)
        #expect(job.deviceId == "dev-1")
        #expect(job.platform == "ios")
        #expect(json["apns"]?["payload"]?["jobId"]?.stringValue == Self.expectedJobId)

        // No email content in clear.
        for secret in ["Hello", "a@example.com", "Alice", "r@example.com", "sudo-1", "em-add-1-INBOX"] {
            #expect(!text.contains(secret), "\(secret) leaked")
        }
        // The client opens it.
        let opened = try Unsealer.open(pushJob: job.value, privateKeyPEM: TestKeys.shared.privateKeyPEM)
        #expect(opened == notificationPlaintext(event))
    }

    @Test(arguments: [Fixtures.DeviceTarget.android(token: "fcm-token-1"), .comMethodFCM(token: "fcm-token-1")])
    func androidJob(_ target: Fixtures.DeviceTarget) throws {
        let event = try Self.event()
        let (job, json) = try Self.render(event, target, key: try TestKeys.addressKey(algorithm: .rsaOAEP256AESGCM))
        #expect(job.platform == "android")
        #expect(json["platform"] == .string("android"))
        #expect(json["apns"] == nil)
        let message = try #require(json["fcm"]?["message"])
        #expect(message["token"] == .string("fcm-token-1"))
        #expect(message["android"] == .object(["priority": .string("high"), "ttl": .string("2419200s")]))
        let data = try #require(message["data"]?.objectValue)
        #expect(Set(data.keys) == ["sudoplatform", "jobId"])
        #expect(data.values.allSatisfy { $0.stringValue != nil }, "every FCM data value is a string")
        #expect(data["jobId"] == .string(Self.expectedJobId))
        let sudoplatform = try JSONValue.parse(try #require(data["sudoplatform"]?.stringValue))
        #expect(sudoplatform["servicename"] == .string("emService"))
        let notificationData = try JSONValue.parse(try #require(sudoplatform["data"]?.stringValue))
        #expect(notificationData["algorithm"] == .string("RSAEncryptionOAEP256AESGCM"))
        #expect(notificationData["keyId"] == .string("key-1"))
        #expect(notificationData["type"] == .string("messageReceived"))
        let opened = try Unsealer.open(pushJob: job.value, privateKeyPEM: TestKeys.shared.privateKeyPEM)
        #expect(opened == notificationPlaintext(event))
    }

    @Test(arguments: [
        (RenderTests.receivedAt, "2419200s"),
        (RenderTests.receivedAt + 2_419_200_000, "2419200s"), // a backfilled old email keeps the TTL
        (RenderTests.receivedAt - 60_000, "2419200s"),
    ])
    func fcmTTLIsTheConfiguredTTL(_ now: Int64, _ ttl: String) throws {
        let (_, json) = try Self.render(try Self.event(), .android(token: "t"), now: now)
        #expect(json["fcm"]?["message"]?["android"]?["ttl"] == .string(ttl))
        #expect(json["expiresAtEpochMs"] == .number(JSONNumber(Self.receivedAt + 2_419_200_000)))
    }

    @Test func fcmTTLStopsAtFCMsLimitWhileTheJobKeepsTheConfiguredTTL() throws {
        let sixtyDays: Int64 = 60 * 86_400
        let renderer = JobRenderer(options: RenderOptions(ttlSeconds: sixtyDays))
        let (_, json) = try Self.render(try Self.event(), .android(token: "t"), renderer: renderer)
        #expect(json["fcm"]?["message"]?["android"]?["ttl"] == .string("2419200s"))
        #expect(json["expiresAtEpochMs"] == .number(JSONNumber(Self.receivedAt + sixtyDays * 1000)))
    }

    @Test func webhookJobCarriesNoEmailContentAndNeedsNoKey() throws {
        let event = try Self.event()
        let device = try Self.device(.comMethodWebhook(sponseeDetails: "{\"pushId\":\"abc\"}"))
        let job = try Self.renderer.render(event: event, device: device, key: nil, source: Self.source, nowMs: Self.now)
        let json = try JSONValue.parse(job.value)
        #expect(job.platform == "webhook")
        #expect(json["platform"] == .string("webhook"))
        #expect(
            json["webhook"]
                == .object([
                    "url": .string("https://sponsor.example/push"),
                    "body": .object([
                        "msgId": .string("em-msg-1"), "sponseeDetails": .string("{\"pushId\":\"abc\"}"),
                        "metaData": .object(["msgType": .string("messageReceived")]),
                    ]),
                ]))
        let text = String(decoding: job.value, as: UTF8.self)
        #expect(!text.contains("sealed") && !text.contains("Hello") && !text.contains("a@example.com"))
        #expect(throws: UnsealError.self) { try Unsealer.open(pushJob: job.value, privateKeyPEM: TestKeys.shared.privateKeyPEM) }
    }

    @Test func webhookWithoutSponsorEndpointIsAnError() throws {
        let renderer = JobRenderer(options: RenderOptions())
        let device = try Self.device(.comMethodWebhook(sponseeDetails: "x"))
        #expect(throws: RenderError.noSponsorWebhook) {
            try renderer.render(event: try Self.event(), device: device, key: nil, source: Self.source, nowMs: Self.now)
        }
    }

    @Test func pushDeviceWithoutKeyIsAnError() throws {
        let device = try Self.device(.ios(token: "t"))
        #expect(throws: RenderError.missingKey(emailAddressId: "em-add-1")) {
            try Self.renderer.render(event: try Self.event(), device: device, key: nil, source: Self.source, nowMs: Self.now)
        }
        #expect(RenderError.missingKey(emailAddressId: "em-add-1").reason == "no public key for address em-add-1")
    }

    @Test func noBundleIdMeansNullAndNoTopicHeader() throws {
        let device = try Self.device(.ios(token: "t"), bundleId: nil)
        let job = try Self.renderer.render(
            event: try Self.event(), device: device, key: try TestKeys.addressKey(),
            source: Self.source, nowMs: Self.now)
        let json = try JSONValue.parse(job.value)
        #expect(json["bundleId"] == nil, "no bundle id: the key is left out")
        #expect(json["apns"]?["headers"]?["apns-topic"] == nil)
    }

    @Test func configurableAlertAndTTL() throws {
        let renderer = JobRenderer(options: RenderOptions(alertTitle: "Neue \"Mail\"", alertBody: "…", ttlSeconds: 3600))
        let (_, json) = try Self.render(try Self.event(), .ios(token: "t"), renderer: renderer)
        #expect(json["apns"]?["payload"]?["aps"]?["alert"] == .object(["title": .string("Neue \"Mail\""), "body": .string("…")]))
        #expect(json["expiresAtEpochMs"] == .number(JSONNumber(Self.receivedAt + 3_600_000)))
        #expect(json["apns"]?["headers"]?["apns-expiration"] == .string(String((Self.receivedAt + 3_600_000) / 1000)))
    }

    /// A parsed key keeps its payload framing for its next emails: another renderer's alert, or the key's id or
    /// algorithm changed on a copy, must not get the framing made before.
    @Test func aKeysKeptFramingFollowsTheRendererAndTheKey() throws {
        let event = try Self.event()
        let key = try TestKeys.addressKey()
        let german = JobRenderer(options: RenderOptions(alertTitle: "Neue Mail", alertBody: "Neue Nachricht"))
        var renamed = key
        renamed.keyId = "key-2"
        var gcm = key
        gcm.algorithm = .rsaOAEP256AESGCM
        for _ in 0..<2 {
            for (renderer, title) in [(Self.renderer, "New email"), (german, "Neue Mail")] {
                let (_, json) = try Self.render(event, .ios(token: "t"), key: key, renderer: renderer)
                #expect(json["apns"]?["payload"]?["aps"]?["alert"]?["title"]?.stringValue == title)
            }
            let variants = [
                (key, "key-1", "RSAEncryptionOAEPAESCBC"), (renamed, "key-2", "RSAEncryptionOAEPAESCBC"),
                (gcm, "key-1", "RSAEncryptionOAEP256AESGCM"),
            ]
            for (variant, keyId, algorithm) in variants {
                // The data string is escaped once in an APNs job, twice in an FCM job.
                for (target, q) in [(Fixtures.DeviceTarget.ios(token: "t"), #"\""#), (.android(token: "t"), #"\\\""#)] {
                    let (job, _) = try Self.render(event, target, key: variant)
                    let text = String(decoding: job.value, as: UTF8.self)
                    #expect(text.contains("\(q)keyId\(q):\(q)\(keyId)\(q),\(q)algorithm\(q):\(q)\(algorithm)\(q)"))
                    let opened = try Unsealer.open(pushJob: job.value, privateKeyPEM: TestKeys.shared.privateKeyPEM)
                    #expect(opened == notificationPlaintext(event))
                }
            }
        }
    }

    @Test func sameEmailSameDeviceSameJobIdWhateverTheSource() throws {
        let event = try Self.event()
        let device = try Self.device(.android(token: "t"))
        let key = try TestKeys.addressKey()
        let a = try Self.renderer.render(event: event, device: device, key: key, source: Self.source, nowMs: Self.now)
        let b = try Self.renderer.render(
            event: event, device: device, key: key,
            source: SourceRef(topic: "email.received", partition: 3, offset: 9), nowMs: Self.now + 1)
        #expect(a.jobId == b.jobId)
        #expect(a.value != b.value) // fresh sealing, other source
        #expect(SourceRef(topic: "email.received", partition: 3, offset: 9).headerValue == "email.received/3/9")
    }
}

/// The 4096-byte limit: shortening subject, then display names, on Character boundaries.
@Suite("Push size limit")
struct PushSizeTests {
    enum Platform: String, CaseIterable, Sendable {
        case ios, android
        var target: Fixtures.DeviceTarget { self == .ios ? .ios(token: "apns-token-1") : .android(token: "fcm-token-1") }
        /// Where the size-limited JSON sits in the job.
        var member: String { self == .ios ? "payload" : "data" }
    }

    static let limit = JobRenderer.maxPushPayloadBytes

    struct Outcome {
        let payloadBytes: Int
        let opened: EmailReceived
        let job: RenderedJob
    }

    static func render(_ fixture: JSONObjectFixture, _ platform: Platform, _ algorithm: SealingAlgorithm = .rsaOAEPAESCBC) throws -> Outcome
    {
        let key = try TestKeys.addressKey(algorithm: algorithm)
        let (job, _) = try RenderTests.render(try RenderTests.event(fixture), platform.target, key: key)
        let payload = try RenderTests.rawMember(job.value, platform.member)
        let opened = try Unsealer.open(pushJob: job.value, privateKeyPEM: TestKeys.shared.privateKeyPEM)
        return Outcome(payloadBytes: payload.count, opened: try EmailReceived.decode(opened), job: job)
    }

    /// Checks a shortened field: a whole-Character prefix of the original plus "…".
    static func expectCut(_ cut: String?, of original: String, sourceLocation: SourceLocation = #_sourceLocation) {
        guard let cut else {
            Issue.record("field disappeared", sourceLocation: sourceLocation)
            return
        }
        #expect(cut.hasSuffix("…"), sourceLocation: sourceLocation)
        let kept = Array(cut.dropLast())
        let originalCharacters = Array(original)
        #expect(kept.count < originalCharacters.count, sourceLocation: sourceLocation)
        #expect(Array(originalCharacters.prefix(kept.count)) == kept, "not a Character prefix", sourceLocation: sourceLocation)
        // Byte-wise too: a cut inside a grapheme cluster would differ here.
        #expect(original.utf8.starts(with: String(kept).utf8), sourceLocation: sourceLocation)
    }

    static let subjects: [(String, String)] = [
        ("emoji", String(repeating: "Grüße 👋🏽 ", count: 400)),
        ("family ZWJ", String(repeating: "👨‍👩‍👧‍👦", count: 300)),
        ("combining", String(repeating: "e\u{301}", count: 2500)),
        ("flags", String(repeating: "🇩🇪🇯🇵", count: 400)),
        ("escapes", String(repeating: "\"quoted\"\n\u{1}\\", count: 500)),
        ("ascii", String(repeating: "x", count: 10_000)),
    ]

    @Test(arguments: Platform.allCases, subjects.indices)
    func longSubjectIsCutToFit(_ platform: Platform, _ which: Int) throws {
        let subject = Self.subjects[which].1
        let out = try Self.render(Fixtures.event(subject: subject), platform)
        #expect(out.payloadBytes <= Self.limit)
        Self.expectCut(out.opened.subject, of: subject)
        #expect(out.opened.from.displayName == "Alice", "only the subject needed cutting")
        // Ids and everything else intact.
        let original = try RenderTests.event(Fixtures.event(subject: subject))
        var expected = original
        expected.subject = out.opened.subject
        #expect(out.opened == expected)
    }

    /// "Longest prefix that fits": one more Character would not have fitted.
    @Test(arguments: Platform.allCases, SealingAlgorithm.allCases)
    func theCutIsTheLongestThatFits(_ platform: Platform, _ algorithm: SealingAlgorithm) throws {
        let subject = String(repeating: "a😀é", count: 1500)
        let out = try Self.render(Fixtures.event(subject: subject), platform, algorithm)
        #expect(out.payloadBytes <= Self.limit)
        let cut = try #require(out.opened.subject)
        Self.expectCut(cut, of: subject)
        let kept = cut.dropLast().count
        let oneMore = String(subject.prefix(kept + 1)) + "…"
        var longer = out.opened
        longer.subject = oneMore
        let key = try TestKeys.addressKey(algorithm: algorithm)
        let current = Sealer.sealedBase64Length(plaintextCount: notificationPlaintext(out.opened).count, key: key)
        let wouldBe = Sealer.sealedBase64Length(plaintextCount: notificationPlaintext(longer).count, key: key)
        #expect(out.payloadBytes - current + wouldBe > Self.limit)
    }

    @Test(arguments: Platform.allCases)
    func displayNamesAreCutAfterTheSubject(_ platform: Platform) throws {
        let name = String(repeating: "Ünïcødé 🦄 ", count: 600)
        let fixture = Fixtures.event(subject: "short", fromName: name, replyToName: "Reply")
        let out = try Self.render(fixture, platform)
        #expect(out.payloadBytes <= Self.limit)
        // The subject was cut first: even "…" alone leaves the name too long, so it is "…".
        #expect(out.opened.subject == "…")
        Self.expectCut(out.opened.from.displayName, of: name)
        #expect(out.opened.replyTo?.displayName == "Reply")
        #expect(out.opened.from.emailAddress == "a@example.com")
    }

    @Test(arguments: Platform.allCases)
    func replyToNameIsCutLast(_ platform: Platform) throws {
        let name = String(repeating: "Réplÿ 📨 ", count: 700)
        let fixture = Fixtures.event(subject: "hi", fromName: "Al", replyToName: name)
        let out = try Self.render(fixture, platform)
        #expect(out.payloadBytes <= Self.limit)
        #expect(out.opened.subject == "hi", "too short to be worth cutting")
        #expect(out.opened.from.displayName == "Al")
        Self.expectCut(out.opened.replyTo?.displayName, of: name)
        #expect(out.opened.replyTo?.emailAddress == "r@example.com")
    }

    @Test(arguments: Platform.allCases)
    func nothingIsCutWhenItFits(_ platform: Platform) throws {
        let subject = String(repeating: "ok ", count: 300)
        let out = try Self.render(Fixtures.event(subject: subject), platform)
        #expect(out.opened.subject == subject)
    }

    /// Lengths around the limit, where block and base64 rounding matter.
    @Test(arguments: Platform.allCases, SealingAlgorithm.allCases)
    func sizesAroundTheLimit(_ platform: Platform, _ algorithm: SealingAlgorithm) throws {
        var cuts = 0
        for n in stride(from: 1500, through: 2900, by: 37) {
            let subject = String(repeating: "é", count: n / 2) + String(repeating: "z", count: n % 2)
            let out = try Self.render(Fixtures.event(subject: subject), platform, algorithm)
            #expect(out.payloadBytes <= Self.limit, "n=\(n)")
            if out.opened.subject == subject { continue }
            cuts += 1
            Self.expectCut(out.opened.subject, of: subject)
        }
        #expect(cuts > 0 && cuts < 39, "the range straddles the limit")
    }

    @Test(arguments: Platform.allCases)
    func uncuttableFieldsTooLongIsPayloadTooLarge(_ platform: Platform) throws {
        // Ids are bounded on input (256 bytes each), so the sender's address is what cannot be cut.
        let fixture = Fixtures.event(subject: "s", fromAddress: String(repeating: "m", count: 3100) + "@example.com")
        let event = try RenderTests.event(fixture)
        #expect(throws: RenderError.payloadTooLarge) {
            _ = try RenderTests.render(event, platform.target)
        }
        #expect(RenderError.payloadTooLarge.reason == "sealed payload exceeds 4096 bytes")
    }

    /// A subject as long as an event may carry, for an owner with many devices. The cut depends only on the key and
    /// the frame, so it is made once per email: made again for every job, it walked all 300,000 characters each
    /// time, 0.1 s a job on a debug build (20 s for these 200 devices; 51 s for 500 held a round past its beats).
    @Test func aLongSubjectIsCutOncePerEmailNotForEveryJob() throws {
        let subject = String(repeating: "e\u{301}", count: 300_000)
        let event = try RenderTests.event(Fixtures.event(subject: subject))
        let key = try TestKeys.addressKey()
        let devices = try (0..<200).map { i in
            let target: Fixtures.DeviceTarget = i % 2 == 0 ? .ios(token: "apns-\(i)") : .android(token: "fcm-\(i)")
            return try DeviceRegistration.decode(Fixtures.device(deviceId: "dev-\(i)", target: target).bytes)
        }
        let renderer = RenderTests.renderer
        let clock = ContinuousClock()
        let start = clock.now
        let email = renderer.prepare(event: event, key: key)
        let jobs = try devices.map { try renderer.render(email, device: $0, source: RenderTests.source, nowMs: RenderTests.now) }
        let elapsed = clock.now - start
        #expect(elapsed < .seconds(2), "took \(elapsed)")

        // Every job of a frame carries the same cut, and it is the one a job rendered on its own gets.
        for platform in Platform.allCases {
            var cuts: Set<String> = []
            for index in [0, 1, 198, 199] where devices[index].platform == platform.rawValue {
                let opened = try EmailReceived.decode(
                    try Unsealer.open(pushJob: jobs[index].value, privateKeyPEM: TestKeys.shared.privateKeyPEM))
                let cut = try #require(opened.subject)
                Self.expectCut(cut, of: subject)
                cuts.insert(cut)
                #expect(try RenderTests.rawMember(jobs[index].value, platform.member).count <= Self.limit)
            }
            let alone = try Self.render(Fixtures.event(subject: subject), platform)
            #expect(cuts == [try #require(alone.opened.subject)], "\(platform)")
        }
    }

    /// The cut keeps the longest prefix of whole Characters that fits, whichever budget: checked against the plain
    /// reading of that rule, Character by Character over the whole text.
    @Test(arguments: subjects.indices)
    func theCutIsTheLongestCharacterPrefixForAnyBudget(_ which: Int) {
        let text = Self.subjects[which].1
        func plainReading(_ budget: Int) -> String? {
            guard budget >= 0 else { return nil }
            var kept = ""
            var used = 0
            for character in text {
                used += JSONWriter.escapedLength(of: String(character))
                if used > budget { break }
                kept.append(character)
            }
            return kept
        }
        let whole = JSONWriter.escapedLength(of: text)
        for budget in [-1, 0, 1, 2, 3, 4, 5, 7, 8, 100, 1001, 2048, 4093, whole - 1, whole, whole + 1] {
            #expect(NotificationText.longestPrefix(of: text, fittingEscapedLength: budget) == plainReading(budget), "budget \(budget)")
        }
    }

    @Test func fcmDoubleEscapingIsAccountedFor() throws {
        // Quotes in the keyId are escaped once in APNs' data string and twice (\\\") in FCM's.
        let key = try TestKeys.addressKey(keyId: String(repeating: "\"", count: 150))
        for platform in Platform.allCases {
            let (job, _) = try RenderTests.render(
                try RenderTests.event(Fixtures.event(subject: String(repeating: "s", count: 3000))),
                platform.target, key: key)
            #expect(try RenderTests.rawMember(job.value, platform.member).count <= Self.limit)
        }
    }
}

@Suite("Job ids")
struct JobIDTests {
    /// `printf 'em-add-1\0em-msg-1\0dev-1' | sha256sum | cut -c1-32`
    @Test func knownAnswer() {
        #expect(JobID.make(emailAddressId: "em-add-1", messageId: "em-msg-1", deviceId: "dev-1") == "8fa30e8d039087da26d576a31b3916ff")
        #expect(JobID.make(emailAddressId: "em-add-1", messageId: "em-msg-1", deviceId: "dev-2") == "4e9ee9352e49f949f4ba5cba82e40229")
    }

    /// The 0x00 separators keep ("ab","c") and ("a","bc") apart.
    @Test func separatorsMatter() {
        #expect(JobID.make(emailAddressId: "ab", messageId: "c", deviceId: "d") == "1e8937e355807742dbbfefeaad0aef56")
        #expect(JobID.make(emailAddressId: "a", messageId: "bc", deviceId: "d") == "702f90638317c6b719064288228a8f77")
    }
}
