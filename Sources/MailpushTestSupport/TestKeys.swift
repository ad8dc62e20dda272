import MailpushCore

/// RSA keys for tests. Generating a 2048-bit key takes a noticeable moment, so a shared one is
/// made once per process.
public enum TestKeys {
    /// A 2048-bit key pair shared by all tests of the process.
    public static let shared: RSAKeyPair = {
        do {
            return try RSAKeyPair.generate(bits: 2048)
        } catch {
            fatalError("cannot generate a test RSA key: \(error)")
        }
    }()

    /// An address key record for `pair`; `format` is the `keyFormat` (`SPKI` or
    /// `RSA_PUBLIC_KEY`) and picks the matching DER.
    public static func addressKeyJSON(
        _ pair: RSAKeyPair = shared, format: String = "SPKI", emailAddressId: String = "em-add-1",
        owner: String = "user-1", keyId: String = "key-1", algorithm: SealingAlgorithm = .rsaOAEPAESCBC
    ) -> JSONObjectFixture {
        Fixtures.addressKey(
            emailAddressId: emailAddressId, owner: owner, keyId: keyId, algorithm: algorithm.rawValue,
            keyFormat: format, publicKey: format == "SPKI" ? pair.publicKeySPKIBase64 : pair.publicKeyPKCS1Base64)
    }

    /// A decoded `AddressKey` for `pair`.
    public static func addressKey(
        _ pair: RSAKeyPair = shared, format: String = "SPKI", emailAddressId: String = "em-add-1",
        keyId: String = "key-1", algorithm: SealingAlgorithm = .rsaOAEPAESCBC
    ) throws -> AddressKey {
        try AddressKey.decode(
            addressKeyJSON(
                pair, format: format, emailAddressId: emailAddressId,
                keyId: keyId, algorithm: algorithm
            ).bytes)
    }
}
