import Foundation
import MailpushCore
import Testing

@Suite("JSON parser and writer")
struct JSONTests {
    private func parse(_ text: String) throws -> JSONValue { try JSONValue.parse(Array(text.utf8)) }

    @Test func parsesEveryKindOfValue() throws {
        let v = try parse(#" {"a":[1,-2.5,true,false,null,"x"],"b":{"c":"d"},"e":1e2} "#)
        #expect(v["a"] == .array([.number(JSONNumber(1)), .number(JSONNumber(-2.5)), .bool(true), .bool(false), .null, .string("x")]))
        #expect(v["b"]?["c"] == .string("d"))
        #expect(v["e"]?.numberValue?.int64Value == 100)
    }

    @Test func integersStayExact() throws {
        // 2^53 + 1 is not representable as a Double.
        #expect(try parse("9007199254740993").numberValue?.storage == .int(9_007_199_254_740_993))
        #expect(try parse("-9223372036854775808").numberValue?.storage == .int(.min))
        #expect(try parse("9223372036854775807").numberValue?.storage == .int(.max))
        // Past Int64: becomes a Double, not a crash or a wrapped value.
        #expect(try parse("9223372036854775808").numberValue?.storage == .double(9_223_372_036_854_775_808))
        #expect(try parse("1718330541336").numberValue?.int64Value == 1_718_330_541_336)
        #expect(try parse("1.5").numberValue?.int64Value == nil)
    }

    @Test func numbersCompareNumerically() {
        #expect(JSONNumber(1) == JSONNumber(1.0))
        #expect(JSONNumber(9_007_199_254_740_993) != JSONNumber(9_007_199_254_740_992.0))
        #expect(Set([JSONNumber(2), JSONNumber(2.0)]).count == 1)
    }

    @Test func decodesEscapesAndSurrogatePairs() throws {
        let v = try parse(#""a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\udc4b""#)
        #expect(v == .string("a\"b\\c/d\u{8}\u{c}\n\r\té👋"))
        #expect(try parse("\"Grüße 👋\"") == .string("Grüße 👋"))
    }

    struct BadInput: Sendable, CustomTestStringConvertible {
        let text: [UInt8]
        let offset: Int
        let reason: String
        var testDescription: String { "\(String(decoding: text, as: UTF8.self).debugDescription) → \(offset)" }
        init(_ text: String, _ offset: Int, _ reason: String) { self.init(Array(text.utf8), offset, reason) }
        init(_ text: [UInt8], _ offset: Int, _ reason: String) {
            self.text = text
            self.offset = offset
            self.reason = reason
        }
    }

    @Test(arguments: [
        BadInput("", 0, "unexpected end of input"),
        BadInput("   ", 3, "unexpected end of input"),
        BadInput(#"{"messageId":"m1",}"#, 18, "expected string key"),
        BadInput(#"{"a" 1}"#, 5, "expected ':'"),
        BadInput(#"{"a":1 "b":2}"#, 7, "expected ',' or '}'"),
        BadInput("[1 2]", 3, "expected ',' or ']'"),
        BadInput(#"{"a":1"#, 6, "unexpected end of input"),
        BadInput(#"{"a":tru}"#, 8, "unexpected character '}'"),
        BadInput(#"{"a":01}"#, 6, "leading zero in number"),
        BadInput("1.", 2, "invalid number"),
        BadInput("-", 1, "invalid number"),
        BadInput(#""abc"#, 4, "unterminated string"),
        BadInput("\"a\u{1}b\"", 2, "control character in string"),
        BadInput(#""\x""#, 1, "invalid escape sequence"),
        BadInput(#""\u12g4""#, 5, #"invalid \u escape"#),
        BadInput(#""\ud83d""#, 1, #"unpaired surrogate in \u escape"#),
        BadInput(#""\udc4b""#, 1, #"unpaired surrogate in \u escape"#),
        BadInput([0x22, 0x61, 0xC3, 0x28, 0x22], 2, "invalid UTF-8"),
        BadInput([0x22, 0xED, 0xA0, 0x80, 0x22], 1, "invalid UTF-8"), // encoded surrogate
        BadInput([0x22, 0xC0, 0xAF, 0x22], 1, "invalid UTF-8"), // overlong "/"
        BadInput("{} {}", 3, "unexpected data after JSON value"),
        BadInput("nul", 3, "unexpected end of input"),
        BadInput("'a'", 0, "unexpected character '''"),
    ])
    func reportsByteOffsetAndReason(_ input: BadInput) {
        do {
            _ = try JSONValue.parse(input.text)
            Issue.record("expected a parse error")
        } catch {
            #expect(error.byteOffset == input.offset)
            #expect(error.reason == input.reason)
            #expect(error.description == "invalid JSON at byte \(input.offset): \(input.reason)")
        }
    }

    @Test func limitsNesting() {
        let deep = String(repeating: "[", count: 600) + String(repeating: "]", count: 600)
        #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(deep.utf8)) }
        let ok = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        #expect((try? JSONValue.parse(Array(ok.utf8))) != nil)
    }

    @Test func writerEscapesWhatJSONRequiresAndNothingElse() throws {
        var w = JSONWriter()
        w.beginObject()
        w.field("s", "q\"b\\s/\n\t\u{0}\u{1f}\u{7f}é👋")
        w.field("n", Int64.min)
        w.field("z", Int64(0))
        w.field("t", true)
        w.field("nil", nil as String?)
        w.key("a")
        w.beginArray()
        w.value(Int64(1))
        w.beginObject()
        w.endObject()
        w.value("x")
        w.endArray()
        w.endObject()
        let text = String(decoding: w.bytes, as: UTF8.self)
        #expect(
            text == #"{"s":"q\"b\\s/\n\t\u0000\u001f"# + "\u{7f}é👋"
                + #"","n":-9223372036854775808,"z":0,"t":true,"nil":null,"a":[1,{},"x"]}"#)
        // Round trip through the parser.
        let parsed = try JSONValue.parse(w.bytes)
        #expect(parsed["s"] == .string("q\"b\\s/\n\t\u{0}\u{1f}\u{7f}é👋"))
    }

    @Test(arguments: ["", "plain", "q\"", "a\\b", "\u{1}\u{8}\n", "é👋", "x\u{1f}y\"z"])
    func escapedLengthMatchesWriter(_ s: String) {
        var out: [UInt8] = []
        JSONWriter.appendQuoted(s, to: &out)
        #expect(JSONWriter.escapedLength(of: s) == out.count - 2)
    }

    @Test func embedsJSONAsAString() throws {
        let inner = JSONValue.object(["k": .string("v\"")]).serialized
        var w = JSONWriter()
        w.beginObject()
        w.key("data")
        w.stringValue(utf8: inner)
        w.endObject()
        let outer = try JSONValue.parse(w.bytes)
        let innerAgain = try JSONValue.parse(Array(outer["data"]!.stringValue!.utf8))
        #expect(innerAgain["k"] == .string("v\""))
    }

    @Test func base64RoundTripsAndIsStrict() {
        for n in 0..<40 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let text = Base64.encode(bytes)
            #expect(text.utf8.count == Base64.encodedLength(n))
            #expect(Base64.decode(text) == bytes)
        }
        #expect(Base64.encode(Array(#"{"a":1}"#.utf8)) == "eyJhIjoxfQ==")
        // Every character of the alphabet in every position of a group, against Foundation's encoder.
        for shift in 0..<3 {
            let bytes = (0..<(768 + shift)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 8) }
            #expect(Base64.encode(bytes) == Data(bytes).base64EncodedString())
        }
        #expect(Base64.decode("eyJhIjoxfQ") == Array(#"{"a":1}"#.utf8)) // padding optional
        #expect(Base64.decode("eyJh Ijox") == nil)
        #expect(Base64.decode("not*base64") == nil)
        #expect(Base64.decode("eyJhIjoxfR==") == nil) // non-zero trailing bits
    }
}
