/// Why a document is not JSON, and where.
///
/// `description` is what ends up in dead-letter headers, so it names the byte offset (0-based)
/// a person can jump to with `head -c`/`xxd`, plus a short reason.
public struct JSONParseError: Error, CustomStringConvertible, Sendable, Equatable {
    public let byteOffset: Int
    public let reason: String

    public init(byteOffset: Int, reason: String) {
        self.byteOffset = byteOffset
        self.reason = reason
    }

    public var description: String { "invalid JSON at byte \(byteOffset): \(reason)" }
}

extension JSONValue {
    /// Maximum nesting of arrays/objects. Inputs come from Kafka and are untrusted; the parser
    /// is recursive, so this bounds stack use.
    public static let maxNestingDepth = 512

    /// Parses one JSON document (RFC 8259): UTF-8, no trailing data, whitespace allowed around.
    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        let result: Result<JSONValue, JSONParseError>
        if let r = bytes.withContiguousStorageIfAvailable({ parseResult($0) }) {
            result = r
        } else {
            result = Array(bytes).withUnsafeBufferPointer { parseResult($0) }
        }
        return try result.get()
    }

    /// Convenience for rule strings and other JSON held in a `String`.
    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parse(Array(text.utf8))
    }

    private static func parseResult(_ buffer: UnsafeBufferPointer<UInt8>) -> Result<JSONValue, JSONParseError> {
        var parser = JSONParser(buffer)
        do throws(JSONParseError) {
            return .success(try parser.parseDocument())
        } catch {
            return .failure(error)
        }
    }
}

