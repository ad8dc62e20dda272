import Foundation
import MailpushCore
import MailpushTestSupport
import Testing

/// CONTRACT §2/§3 limits and §3's "evaluation linear in the rule text": no input of one tenant
/// may cost the others more than a normal one does.
@Suite("Bounded inputs")
struct InputLimitsTests {
    static let meta = FilterMeta(emailAddressId: "em-7", sudoId: "sudo-3", folderId: "em-7-INBOX", keyId: "k")

    static func seconds(_ body: () -> Void) -> Double {
        let clock = ContinuousClock()
        let d = clock.measure(body)
        return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }

    static func filter(_ rule: String) -> NotificationFilter {
        NotificationFilter(items: [FilterItem(serviceName: "emService", action: .enable, rule: rule)])
    }

    // MARK: (a) evaluation cost

    @Test func inOnAHostileNeedleIsLinear() {
        // The issue's rule, at the size the per-device limit still admits (64 KB of rule text):
        // a naive substring search compares ~needle bytes at every haystack position.
        let needle = String(repeating: "a", count: 20_000) + "b"
        let haystack = String(repeating: "a", count: 40_000)
        let rule = #"{"in":[""# + needle + #"",""# + haystack + #""]}"#
        var decided = true
        let elapsed = Self.seconds { decided = Self.filter(rule).wantsNotification(for: Self.meta) }
        #expect(decided == false)
        #expect(elapsed < 0.5, "took \(elapsed) s")
    }

    @Test func inDependingOnTheContextIsLinearPerEvent() {
        // Not constant, so evaluated for every event rather than once at registration.
        let needle = String(repeating: "a", count: 20_000) + "b"
        let haystack = String(repeating: "a", count: 40_000)
        let viaVar = #"{"in":[{"var":["meta.nope",""# + needle + #""]},""# + haystack + #""]}"#
        let f = Self.filter(viaVar)
        #expect(f.invalidRuleCount == 0)
        var decided = true
        let elapsed = Self.seconds { for _ in 0..<5 { decided = f.wantsNotification(for: Self.meta) } }
        #expect(decided == false)
        #expect(elapsed < 0.5, "took \(elapsed) s")
    }

    @Test func substringSemanticsAreUnchanged() {
        #expect(Self.filter(#"{"in":["aab","aaab"]}"#).wantsNotification(for: Self.meta))
        #expect(Self.filter(#"{"in":["abab","abaabab"]}"#).wantsNotification(for: Self.meta))
        #expect(!Self.filter(#"{"in":["abab","abaaba"]}"#).wantsNotification(for: Self.meta))
        #expect(Self.filter(#"{"in":["","x"]}"#).wantsNotification(for: Self.meta))
        #expect(Self.filter(#"{"in":["7",{"var":"meta.emailAddressId"}]}"#).wantsNotification(for: Self.meta))
        #expect(!Self.filter(#"{"in":["em-77",{"var":"meta.emailAddressId"}]}"#).wantsNotification(for: Self.meta))
    }

