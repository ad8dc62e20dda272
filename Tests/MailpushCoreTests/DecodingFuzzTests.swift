import Foundation
import MailpushTestSupport
import Testing

@testable import MailpushCore

/// Events from Kafka are untrusted, and `EmailReceived.decode` reads them two ways: a fast path straight into
/// the fields, and the general path that names the first problem. The fast path must never accept what the
/// general path refuses, nor read a field differently: that would turn a dead letter into a job, or seal
/// another subject. These tests write thousands of events in every shape a producer could send (fields absent,
/// null, mistyped, repeated, oversized, escaped, in any order, with unknown members), and the same events with
/// bytes damaged, and hold both paths to each other. A fixed seed keeps a failure reproducible.
@Suite("Decoding hostile records")
struct DecodingFuzzTests {
    @Test func theFastPathAcceptsOnlyWhatTheGeneralPathAcceptsAndReadsTheSameEmail() throws {
        var events = EventWriter(seed: 0x6d61_696c_7075_7368)
        var accepted = 0
        var damagedAccepted = 0
        for round in 0..<6000 {
            let generated = events.write()
            var bytes = generated.bytes
            let damaged = round % 3 == 0
            if damaged { Damage.apply(to: &bytes, using: &events.random) }

            let fast = EmailReceived.decodeWellFormed(bytes)
            let general = Result { () throws(InputError) in try EmailReceived.decodeReportingProblems(bytes) }
            let document = String(decoding: bytes, as: UTF8.self)
            if let fast {
                #expect(try general.get() == fast, "the fast path read \(document) differently")
            }
            // With plain keys (no escapes, ASCII) the fast path handles every event the general path accepts:
            // giving up on one would only cost time, but it says the two paths disagree on what an event is.
            if !damaged, generated.keysArePlain, let event = try? general.get() {
                #expect(fast == event, "the fast path gave up on \(document)")
            }
            if case .success = general {
                if damaged { damagedAccepted += 1 } else { accepted += 1 }
            }
            // The general path's reason names a byte inside the record (or its end) when the JSON is broken.
            if case .failure(let error) = general, error.category == .invalidJSON,
                let offset = Self.byteOffset(in: error.reason)
            {
                #expect(offset <= bytes.count, "\(error.reason) for \(bytes.count) bytes")
            }
        }
        // The generator must reach both sides of the line, or the comparison above proves nothing.
        #expect(accepted > 500)
        #expect(damagedAccepted > 50)
    }

    @Test func anyDocumentTheParserAcceptsIsWrittenBackToTheSameValue() throws {
        var events = EventWriter(seed: 0x6a73_6f6e)
        var parsed = 0
        for round in 0..<4000 {
            var bytes = events.write().bytes
            if round % 2 == 0 { Damage.apply(to: &bytes, using: &events.random) }
            let value: JSONValue
            do {
                value = try JSONValue.parse(bytes)
            } catch {
                #expect(error.byteOffset >= 0 && error.byteOffset <= bytes.count)
                continue
            }
            parsed += 1
            var writer = JSONWriter()
            writer.value(value)
            // JSON has no infinity: a number too large for a Double (`-1e400`) is written as null.
            #expect(try JSONValue.parse(writer.bytes) == value.infinitiesAsNull, "\(String(decoding: bytes, as: UTF8.self))")
        }
        #expect(parsed > 2000)
    }