/// Recursive-descent parser over a contiguous byte buffer.
struct JSONParser {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    private var depth = 0

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        if index != bytes.count {
            throw fail("unexpected data after JSON value")
        }
        return value
    }

    // MARK: - Values

    mutating func parseValue() throws(JSONParseError) -> JSONValue {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
        default: throw unexpectedCharacter()
        }
    }

    private mutating func parseObject() throws(JSONParseError) -> JSONValue {
        // A record (an event has about a dozen members): growing 1, 2, 4, 8, 16 would rehash them four times.
        var members: [String: JSONValue] = depth == 0 ? Dictionary(minimumCapacity: 16) : [:]
        try readMembers(key: { parser throws(JSONParseError) in try parser.parseString() }) { parser, key throws(JSONParseError) in
            // Duplicate keys: the last one wins, as in most parsers (JavaScript included).
            members[key] = try parser.parseValue()
        }
        return .object(members)
    }

    /// Reads the object starting at the current `{` member by member, without building it: `member` gets each
    /// key's bytes (quotes excluded) and must read the value, from the parser it is handed. A key with an
    /// escape in it is refused (`decodeWellFormed` callers then take the general path, which handles it).
    mutating func forEachMember(
        _ member: (inout JSONParser, UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        try readMembers(key: { parser throws(JSONParseError) in try parser.plainKey() }, member)
    }

    /// The members of the object starting at the current `{`: each key as `readKey` reads it (from its opening
    /// quote), then `member` reads the value.
    private mutating func readMembers<Key>(
        key readKey: (inout JSONParser) throws(JSONParseError) -> Key,
        _ member: (inout JSONParser, Key) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        try enterContainer()
        index += 1 // {
        skipWhitespace()
        if peek() == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return
        }
        while true {
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            guard bytes[index] == UInt8(ascii: "\"") else { throw fail("expected string key") }
            let key = try readKey(&self)
            skipWhitespace()
            guard peek() == UInt8(ascii: ":") else { throw failExpecting("':'") }
            index += 1
            skipWhitespace()
            try member(&self, key)
            skipWhitespace()
            switch peek() {
            case UInt8(ascii: ","): index += 1
            case UInt8(ascii: "}"):
                index += 1
                depth -= 1
                return
            default: throw failExpecting("',' or '}'")
            }
        }
    }

    /// The bytes of a key without escapes (from its opening quote), quotes excluded.
    private mutating func plainKey() throws(JSONParseError) -> UnsafeBufferPointer<UInt8> {
        let keyStart = index + 1
        while true {
            index += 1
            guard index < bytes.count else { throw fail("unterminated string") }
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") { break }
            if byte == UInt8(ascii: "\\") || byte < 0x20 || byte >= 0x80 { throw fail("not a plain key") }
        }
        index += 1
        return UnsafeBufferPointer(rebasing: bytes[keyStart..<index - 1])
    }

    /// Past the document's end, trailing whitespace skipped.
    mutating func isAtEndOfDocument() -> Bool {
        skipWhitespace()
        return index == bytes.count
    }

    private mutating func parseArray() throws(JSONParseError) -> JSONValue {
        try enterContainer()
        index += 1 // [
        var elements: [JSONValue] = []
        skipWhitespace()
        if peek() == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try parseValue())
            skipWhitespace()
            switch peek() {
            case UInt8(ascii: ","): index += 1
            case UInt8(ascii: "]"):
                index += 1
                depth -= 1
                return .array(elements)
            default: throw failExpecting("',' or ']'")
            }
        }
    }

    mutating func enterContainer() throws(JSONParseError) {
        depth += 1
        if depth > JSONValue.maxNestingDepth { throw fail("nesting deeper than \(JSONValue.maxNestingDepth)") }
    }

    // MARK: - Strings

    /// Parses a string starting at the opening quote. Plain runs are copied straight from the
    /// input; only strings with escapes pay for a scratch buffer.
    mutating func parseString() throws(JSONParseError) -> String {
        index += 1 // opening quote
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let s = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                index += 1
                return s
            }
            if byte == UInt8(ascii: "\\") { break }
            try consumeStringByte(byte)
        }
        guard index < bytes.count else { throw fail("unterminated string") }

        var scratch = Array(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return String(decoding: scratch, as: UTF8.self)
            }
            if byte == UInt8(ascii: "\\") {
                try parseEscape(into: &scratch)
                continue
            }
            let runStart = index
            try consumeStringByte(byte)
            scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<index]))
        }
        throw fail("unterminated string")
    }

    /// Advances over one unescaped character (1–4 bytes), rejecting control characters and
    /// malformed UTF-8 so that a bad event is a dead letter instead of silently getting U+FFFD.
    private mutating func consumeStringByte(_ byte: UInt8) throws(JSONParseError) {
        if byte < 0x20 { throw fail("control character in string") }
        if byte < 0x80 {
            index += 1
            return
        }
        guard let length = UTF8Validation.sequenceLength(bytes, at: index) else {
            throw fail("invalid UTF-8")
        }
        index += length
    }

    private mutating func parseEscape(into scratch: inout [UInt8]) throws(JSONParseError) {
        let escapeStart = index
        index += 1 // backslash
        guard index < bytes.count else { throw fail("unterminated string") }
        let c = bytes[index]
        index += 1
        switch c {
        case UInt8(ascii: "\""): scratch.append(UInt8(ascii: "\""))
        case UInt8(ascii: "\\"): scratch.append(UInt8(ascii: "\\"))
        case UInt8(ascii: "/"): scratch.append(UInt8(ascii: "/"))
        case UInt8(ascii: "b"): scratch.append(0x08)
        case UInt8(ascii: "f"): scratch.append(0x0C)
        case UInt8(ascii: "n"): scratch.append(0x0A)
        case UInt8(ascii: "r"): scratch.append(0x0D)
        case UInt8(ascii: "t"): scratch.append(0x09)
        case UInt8(ascii: "u"):
            var scalar = try parseHex4()
            if (0xD800...0xDBFF).contains(scalar) {
                // A high surrogate must be followed by an escaped low surrogate.
                guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                    throw JSONParseError(byteOffset: escapeStart, reason: "unpaired surrogate in \\u escape")
                }
                index += 2
                let low = try parseHex4()
                guard (0xDC00...0xDFFF).contains(low) else {
                    throw JSONParseError(byteOffset: escapeStart, reason: "unpaired surrogate in \\u escape")
                }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
            } else if (0xDC00...0xDFFF).contains(scalar) {
                throw JSONParseError(byteOffset: escapeStart, reason: "unpaired surrogate in \\u escape")
            }
            // Valid by construction: surrogates were handled above.
            scratch.append(contentsOf: UTF8.encode(Unicode.Scalar(scalar)!)!)
        default:
            throw JSONParseError(byteOffset: escapeStart, reason: "invalid escape sequence")
        }
    }

    private mutating func parseHex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("invalid \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    // MARK: - Numbers and literals

    mutating func parseNumber() throws(JSONParseError) -> JSONNumber {
        let start = index
        var negative = false
        if bytes[index] == UInt8(ascii: "-") {
            negative = true
            index += 1
        }
        guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
        // Accumulate negatively so that Int64.min parses; overflow falls back to Double.
        var accumulator: Int64 = 0
        var overflow = false
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
            if index < bytes.count, isDigit(bytes[index]) { throw fail("leading zero in number") }
        } else {
            while index < bytes.count, isDigit(bytes[index]) {
                if !overflow {
                    let (m, o1) = accumulator.multipliedReportingOverflow(by: 10)
                    let (s, o2) = m.subtractingReportingOverflow(Int64(bytes[index] - UInt8(ascii: "0")))
                    if o1 || o2 { overflow = true } else { accumulator = s }
                }
                index += 1
            }
        }
        var isInteger = true
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("invalid number") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if isInteger && !overflow {
            if negative { return JSONNumber(accumulator) }
            if accumulator != .min { return JSONNumber(-accumulator) }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard let d = Double(text) else {
            throw JSONParseError(byteOffset: start, reason: "invalid number")
        }
        return JSONNumber(d)
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        let expected = UnsafeBufferPointer(start: literal.utf8Start, count: count)
        for i in 0..<count {
            guard index < bytes.count else { throw fail("unexpected end of input") }
            guard bytes[index] == expected[i] else { throw unexpectedCharacter() }
            index += 1
        }
    }

    // MARK: - Helpers

    private func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }

    func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    private func fail(_ reason: String) -> JSONParseError {
        JSONParseError(byteOffset: index, reason: reason)
    }

    private func failExpecting(_ what: String) -> JSONParseError {
        if index >= bytes.count { return fail("unexpected end of input") }
        return fail("expected \(what)")
    }

    private func unexpectedCharacter() -> JSONParseError {
        guard index < bytes.count else { return fail("unexpected end of input") }
        let c = bytes[index]
        if c > 0x20 && c < 0x7F {
            return fail("unexpected character '\(Character(Unicode.Scalar(c)))'")
        }
        return fail("unexpected byte 0x\(String(c, radix: 16, uppercase: true))")
    }
}

/// UTF-8 well-formedness per Unicode Table 3-7 (no overlongs, no surrogates, ≤ U+10FFFF).
enum UTF8Validation {
    /// Length of the well-formed multi-byte sequence starting at `i`, or `nil`.
    static func sequenceLength(_ b: UnsafeBufferPointer<UInt8>, at i: Int) -> Int? {
        let lead = b[i]
        let length: Int
        var lower: UInt8 = 0x80
        var upper: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0:
            length = 3
            lower = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED:
            length = 3
            upper = 0x9F
        case 0xF0:
            length = 4
            lower = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4:
            length = 4
            upper = 0x8F
        default: return nil
        }
        guard i + length <= b.count else { return nil }
        let second = b[i + 1]
        guard second >= lower && second <= upper else { return nil }
        for k in 2..<max(2, length) where b[i + k] & 0xC0 != 0x80 { return nil }
        return length
    }
}
