/// Standard base64 (RFC 4648 §4, with padding) on byte arrays.
///
/// Hand-written because the render path appends the sealed payload straight into a JSON buffer;
/// going through `Data.base64EncodedString()` would allocate a `String` per job for nothing.
public enum Base64 {
    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    private static let decodeTable: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    /// Encoded length of `count` bytes, padding included.
    public static func encodedLength(_ count: Int) -> Int { (count + 2) / 3 * 4 }

    public static func encode(_ bytes: some Collection<UInt8>, into out: inout [UInt8]) {
        out.reserveCapacity(out.count + encodedLength(bytes.count))
        alphabet.withUnsafeBufferPointer { a in
            var iterator = bytes.makeIterator()
            while let b0 = iterator.next() {
                let b1 = iterator.next()
                let b2 = iterator.next()
                out.append(a[Int(b0 >> 2)])
                out.append(a[Int((b0 & 0x03) << 4 | (b1 ?? 0) >> 4)])
                if let b1 {
                    out.append(a[Int((b1 & 0x0F) << 2 | (b2 ?? 0) >> 6)])
                } else {
                    out.append(UInt8(ascii: "="))
                }
                if let b2 {
                    out.append(a[Int(b2 & 0x3F)])
                } else {
                    out.append(UInt8(ascii: "="))
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
