import Crypto

/// Deterministic push job ids (CONTRACT §7): the same email for the same device always has the
/// same id, whichever offset or replay it came from, so the sender can deduplicate.
public enum JobID {
    /// First 32 lowercase hex digits of SHA-256(emailAddressId ‖ 0x00 ‖ messageId ‖ 0x00 ‖ deviceId).
    public static func make(emailAddressId: String, messageId: String, deviceId: String) -> String {
        var hasher = SHA256()
        hasher.update(data: Array(emailAddressId.utf8))
        hasher.update(data: [0])
        hasher.update(data: Array(messageId.utf8))
        hasher.update(data: [0])
        hasher.update(data: Array(deviceId.utf8))
        let digest = hasher.finalize()
        let hex: [UInt8] = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(32)
        for byte in digest.prefix(16) {
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
