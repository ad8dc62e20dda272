import Crypto

/// Deterministic push job ids (CONTRACT §7): the same email for the same device always has the
/// same id, whichever offset or replay it came from, so the sender can deduplicate.
public enum JobID {
    /// The length of every job id, in characters and in UTF-8 bytes.
    static let length = 32

    /// First 32 lowercase hex digits of SHA-256(emailAddressId ‖ 0x00 ‖ messageId ‖ 0x00 ‖ deviceId).
    public static func make(emailAddressId: String, messageId: String, deviceId: String) -> String {
        var hasher = SHA256()
        update(&hasher, emailAddressId)
        updateSeparator(&hasher)
        update(&hasher, messageId)
        updateSeparator(&hasher)
        update(&hasher, deviceId)
        let digest = hasher.finalize()
        var out: [UInt8] = []
        out.reserveCapacity(length)
        digest.withUnsafeBytes { bytes in
            for byte in bytes.prefix(length / 2) {
                out.append(hexDigits[Int(byte >> 4)])
                out.append(hexDigits[Int(byte & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    private static func update(_ hasher: inout SHA256, _ string: String) {
        var string = string
        string.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
    }

    /// The 0x00 between fields keeps ("ab","c") and ("a","bc") apart.
    private static func updateSeparator(_ hasher: inout SHA256) {
        withUnsafeBytes(of: UInt8(0)) { hasher.update(bufferPointer: $0) }
    }
}