    @Test func otherOperatorsOnLargeOperandsStayCheap() {
        let long = String(repeating: "1", count: 30_000)
        let deepPath = Array(repeating: "x", count: 10_000).joined(separator: ".")
        let rules = [
            #"{"==":[""# + long + #"",1]}"#,
            #"{"==":[[""# + long + #""],""# + long + #""]}"#,
            #"{"var":""# + deepPath + #""}"#,
            #"{"!=":[{"var":""# + deepPath + #""},{"var":"meta.sudoId"}]}"#,
            "{\"or\":[" + Array(repeating: #"{"==":[{"var":"meta.sudoId"},"s"]}"#, count: 1500).joined(separator: ",") + "]}",
        ]
        for rule in rules {
            let f = Self.filter(rule)
            let elapsed = Self.seconds { for _ in 0..<5 { _ = f.wantsNotification(for: Self.meta) } }
            #expect(elapsed < 0.5, "took \(elapsed) s")
        }
    }

    @Test func aRuleNestedTooDeeplyNeverMatchesAndCountsAsInvalid() {
        func nested(_ depth: Int) -> String {
            String(repeating: #"{"!":"#, count: depth) + "false" + String(repeating: "}", count: depth)
        }
        // An odd number of `!` on false is true: only the depth decides.
        let shallow = Self.filter(nested(31))
        #expect(shallow.invalidRuleCount == 0)
        #expect(shallow.wantsNotification(for: Self.meta))
        let deep = Self.filter(nested(301))
        #expect(deep.invalidRuleCount == 1)
        #expect(!deep.wantsNotification(for: Self.meta))
        let deepArrays = Self.filter(#"{"in":[1,"# + String(repeating: "[", count: 100) + String(repeating: "]", count: 100) + "]}")
        #expect(deepArrays.invalidRuleCount == 1)
    }

    // MARK: (b) ids

    /// Why `decode` refuses `f`, or nil if it takes it.
    static func refusal<Decoded>(_ f: JSONObjectFixture, _ decode: ([UInt8]) throws(InputError) -> Decoded) -> InputError? {
        do {
            _ = try decode(f.bytes)
            return nil
        } catch {
            return error
        }
    }

    static func eventReason(_ f: JSONObjectFixture) -> String? {
        let refusal = Self.refusal(f, EmailReceived.decode)
        if let refusal { #expect(refusal.category == .invalidField) }
        return refusal?.reason
    }

    /// The id limits (CONTRACT §2) of `field`, through `reason`: what decoding a record whose `field` holds the
    /// given text says is wrong with it (nil when it decodes).
    static func expectIdLimits(
        _ field: String, _ reason: (String) -> String?, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(reason(String(repeating: "x", count: 256)) == nil, sourceLocation: sourceLocation)
        #expect(reason(String(repeating: "é", count: 128)) == nil, sourceLocation: sourceLocation)
        #expect(
            reason(String(repeating: "é", count: 129)) == "invalid field \(field): 258 UTF-8 bytes, at most 256 allowed",
            sourceLocation: sourceLocation)
        #expect(
            reason("a\u{0}b") == "invalid field \(field): contains U+0000, which ids may not hold", sourceLocation: sourceLocation)
    }

    @Test(arguments: ["owner", "emailAddressId", "sudoId", "messageId", "folderId"])
    func idsAreBounded(_ field: String) {
        Self.expectIdLimits(field) { Self.eventReason(Fixtures.event().setting(field, .string($0))) }
    }

    @Test func emailsDifferingAroundANulAreNotOneEmail() throws {
        // Before: both decoded, and dedupe/jobId (ids joined with NUL) saw the same bytes.
        let first = Fixtures.event(emailAddressId: "nul", messageId: "a\u{0}b")
        let second = Fixtures.event(emailAddressId: "nul\u{0}a", messageId: "b")
        #expect(Self.eventReason(first) == "invalid field messageId: contains U+0000, which ids may not hold")
        #expect(Self.eventReason(second) == "invalid field emailAddressId: contains U+0000, which ids may not hold")
    }

    // MARK: (b) address keys (CONTRACT §5)

    static func keyReason(_ f: JSONObjectFixture) -> String? { refusal(f, AddressKey.decode)?.reason }

    /// A key's ids are ids: `keyId` above all, which every job of the address carries and filters read as
    /// `meta.keyId`. A rejected key makes the address's events dead letters naming the reason.
    @Test(arguments: ["emailAddressId", "owner", "keyId"])
    func addressKeyIdsAreBounded(_ field: String) {
        let k = TestKeys.addressKeyJSON()
        Self.expectIdLimits(field) { Self.keyReason(k.setting(field, .string($0))) }
        #expect(
            Self.keyReason(k.setting(field, .string(String(repeating: "k", count: 100_000))))
                == "invalid field \(field): 100000 UTF-8 bytes, at most 256 allowed")
        #expect(Self.keyReason(k.setting(field, .string(""))) == "field \(field) must not be empty")
    }

    @Test func aRuleRepeatingTheKeyIdStaysCheap() {
        // The rule that, against a 100 KB keyId, built a 290 MB string at each evaluation; now against the longest
        // keyId a key may have.
        let rule = #"{"==":[["# + Array(repeating: #"{"var":"meta.keyId"}"#, count: 2_900).joined(separator: ",") + #"],"x"]}"#
        #expect(rule.utf8.count <= InputLimits.maxRuleTextBytes)
        let f = Self.filter(rule)
        #expect(f.invalidRuleCount == 0)
        let meta = FilterMeta(
            emailAddressId: "em-7", sudoId: "sudo-3", folderId: "em-7-INBOX", keyId: String(repeating: "k", count: InputLimits.maxIdBytes))
        var decided = true
        let elapsed = Self.seconds { for _ in 0..<5 { decided = f.wantsNotification(for: meta) } }
        #expect(decided == false)
        #expect(elapsed < 0.5, "took \(elapsed) s")
    }

    // MARK: (b, c) registrations

    static func registrationReason(_ f: JSONObjectFixture) -> String? { refusal(f, DeviceRegistration.decode)?.reason }

    @Test func registrationIdsAreBounded() {
        let d = Fixtures.device()
        #expect(
            Self.registrationReason(d.setting("deviceId", .string("dev\u{0}1")))
                == "invalid field deviceId: contains U+0000, which ids may not hold")
        #expect(
            Self.registrationReason(d.setting("owner", .string(String(repeating: "o", count: 257))))
                == "invalid field owner: 257 UTF-8 bytes, at most 256 allowed")
    }

    @Test func tokensAreAtMost4KB() {
        let ok = String(repeating: "t", count: 4096)
        let long = String(repeating: "t", count: 4097)
        #expect(Self.registrationReason(Fixtures.device(target: .ios(token: ok))) == nil)
        #expect(
            Self.registrationReason(Fixtures.device(target: .ios(token: long)))
                == "invalid field pushToken: 4097 UTF-8 bytes, at most 4096 allowed")
        #expect(
            Self.registrationReason(Fixtures.device(target: .comMethodWebhook(sponseeDetails: long)))
                == "invalid field comMethod.value: 4097 UTF-8 bytes, at most 4096 allowed")
        // An over-long pushToken is not hidden by falling back to a com method.
        let both = Fixtures.device(target: .ios(token: long)).setting("comMethod", Fixtures.comMethod(type: 4, value: "FCM:x"))
        #expect(Self.registrationReason(both) == "invalid field pushToken: 4097 UTF-8 bytes, at most 4096 allowed")
    }

    @Test func filterListsAreBounded() {
        func item(_ rule: String) -> FilterItem { FilterItem(serviceName: "emService", action: .disable, rule: rule) }
        let d = Fixtures.device()
        let small = #"{"==":[1,2]}"#
        #expect(Self.registrationReason(d.setting("filter", Fixtures.filterJSON(Array(repeating: item(small), count: 1000)))) == nil)
        #expect(
            Self.registrationReason(d.setting("filter", Fixtures.filterJSON(Array(repeating: item(small), count: 1001))))
                == "invalid field filter: 1001 items, at most 1000 allowed")
        let big = #"{"in":[""# + String(repeating: "a", count: 40_000) + #"","b"]}"#
        #expect(Self.registrationReason(d.setting("filter", Fixtures.filterJSON([item(big)]))) == nil)
        #expect(
            Self.registrationReason(d.setting("filter", Fixtures.filterJSON([item(big), item(big)])))
                == "invalid field filter: \(2 * big.utf8.count) bytes of rule text, at most 65536 allowed")
    }

    @Test func textForAHeaderOrALogLineShowsEveryInvisibleCharacter() {
        #expect("em-add-1 ok, über 🎉".withInvisiblesEscaped == "em-add-1 ok, über 🎉")
        #expect("a\nb\u{7F}\u{85}".withInvisiblesEscaped == #"a\u000ab\u007f\u0085"#)
        // Bidirectional override, zero-width space, line separator, and a format character beyond the BMP (a
        // language tag) written as its UTF-16 pair, as JSON writes it.
        #expect("\u{202E}\u{200B}\u{2028}\u{E0001}".withInvisiblesEscaped == #"\u202e\u200b\u2028\udb40\udc01"#)
    }
}
