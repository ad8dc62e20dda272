import Crypto

/// The dedupe window's key of an email: the same email (same emailAddressId and messageId, CONTRACT §2 and §8)
/// has the same key whichever offset, partition or replay it came from. Fixed length, so the window's
/// index stays small whatever the ids; stored in the state file, so it must never change.
public enum DedupeKey {
    /// First 32 lowercase hex digits of SHA-256(emailAddressId ‖ 0x00 ‖ messageId).
    public static func make(emailAddressId: String, messageId: String) -> String {
        var hasher = SHA256()
        var address = emailAddressId
        address.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        withUnsafeBytes(of: UInt8(0)) { hasher.update(bufferPointer: $0) }
        var message = messageId
        message.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        return hex(hasher.finalize())
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)

    private static func hex(_ digest: SHA256.Digest) -> String {
        digest.withUnsafeBytes { bytes in
            String(unsafeUninitializedCapacity: 32) { out in
                for (index, byte) in bytes.prefix(16).enumerated() {
                    out[2 * index] = hexDigits[Int(byte >> 4)]
                    out[2 * index + 1] = hexDigits[Int(byte & 0x0F)]
                }
                return 32
            }
        }
    }

    public static func of(_ event: EmailReceived) -> String {
        make(emailAddressId: event.emailAddressId, messageId: event.messageId)
    }
}
