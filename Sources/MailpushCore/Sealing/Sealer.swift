import Crypto
import _CryptoExtras

/// Seals notification plaintext for an address key (CONTRACT §6).
///
/// Exactly one RSA encryption per call: the job renderer sizes payloads with
/// `sealedBase64Length` beforehand instead of sealing and retrying.
public enum Sealer {
    /// AES-CBC with a fixed IV is only safe because every sealing uses a fresh AES key.
    static let zeroIV = [UInt8](repeating: 0, count: 16)
    static let gcmNonceLength = 12
    static let gcmTagLength = 16
    static let aesKeyLength = 32

    /// `base64(sealed)`, CONTRACT §6.
    public static func seal(_ plaintext: [UInt8], with key: AddressKey) throws -> String {
        var out: [UInt8] = []
        try sealBase64(plaintext, with: key, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `base64(sealed)` to `out` (the renderer writes it straight into the payload). `encryptedKey`, made for
    /// `key` by `encryptFreshKeys` and used by no other sealing, spares this sealing its own RSA operation.
    public static func sealBase64(
        _ plaintext: [UInt8], with key: AddressKey, encryptedKey: EncryptedAESKey? = nil, into out: inout [UInt8]
    ) throws {
        Base64.encode(try sealRaw(plaintext, with: key, encryptedKey: encryptedKey), into: &out)
    }

    /// The sealed bytes before base64.
    public static func sealRaw(_ plaintext: [UInt8], with key: AddressKey, encryptedKey: EncryptedAESKey? = nil) throws -> [UInt8] {
        let encryptedKey = try encryptedKey ?? encryptFreshKey(for: key)
        // One buffer of the final size: the RSA part, then the AES part appended without growing it.
        var sealed: [UInt8] = []
        sealed.reserveCapacity(sealedLength(plaintextCount: plaintext.count, key: key))
        sealed.append(contentsOf: encryptedKey.encrypted)
        switch key.algorithm {
        case .rsaOAEPAESCBC:
            try AESCBC.appendEncrypted(plaintext, key: encryptedKey.aesKey, to: &sealed)
            return sealed
        case .rsaOAEP256AESGCM:
            let box = try AES.GCM.seal(
                plaintext, using: encryptedKey.aesKey, nonce: AES.GCM.Nonce(),
                authenticating: Array(key.keyId.utf8))
            // `combined` is nonce ‖ ciphertext ‖ tag, present because the nonce is 12 bytes.
            guard let combined = box.combined else { throw CryptoKitError.incorrectParameterSize }
            sealed.append(contentsOf: combined)
            return sealed
        }
    }

    /// Exact length of the sealed bytes (before base64) for a plaintext length.
    public static func sealedLength(plaintextCount: Int, key: AddressKey) -> Int {
        sealedLength(
            plaintextCount: plaintextCount, algorithm: key.algorithm,
            rsaBytes: key.rsaBytes)
    }

    static func sealedLength(plaintextCount: Int, algorithm: SealingAlgorithm, rsaBytes: Int) -> Int {
        switch algorithm {
        case .rsaOAEPAESCBC:
            // PKCS#7 always adds 1–16 bytes.
            return rsaBytes + (plaintextCount / 16 + 1) * 16
        case .rsaOAEP256AESGCM:
            return rsaBytes + gcmNonceLength + plaintextCount + gcmTagLength
        }
    }

    /// Exact length of `seal(_:with:)`'s result, without doing any cryptography.
    public static func sealedBase64Length(plaintextCount: Int, key: AddressKey) -> Int {
        Base64.encodedLength(sealedLength(plaintextCount: plaintextCount, key: key))
    }
}
