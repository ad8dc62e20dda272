import _CryptoExtras

/// A freshly generated RSA key pair in the forms mailpush deals in: the private key as PEM
/// (what a client keeps; `Unsealer` takes it) and the public key as base64 DER in both
/// AddressKey `keyFormat`s. For development tooling and tests; production keys are made on
/// the clients.
public struct RSAKeyPair: Sendable {
    /// PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    public let privateKeyPEM: String
    /// X.509 SubjectPublicKeyInfo DER, base64 (`keyFormat` `SPKI`).
    public let publicKeySPKIBase64: String
    /// PKCS#1 RSAPublicKey DER, base64 (`keyFormat` `RSA_PUBLIC_KEY`).
    public let publicKeyPKCS1Base64: String

    public init(privateKeyPEM: String, publicKeySPKIBase64: String, publicKeyPKCS1Base64: String) {
        self.privateKeyPEM = privateKeyPEM
        self.publicKeySPKIBase64 = publicKeySPKIBase64
        self.publicKeyPKCS1Base64 = publicKeyPKCS1Base64
    }

    /// Generates a key of `bits` bits. Sizes under 2048 are allowed (down to 1024) only so that
    /// tests can show that such keys are rejected.
    public static func generate(bits: Int = 2048) throws -> RSAKeyPair {
        let privateKey = try _RSA.Encryption.PrivateKey(unsafeKeySize: _RSA.Signing.KeySize(bitCount: bits))
        let publicKey = privateKey.publicKey
        return RSAKeyPair(
            privateKeyPEM: privateKey.pkcs8PEMRepresentation,
            publicKeySPKIBase64: Base64.encode(publicKey.derRepresentation),
            publicKeyPKCS1Base64: Base64.encode(publicKey.pkcs1DERRepresentation))
    }
}