    /// A refused record's reason goes into a dead letter's `mailpush-error` header or a log line: one short line a
    /// person can read, however the record was broken, never the hostile value echoed back whole. Every record kind,
    /// with each member set to a hostile value (control characters, a long string, another type) and, separately,
    /// with its bytes damaged.
    @Test func anyBrokenRecordIsRefusedWithOneShortLine() {
        let filter = SudoFilterList().initEmailNotifications(on: .ios)
        let records: [(what: String, fixture: JSONObjectFixture, decode: ([UInt8]) throws(InputError) -> Void)] = [
            ("event", Fixtures.event(), { bytes throws(InputError) in _ = try EmailReceived.decode(bytes) }),
            ("iOS device", Fixtures.device(filter: filter), { bytes throws(InputError) in _ = try DeviceRegistration.decode(bytes) }),
            (
                "sponsor device", Fixtures.device(target: .comMethodWebhook(sponseeDetails: #"{"url":"https://example.com/h"}"#)),
                { bytes throws(InputError) in _ = try DeviceRegistration.decode(bytes) }
            ),
            ("address key", TestKeys.addressKeyJSON(), { bytes throws(InputError) in _ = try AddressKey.decode(bytes) }),
        ]
        let evil = "evil\n\r\u{1}\u{7f}\u{2028}" + String(repeating: "x", count: 300)
        let hostileValues: [JSONValue] = [
            .string(evil), .string(""), .number(JSONNumber(-1.5)), .bool(true), .null, .array([.string(evil)]),
            .object(["rule": .string(evil)]),
            // One character of 5,000 combining marks; a right-to-left override and a zero-width space.
            .string("x" + String(repeating: "\u{301}", count: 5000)), .string("ok\u{202e}txt.exe\u{200b}"),
        ]
        var random = SplitMix64(seed: 0x636f_6e66_6967)
        for record in records {
            var broken: [[UInt8]] = []
            for (key, _) in record.fixture.members {
                for value in hostileValues { broken.append(record.fixture.setting(key, value).bytes) }
            }
            // A filter rule is JSON inside a string: its own parser's errors must be as short.
            broken.append(
                record.fixture.setting(
                    "filter",
                    .array([.object(["serviceName": .string("emService"), "actionType": .string("ENABLE"), "rule": .string(evil)])])
                ).bytes)
            for _ in 0..<1000 {
                var bytes = record.fixture.bytes
                Damage.apply(to: &bytes, using: &random)
                broken.append(bytes)
            }
            var refused = 0
            for bytes in broken {
                do throws(InputError) {
                    try record.decode(bytes)
                } catch {
                    refused += 1
                    let scalars = error.reason.unicodeScalars
                    #expect(error.reason.utf8.count <= 300, "\(record.what): \(error.reason)")
                    #expect(
                        !scalars.contains { [.control, .format, .lineSeparator].contains($0.properties.generalCategory) },
                        "\(record.what): \(error.reason)")
                    #expect(
                        !error.reason.contains(String(repeating: "x", count: 100)), "\(record.what) echoed a value whole: \(error.reason)")
                }
            }
            #expect(refused > broken.count / 2, "\(record.what): most broken records must be refused")
        }
    }

    private static func byteOffset(in reason: String) -> Int? {
        guard let range = reason.range(of: "at byte ") else { return nil }
        return Int(reason[range.upperBound...].prefix { $0.isNumber })
    }
}

extension JSONValue {
    fileprivate var infinitiesAsNull: JSONValue {
        switch self {
        case .number(let n) where !n.doubleValue.isFinite: return .null
        case .array(let elements): return .array(elements.map(\.infinitiesAsNull))
        case .object(let members): return .object(members.mapValues(\.infinitiesAsNull))
        default: return self
        }
    }
}

/// Writes event-like JSON objects: each field valid most of the time, otherwise absent, null, mistyped,
/// repeated or out of bounds; members shuffled, spaced, and mixed with unknown members.
private struct EventWriter {
    struct Written {
        var bytes: [UInt8]
        var keysArePlain: Bool
    }

    var random: SplitMix64
    /// The chance in 100 that a field of the event being written breaks a rule.
    private var hostility = 0

    init(seed: UInt64) { random = SplitMix64(seed: seed) }

