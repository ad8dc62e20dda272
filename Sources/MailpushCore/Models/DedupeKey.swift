import Crypto

/// The dedupe window's key of an email: the same email (same emailAddressId and messageId, CONTRACT §2 and §8)
/// has the same key whichever offset, partition or replay it came from. Fixed length, so the window's
/// index stays small whatever the ids; stored in the state file, so it must never change.
public enum DedupeKey {
    /// First 32 lowercase hex digits of SHA-256(emailAddressId ‖ 0x00 ‖ messageId).
    public static func make(emailAddressId: String, messageId: String) -> String {
        let digest = SHA256.hash(data: Array(emailAddressId.utf8) + [0] + Array(messageId.utf8))
        var hex = ""
        hex.reserveCapacity(32)
        for byte in digest.prefix(16) {
            if byte < 0x10 { hex += "0" }
            hex += String(byte, radix: 16)
        }
        return hex
    }

    public static func of(_ event: EmailReceived) -> String {
        make(emailAddressId: event.emailAddressId, messageId: event.messageId)
    }
}
