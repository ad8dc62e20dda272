/// Standard base64 (RFC 4648 §4, with padding) on byte arrays.
///
/// Hand-written because the render path appends the sealed payload straight into a JSON buffer;
/// going through `Data.base64EncodedString()` would allocate a `String` per job for nothing.
/// swift-extras-base64 also returns a new array, and its decoder accepts non-zero trailing bits
/// and odd padding, which this one refuses (JSONTests). `make bench` compares the three encoders:
/// encoding two characters per table lookup, this one takes about 0.7 µs for 2 KB, close to
/// ExtrasBase64 (it took 0.9 µs with one character per lookup), a small part of a job whose RSA seal
/// takes about 14 µs.
public enum Base64 {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    private static let decodeTable: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    /// The two characters of each 12-bit value, first one in the low byte (stored little-endian, as they go out).
    private static let characterPairs: [UInt16] = (0..<4096).map { value in
        let first = UInt16(alphabet[value >> 6])
        let second = UInt16(alphabet[value & 0x3F])
        return (first | second << 8).littleEndian
    }

    /// Encoded length of `count` bytes, padding included.
    public static func encodedLength(_ count: Int) -> Int { (count + 2) / 3 * 4 }

    public static func encode(_ bytes: some Collection<UInt8>, into out: inout [UInt8]) {
        if bytes.withContiguousStorageIfAvailable({ encode(buffer: $0, into: &out) }) == nil {
            Array(bytes).withUnsafeBufferPointer { encode(buffer: $0, into: &out) }
        }
    }

    private static func encode(buffer input: UnsafeBufferPointer<UInt8>, into out: inout [UInt8]) {
        let start = out.count
        let length = encodedLength(input.count)
        out.append(contentsOf: repeatElement(UInt8(ascii: "="), count: length))
        alphabet.withUnsafeBufferPointer { a in
            out.withUnsafeMutableBufferPointer { o in
                var i = 0
                var j = start
                // Two characters per lookup: each 3 bytes are two 12-bit halves.
                characterPairs.withUnsafeBufferPointer { pairs in
                    let raw = UnsafeMutableRawBufferPointer(o)
                    while i + 3 <= input.count {
                        let v = Int(input[i]) << 16 | Int(input[i + 1]) << 8 | Int(input[i + 2])
                        raw.storeBytes(of: pairs[v >> 12], toByteOffset: j, as: UInt16.self)
                        raw.storeBytes(of: pairs[v & 0xFFF], toByteOffset: j + 2, as: UInt16.self)
                        i += 3
                        j += 4
                    }
                }
                // 1 or 2 trailing bytes; the '=' padding is already in place.
                let rest = input.count - i
                if rest > 0 {
                    let v = UInt32(input[i]) << 16 | (rest == 2 ? UInt32(input[i + 1]) << 8 : 0)
                    o[j] = a[Int(v >> 18)]
                    o[j + 1] = a[Int(v >> 12 & 0x3F)]
                    if rest == 2 { o[j + 2] = a[Int(v >> 6 & 0x3F)] }
                }
            }
        }
    }

    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        var out: [UInt8] = []
        encode(bytes, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Strict decoding: standard alphabet only, no whitespace; padding may be omitted.
    /// Returns `nil` for anything else.
    public static func decode(_ text: some Collection<UInt8>) -> [UInt8]? {
        var input = Array(text)
        if input.count % 4 == 0, input.last == UInt8(ascii: "=") {
            input.removeLast()
            if input.last == UInt8(ascii: "=") { input.removeLast() }
        }
        if input.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(input.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for c in input {
            let v = decodeTable[Int(c)]
            if v == 0xFF { return nil }
            accumulator = accumulator << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        // Leftover bits must be zero, or the text was not produced by an encoder.
        if bits > 0 && accumulator & ((1 << UInt32(bits)) - 1) != 0 { return nil }
        return out
    }

    public static func decode(_ text: String) -> [UInt8]? { decode(Array(text.utf8)) }
}