    mutating func write() -> Written {
        // Most events break no rule or one; some break many.
        hostility = [0, 0, 3, 10, 40].randomElement(using: &random)!
        var members: [(key: String, value: String)] = []
        func add(_ key: String, _ value: String?) {
            if let value { members.append((key, value)) }
        }
        add("type", pick(valid: [#""messageReceived""#], other: [#""messageDeleted""#, "null"], absentOK: true))
        for id in ["owner", "emailAddressId", "sudoId", "messageId", "folderId"] {
            add(id, pick(valid: [string()], other: [#""""#, Self.idTooLong, #""a\u0000b""#, "null"]))
        }
        add("encryptionStatus", pick(valid: [#""ENCRYPTED""#, #""UNENCRYPTED""#], other: [#""encrypted""#]))
        add("subject", pick(valid: [string(), "null"], other: [], absentOK: true))
        add("from", pick(valid: [address()], other: [#""a@example.com""#, "null"]))
        add("replyTo", pick(valid: [address(), "null"], other: [#"{"displayName":"R"}"#], absentOK: true))
        add("hasAttachments", pick(valid: ["true", "false"], other: ["null", "0", #""true""#]))
        let notATime = ["1.5", "1e30", "9223372036854775808", #""1718330537000""#, "null", "-"]
        add(
            "sentAtEpochMs",
            pick(valid: ["1718330537000", "1.718330537e12", "-5", "0", "1718330537000.0", "9223372036854775807"], other: notATime))
        // A job's expiry is computed from the received time, so it must lie in 1970…9999.
        add(
            "receivedAtEpochMs",
            pick(
                valid: ["1718330537000", "1.718330537e12", "0", "1718330537000.0", "253402300799999"],
                other: notATime + ["-5", "253402300800000", "9223372036854775807"]))
        if roll(3) { members.append(("somethingNew", unknownValue(depth: 0))) }
        // A repeated key: the last one counts, on both paths.
        if roll(4), let repeated = members.randomElement(using: &random) {
            members.append((repeated.key, pick(valid: [string()], other: ["null", "7", "{}"]) ?? "null"))
        }
        members.shuffle(using: &random)

        var keysArePlain = true
        var text = space() + "{"
        for (index, member) in members.enumerated() {
            var key = "\"\(member.key)\""
            if roll(40) {
                // The same key with an escape in it: the fast path gives way to the general path.
                key = "\"\\u00\(String(member.key.utf8.first!, radix: 16))\(member.key.dropFirst())\""
                keysArePlain = false
            }
            text += (index == 0 ? "" : ",") + space() + key + space() + ":" + space() + member.value
        }
        text += space() + "}" + space()
        return Written(bytes: Array(text.utf8), keysArePlain: keysArePlain)
    }

    private static let idTooLong = "\"" + String(repeating: "i", count: InputLimits.maxIdBytes + 1) + "\""

    /// True one time in `n`.
    private mutating func roll(_ n: Int) -> Bool { Int.random(in: 0..<n, using: &random) == 0 }

    /// A valid value, unless this field breaks a rule: then one of `other`, or nothing at all.
    private mutating func pick(valid: [String], other: [String], absentOK: Bool = false) -> String? {
        if Int.random(in: 0..<100, using: &random) < hostility {
            if absentOK || Bool.random(using: &random) { return nil }
            if let other = other.randomElement(using: &random) { return other }
        }
        return valid.randomElement(using: &random)!
    }

    private mutating func string() -> String {
        let pieces = ["user-1", "em-add-1", "Hello", "é", "👋", #"\""#, #"\\"#, #"\n"#, #"\u00e9"#, #"\ud83d\udc4b"#, #"\/"#, " ", "x"]
        let count = Int.random(in: 1...4, using: &random)
        var text = "\""
        for _ in 0..<count { text += pieces.randomElement(using: &random)! }
        return text + "\""
    }

    private mutating func address() -> String {
        var members: [String] = []
        if let email = pick(valid: [#""a@example.com""#, string()], other: ["null", "1"]) {
            members.append(#""emailAddress":"# + email)
        }
        if let name = pick(valid: [string(), "null"], other: ["false"], absentOK: true) {
            members.append(#""displayName":"# + name)
        }
        if roll(5) { members.append(#""more":"# + unknownValue(depth: 1)) }
        members.shuffle(using: &random)
        return "{" + members.joined(separator: ",") + "}"
    }

    private mutating func unknownValue(depth: Int) -> String {
        switch Int.random(in: 0..<(depth > 3 ? 4 : 6), using: &random) {
        case 0: return "null"
        case 1: return ["-0", "1e-3", "12.5E+2", "-1e400", "0.0"].randomElement(using: &random)!
        case 2: return string()
        case 3: return Bool.random(using: &random) ? "true" : "false"
        case 4:
            var elements: [String] = []
            for _ in 0..<Int.random(in: 0...3, using: &random) { elements.append(unknownValue(depth: depth + 1)) }
            return "[" + elements.joined(separator: ",") + "]"
        default:
            var members: [String] = []
            for i in 0..<Int.random(in: 0...3, using: &random) { members.append("\"k\(i)\":" + unknownValue(depth: depth + 1)) }
            return "{" + members.joined(separator: ",") + "}"
        }
    }

    private mutating func space() -> String {
        roll(4) ? [" ", "\n", "\t", "\r\n "].randomElement(using: &random)! : ""
    }
}

/// Damages a record the way a broken producer or a hostile one would: a byte changed, dropped, added or the
/// record cut short, sometimes a byte JSON never allows (a control character, invalid UTF-8).
private enum Damage {
    static func apply(to bytes: inout [UInt8], using random: inout SplitMix64) {
        for _ in 0..<Int.random(in: 1...3, using: &random) {
            guard !bytes.isEmpty else { return }
            let at = Int.random(in: 0..<bytes.count, using: &random)
            let byte = [
                UInt8.random(in: 0...255, using: &random), UInt8(ascii: "\""), UInt8(ascii: "\\"), 0x00, 0xC3, 0xFF,
                UInt8(ascii: "}"), UInt8(ascii: ","), UInt8(ascii: "1"),
            ].randomElement(using: &random)!
            switch Int.random(in: 0..<4, using: &random) {
            case 0: bytes[at] = byte
            case 1: bytes.remove(at: at)
            case 2: bytes.insert(byte, at: at)
            default: bytes.removeSubrange(at...)
            }
        }
    }
}
