/// Appends compact JSON to a byte buffer, keys in the order they are written.
///
/// This is the render hot path (one push job per device per email), so it writes straight into
/// `[UInt8]` without intermediate `String`s or `Encodable` machinery. Separators are tracked with
/// a single flag: after any completed value the next element of the enclosing container needs a
/// comma, after a key or an opening bracket it does not — so no container stack is needed.
/// The writer trusts its caller to nest begin/end calls correctly.
public struct JSONWriter: Sendable {
    public private(set) var bytes: [UInt8]
    private var needsComma = false

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    // MARK: Structure

    public mutating func beginObject() {
        separator()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
    }

    public mutating func endObject() {
        bytes.append(UInt8(ascii: "}"))
        needsComma = true
    }

    public mutating func beginArray() {
        separator()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
    }

    public mutating func endArray() {
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    /// Writes `"key":`; the next call writes its value.
    public mutating func key(_ key: String) {
        separator()
        JSONWriter.appendQuoted(key, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    // MARK: Scalars

    public mutating func value(_ string: String) {
        separator()
        JSONWriter.appendQuoted(string, to: &bytes)
        needsComma = true
    }

    public mutating func value(_ int: Int64) {
        separator()
        JSONWriter.appendInteger(int, to: &bytes)
        needsComma = true
    }

    public mutating func value(_ int: Int) { value(Int64(int)) }

    public mutating func value(_ bool: Bool) {
        separator()
        bytes.append(contentsOf: bool ? JSONWriter.trueBytes : JSONWriter.falseBytes)
        needsComma = true
    }

    public mutating func value(_ number: JSONNumber) {
        switch number.storage {
        case .int(let i): value(i)
        case .double(let d):
            separator()
            if d.isFinite {
                bytes.append(contentsOf: d.description.utf8)
            } else {
                // JSON has no NaN/Infinity.
                bytes.append(contentsOf: JSONWriter.nullBytes)
            }
            needsComma = true
        }
    }

    public mutating func null() {
        separator()
        bytes.append(contentsOf: JSONWriter.nullBytes)
        needsComma = true
    }

    /// Writes `utf8` (already UTF-8, e.g. a serialized JSON document) as a JSON string value.
    /// Used to embed one JSON document inside another as a string, without a `String` detour.
    public mutating func stringValue(utf8: some Collection<UInt8>) {
        separator()
        bytes.append(UInt8(ascii: "\""))
        JSONWriter.appendEscaped(utf8: utf8, to: &bytes)
        bytes.append(UInt8(ascii: "\""))
        needsComma = true
    }

    /// Appends already-serialized JSON as one value. The caller vouches that it is valid JSON.
    public mutating func rawValue(_ json: some Collection<UInt8>) {
        separator()
        bytes.append(contentsOf: json)
        needsComma = true
    }

    /// Writes a value whose raw JSON bytes `write` appends to the buffer (it must append exactly one value).
    public mutating func rawValue<Failure: Error>(writing write: (inout [UInt8]) throws(Failure) -> Void) throws(Failure) {
        separator()
        try write(&bytes)
        needsComma = true
    }

    /// Writes any `JSONValue`; object keys are sorted so output is deterministic.
    public mutating func value(_ json: JSONValue) {
        switch json {
        case .null: null()
        case .bool(let b): value(b)
        case .number(let n): value(n)
        case .string(let s): value(s)
        case .array(let elements):
            beginArray()
            for e in elements { value(e) }
            endArray()
        case .object(let members):
            beginObject()
            for k in members.keys.sorted() {
                key(k)
                value(members[k]!)
            }
            endObject()
        }
    }

    // MARK: Key/value conveniences

    public mutating func field(_ name: String, _ string: String) {
        key(name)
        value(string)
    }

    /// Writes `null` for `nil`.
    public mutating func field(_ name: String, _ string: String?) {
        key(name)
        if let string { value(string) } else { null() }
    }

    public mutating func field(_ name: String, _ int: Int64) {
        key(name)
        value(int)
    }

    public mutating func field(_ name: String, _ bool: Bool) {
        key(name)
        value(bool)
    }

    // MARK: Escaping

    private mutating func separator() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
    }

    private static let trueBytes: [UInt8] = Array("true".utf8)
    private static let falseBytes: [UInt8] = Array("false".utf8)
    private static let nullBytes: [UInt8] = Array("null".utf8)
    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    /// For each byte: 0 = copy as is, `u` = `\u00XX`, anything else = backslash + that byte.
    /// Only `"`, `\` and C0 controls must be escaped (RFC 8259 §7); `/` and non-ASCII are not,
    /// which keeps base64 and UTF-8 text escape-free and sizes predictable.
    private static let escapeTable: [UInt8] = {
        var table = [UInt8](repeating: 0, count: 256)
        for c in 0..<0x20 { table[c] = UInt8(ascii: "u") }
        table[0x08] = UInt8(ascii: "b")
        table[0x09] = UInt8(ascii: "t")
        table[0x0A] = UInt8(ascii: "n")
        table[0x0C] = UInt8(ascii: "f")
        table[0x0D] = UInt8(ascii: "r")
        table[Int(UInt8(ascii: "\""))] = UInt8(ascii: "\"")
        table[Int(UInt8(ascii: "\\"))] = UInt8(ascii: "\\")
        return table
    }()

    /// Appends `"string"` with JSON escaping.
    public static func appendQuoted(_ string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        // `withUTF8` is mutating only to make a non-native (bridged) string contiguous; native
        // strings, small ones included, are read in place.
        var string = string
        string.withUTF8 { appendEscaped(buffer: $0, to: &out) }
        out.append(UInt8(ascii: "\""))
    }

    /// Appends the escaped form of UTF-8 bytes (without quotes).
    public static func appendEscaped(utf8: some Collection<UInt8>, to out: inout [UInt8]) {
        if utf8.withContiguousStorageIfAvailable({ appendEscaped(buffer: $0, to: &out) }) != nil {
            return
        }
        Array(utf8).withUnsafeBufferPointer { appendEscaped(buffer: $0, to: &out) }
    }

    @inline(__always)
    private static func needsEscape(_ b: UInt8) -> Bool {
        b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\")
    }

    private static func appendEscaped(buffer: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        // Most strings (ids, base64, names) need no escaping: one scan, one bulk append.
        var i = 0
        while i < buffer.count && !needsEscape(buffer[i]) { i += 1 }
        if i == buffer.count {
            out.append(contentsOf: buffer)
            return
        }
        escapeTable.withUnsafeBufferPointer { table in
            var runStart = 0
            while i < buffer.count {
                let escape = table[Int(buffer[i])]
                if escape == 0 {
                    i += 1
                    continue
                }
                if runStart < i { out.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[runStart..<i])) }
                out.append(UInt8(ascii: "\\"))
                if escape == UInt8(ascii: "u") {
                    let b = buffer[i]
                    out.append(contentsOf: [
                        UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                        hexDigits[Int(b >> 4)], hexDigits[Int(b & 0xF)],
                    ])
                } else {
                    out.append(escape)
                }
                i += 1
                runStart = i
            }
            if runStart < buffer.count {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[runStart..<buffer.count]))
            }
        }
    }

    /// Byte length of the escaped form of `string`, without quotes.
    public static func escapedLength(of string: String) -> Int {
        escapedLength(utf8: string.utf8)
    }

    /// Byte length of the escaped form of UTF-8 bytes, without quotes.
    public static func escapedLength(utf8: some Sequence<UInt8>) -> Int {
        var length = 0
        for b in utf8 {
            switch escapeTable[Int(b)] {
            case 0: length += 1
            case UInt8(ascii: "u"): length += 6
            default: length += 2
            }
        }
        return length
    }

    static func appendInteger(_ value: Int64, to out: inout [UInt8]) {
        if value == 0 {
            out.append(UInt8(ascii: "0"))
            return
        }
        // Work with the magnitude as UInt64 so that Int64.min needs no special case.
        var magnitude = value.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0) // 24 bytes ≥ 20 digits
        var count = 0
        withUnsafeMutableBytes(of: &digits) { raw in
            while magnitude > 0 {
                raw[23 - count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            }
            if value < 0 { out.append(UInt8(ascii: "-")) }
            out.append(contentsOf: UnsafeRawBufferPointer(rebasing: raw[(24 - count)...]))
        }
    }
}
