import Foundation
import MailpushCore
import MailpushTestSupport
import Testing

@Suite("Decoding input records")
struct EmailReceivedDecodingTests {
    @Test func decodesTheContractExample() throws {
        let json = #"""
            {"type":"messageReceived","owner":"user-1","emailAddressId":"em-add-1","sudoId":"sudo-1",
             "messageId":"em-msg-1","folderId":"em-add-1-INBOX","encryptionStatus":"UNENCRYPTED",
             "subject":"Hello","from":{"emailAddress":"a@example.com","displayName":"Alice"},
             "replyTo":{"emailAddress":"r@example.com"},"hasAttachments":false,
             "sentAtEpochMs":1718330537000,"receivedAtEpochMs":1718330541336,"somethingNew":[1,2]}
            """#
        let e = try EmailReceived.decode(Array(json.utf8))
        #expect(e.type == "messageReceived")
        #expect(e.owner == "user-1")
        #expect(e.emailAddressId == "em-add-1")
        #expect(e.sudoId == "sudo-1")
        #expect(e.messageId == "em-msg-1")
        #expect(e.folderId == "em-add-1-INBOX")
        #expect(e.encryptionStatus == .unencrypted)
        #expect(e.subject == "Hello")
        #expect(e.from == EmailAddress(emailAddress: "a@example.com", displayName: "Alice"))
        #expect(e.replyTo == EmailAddress(emailAddress: "r@example.com"))
        #expect(e.hasAttachments == false)
        #expect(e.sentAtEpochMs == 1_718_330_537_000)
        #expect(e.receivedAtEpochMs == 1_718_330_541_336)
    }

    @Test func optionalFieldsMayBeAbsentOrNull() throws {
        let e = try EmailReceived.decode(
            Fixtures.event().removing("type").setting("subject", .null).removing("replyTo")
                .removing("from.displayName").bytes)
        #expect(e.type == "messageReceived")
        #expect(e.subject == nil)
        #expect(e.replyTo == nil)
        #expect(e.from.displayName == nil)
        let withNullReplyTo = try EmailReceived.decode(Fixtures.event().setting("replyTo", .null).bytes)
        #expect(withNullReplyTo.replyTo == nil)
    }

    /// Events are read member by member, straight into their fields; however an event is written (spacing,
    /// member order, escapes, unknown members of any shape, a repeated key, integral numbers in other
    /// spellings), it decodes to the same email.
    @Test(arguments: [
        #"{"type":"messageReceived","owner":"user-1","emailAddressId":"em-1","sudoId":"s-1","messageId":"m-1","folderId":"f-1","encryptionStatus":"ENCRYPTED","subject":"Q \"3\" é","from":{"emailAddress":"a@example.com","displayName":null},"replyTo":{"emailAddress":"r@example.com","displayName":"R"},"hasAttachments":true,"sentAtEpochMs":-5,"receivedAtEpochMs":1718330541336}"#,
        " \n{ \"receivedAtEpochMs\" : 1.718330541336e12 , \"hasAttachments\":true,\"replyTo\":{\"x\":[{}],\"displayName\":\"R\",\"emailAddress\":\"r@example.com\"},\"from\":{\"emailAddress\":\"a@example.com\"},\"subject\":\"Q \\\"3\\\" \\u00e9\",\"encryptionStatus\":\"ENCRYPTED\",\"folderId\":\"f-1\",\"messageId\":\"m-1\",\"sudoId\":\"s-1\",\"emailAddressId\":\"em-1\",\"owner\":\"user-1\",\"sentAtEpochMs\":-5.0,\"type\":null}\t",
        #"{"new":{"a":[1,true,null,"x",{"b":-1e-3}]},"\u006fwner":"user-1","emailAddressId":"em-1","sudoId":"s-1","messageId":"other","messageId":"m-1","folderId":"f-1","encryptionStatus":"ENCRYPTED","subject":"Q \"3\" \u00e9","from":"a@example.com","from":{"emailAddress":"a@example.com","more":{}},"replyTo":{"emailAddress":"r@example.com","displayName":"R"},"hasAttachments":true,"sentAtEpochMs":-5,"receivedAtEpochMs":1718330541336}"#,
    ])
    func decodesTheSameEmailHoweverItIsWritten(_ json: String) throws {
        let expected = EmailReceived(
            owner: "user-1", emailAddressId: "em-1", sudoId: "s-1", messageId: "m-1", folderId: "f-1",
            encryptionStatus: .encrypted, subject: "Q \"3\" é", from: EmailAddress(emailAddress: "a@example.com"),
            replyTo: EmailAddress(emailAddress: "r@example.com", displayName: "R"), hasAttachments: true, sentAtEpochMs: -5,
            receivedAtEpochMs: 1_718_330_541_336)
        #expect(try EmailReceived.decode(Array(json.utf8)) == expected)
    }

    struct Broken: Sendable, CustomTestStringConvertible {
        let bytes: [UInt8]
        let reason: String
        let category: String
        var testDescription: String { reason }
    }

    static let broken: [Broken] = {
        let e = Fixtures.event()
        func b(_ f: JSONObjectFixture, _ reason: String, _ category: String) -> Broken {
            Broken(bytes: f.bytes, reason: reason, category: category)
        }
        return [
            Broken(
                bytes: Array(#"{"owner":"user-1",}"#.utf8), reason: "invalid JSON at byte 18: expected string key", category: "invalid_json"
            ),
            Broken(bytes: Array("[1]".utf8), reason: "event must be a JSON object", category: "invalid_json"),
            b(e.setting("type", .string("messageDeleted")), "unsupported type \"messageDeleted\"", "unsupported_type"),
            b(e.setting("type", .number(JSONNumber(3))), "field type must be a string or null", "invalid_field"),
            b(e.removing("messageId"), "missing field messageId", "missing_field"),
            b(e.setting("messageId", .null), "missing field messageId", "missing_field"),
            b(e.setting("messageId", .string("")), "field messageId must not be empty", "invalid_field"),
            b(e.removing("owner"), "missing field owner", "missing_field"),
            b(e.setting("sudoId", .number(JSONNumber(7))), "field sudoId must be a string", "invalid_field"),
            b(e.setting("encryptionStatus", .string("PLAIN")), "field encryptionStatus must be ENCRYPTED or UNENCRYPTED", "invalid_field"),
            b(e.setting("subject", .number(JSONNumber(1))), "field subject must be a string or null", "invalid_field"),
            b(e.removing("from"), "missing field from", "missing_field"),
            b(e.setting("from", .string("a@example.com")), "field from must be an object", "invalid_field"),
            b(e.removing("from.emailAddress"), "missing field from.emailAddress", "missing_field"),
            b(e.removing("replyTo.emailAddress"), "missing field replyTo.emailAddress", "missing_field"),
            b(e.setting("hasAttachments", .string("no")), "field hasAttachments must be true or false", "invalid_field"),
            b(e.setting("sentAtEpochMs", .string("1718330537000")), "field sentAtEpochMs must be an integer", "invalid_field"),
            b(e.setting("sentAtEpochMs", .number(JSONNumber(1.5))), "field sentAtEpochMs must be an integer", "invalid_field"),
            b(e.removing("receivedAtEpochMs"), "missing field receivedAtEpochMs", "missing_field"),
            b(
                e.setting("receivedAtEpochMs", .number(JSONNumber(-1))),
                "invalid field receivedAtEpochMs: must be 0…253402300799999 (1970 to 9999)", "invalid_field"),
            b(
                e.setting("receivedAtEpochMs", .number(JSONNumber(Int64.max))),
                "invalid field receivedAtEpochMs: must be 0…253402300799999 (1970 to 9999)", "invalid_field"),
        ]
    }()

    @Test(arguments: broken)
    func rejectsWithAnActionableReason(_ input: Broken) {
        #expect(throws: InputError(reason: input.reason, category: DeadLetterReason(rawValue: input.category)!)) {
            try EmailReceived.decode(input.bytes)
        }
    }

    @Test func reasonsStayOnOneLine() {
        let bytes = Fixtures.event().setting("type", .string("evil\ntype" + String(repeating: "x", count: 200))).bytes
        do {
            _ = try EmailReceived.decode(bytes)
            Issue.record("expected an error")
        } catch {
            #expect(!error.reason.contains("\n"))
            #expect(error.reason.hasPrefix(#"unsupported type "evil\ntype"#))
            #expect(error.reason.count < 100)
        }
    }

    @Test func integralNumbersInOtherSpellingsAreAccepted() throws {
        let e = try EmailReceived.decode(
            Array(Fixtures.event().string.replacingOccurrences(of: "1718330537000", with: "1.718330537e12").utf8))
        #expect(e.sentAtEpochMs == 1_718_330_537_000)
    }
}

@Suite("Decoding device registrations")
struct DeviceRegistrationDecodingTests {
    @Test func decodesTheContractExample() throws {
        let json = #"""
            {"deviceId":"dev-1","owner":"user-1","bundleId":"com.example.mail","platform":"ios",
             "pushToken":"tok",
             "filter":[{"serviceName":"emService","actionType":"DISABLE",
                        "rule":"{\"!=\":[{\"var\":\"meta.type\"},\"messageReceived\"]}"},
                       {"serviceName":"emService","actionType":"ENABLE","rule":"{\"==\":[1,1]}","enableMeta":"x"}]}
            """#
        let d = try DeviceRegistration.decode(Array(json.utf8))
        #expect(d.deviceId == "dev-1")
        #expect(d.owner == "user-1")
        #expect(d.bundleId == "com.example.mail")
        #expect(d.target == .apns(token: "tok"))
        #expect(d.platform == "ios")
        let items = try DeviceRegistration.decodeFilterItems(Array(json.utf8))
        #expect(items.count == 2)
        #expect(items[1].enableMeta == "x")
        #expect(items[0].action == .disable)
        #expect(d.filter.invalidRuleCount == 0)
        #expect(d.filter.wantsNotification(for: FilterMeta(emailAddressId: "a", sudoId: "s", folderId: "f")))
    }

    @Test(arguments: [
        (Fixtures.DeviceTarget.ios(token: "t1"), PushTarget.apns(token: "t1"), "ios"),
        (.android(token: "t2"), .fcm(token: "t2"), "android"),
        (.comMethodFCM(token: "t3"), .fcm(token: "t3"), "android"),
        (.comMethodWebhook(sponseeDetails: "{\"k\":1}"), .webhook(sponseeDetails: "{\"k\":1}"), "webhook"),
    ])
    func mapsEveryRegistrationForm(_ target: Fixtures.DeviceTarget, _ expected: PushTarget, _ platform: String) throws {
        let d = try DeviceRegistration.decode(Fixtures.device(target: target).bytes)
        #expect(d.target == expected)
        #expect(d.platform == platform)
    }

    @Test func platformWinsOverComMethodAndFilterMayBeAbsent() throws {
        let bytes = Fixtures.device(target: .android(token: "t"))
            .setting("comMethod", Fixtures.comMethod(type: 3, value: "x")).removing("filter").bytes
        let d = try DeviceRegistration.decode(bytes)
        #expect(d.target == .fcm(token: "t"))
        #expect(try DeviceRegistration.decodeFilterItems(bytes).isEmpty)
        #expect(!d.filter.wantsNotification(for: FilterMeta(emailAddressId: "a", sudoId: "s", folderId: "f")))
    }

    @Test func unusablePlatformFallsBackToComMethod() throws {
        let d = try DeviceRegistration.decode(
            Fixtures.device(target: .comMethodFCM(token: "t")).setting("platform", .string("ios")).bytes)
        #expect(d.target == .fcm(token: "t"))
    }

    static let broken: [(JSONObjectFixture, String)] = {
        let d = Fixtures.device()
        let bare = d.removing("platform").removing("pushToken")
        return [
            (d.removing("deviceId"), "missing field deviceId"),
            (d.removing("owner"), "missing field owner"),
            (d.removing("pushToken"), "missing field pushToken"),
            (d.setting("platform", .string("windows")), "unsupported platform \"windows\" (expected ios or android)"),
            (bare, "missing field platform (or comMethod)"),
            (bare.setting("pushToken", .string("t")), "missing field platform"),
            (bare.setting("comMethod", Fixtures.comMethod(type: 2, value: "x")), "unsupported comMethod type 2 (expected 3 or 4)"),
            (
                bare.setting("comMethod", Fixtures.comMethod(type: 4, value: "APNS:x")),
                "field comMethod.value must be \"FCM:<token>\" for type 4"
            ),
            (bare.setting("comMethod", .object(["type": .number(JSONNumber(3))])), "missing field comMethod.value"),
            (d.setting("filter", .string("all")), "field filter must be an array"),
            (d.setting("filter", .array([.string("x")])), "field filter[0] must be an object"),
            (
                d.setting(
                    "filter",
                    .array([.object(["serviceName": .string("emService"), "actionType": .string("MAYBE"), "rule": .string("{}")])])),
                "field filter[0].actionType must be ENABLE or DISABLE"
            ),
            (
                d.setting("filter", .array([.object(["serviceName": .string("emService"), "actionType": .string("ENABLE")])])),
                "missing field filter[0].rule"
            ),
        ]
    }()

    @Test(arguments: broken)
    func rejectsWithAnActionableReason(_ fixture: JSONObjectFixture, _ reason: String) {
        do {
            _ = try DeviceRegistration.decode(fixture.bytes)
            Issue.record("expected \(reason)")
        } catch {
            #expect(error.reason == reason)
        }
    }
}
