import Crypto
import SwiftASN1
import _CryptoExtras

/// How a notification is sealed for an address (CONTRACT §5–6).
public enum SealingAlgorithm: String, Sendable, Hashable, CaseIterable {
    /// RSA-OAEP(SHA-1) + AES-256-CBC, zero IV: what Sudo clients register and can open.
    case rsaOAEPAESCBC = "RSAEncryptionOAEPAESCBC"
    /// RSA-OAEP(SHA-256) + AES-256-GCM, keyId as AAD: the authenticated variant.
    case rsaOAEP256AESGCM = "RSAEncryptionOAEP256AESGCM"
}

/// AddressKey v1 (CONTRACT §5), with the public key parsed once.
public struct AddressKey: Sendable {
    public var emailAddressId: String
    public var owner: String
    public var keyId: String
    public var algorithm: SealingAlgorithm

    /// The parsed RSA key (SPKI and PKCS#1 DER both parse to this).
    public var publicKey: _RSA.Encryption.PublicKey {
        get { keyBox.key }
        set { keyBox = PublicKeyBox(newValue) }
    }

    private var keyBox: PublicKeyBox

    public static let minimumKeyBits = 2048
    public static let keyFormats = ["SPKI", "RSA_PUBLIC_KEY"]

    public init(
        emailAddressId: String, owner: String, keyId: String, algorithm: SealingAlgorithm,
        publicKey: _RSA.Encryption.PublicKey
    ) {
        self.emailAddressId = emailAddressId
        self.owner = owner
        self.keyId = keyId
        self.algorithm = algorithm
        self.keyBox = PublicKeyBox(publicKey)
    }

    /// Decodes a record value of `mailpush.address-keys`.
    ///
    /// `keyFormat` must be `SPKI` or `RSA_PUBLIC_KEY` when given, and the DER must be in that form:
    /// a mislabelled key points at a provisioning bug worth hearing about. Without `keyFormat`
    /// either form is accepted (the two are unambiguous).
    public static func decode(_ bytes: [UInt8]) throws(InputError) -> AddressKey {
        let r = try FieldReader.root(bytes, what: "address key")
        let emailAddressId = try r.nonEmptyString("emailAddressId")
        let owner = try r.nonEmptyString("owner")
        let keyId = try r.nonEmptyString("keyId")

        let algorithmText = try r.string("algorithm")
        guard let algorithm = SealingAlgorithm(rawValue: algorithmText) else {
            throw unusable("unsupported algorithm \(quotedForError(algorithmText))")
        }
        let format = try r.optionalString("keyFormat")
        if let format, !keyFormats.contains(format) {
            throw unusable("unsupported keyFormat \(quotedForError(format)) (expected SPKI or RSA_PUBLIC_KEY)")
        }
        let publicKeyText = try r.string("publicKey")
        guard let der = Base64.decode(publicKeyText), !der.isEmpty else {
            throw unusable("publicKey is not valid base64")
        }
        // swift-crypto ignores bytes after the key; a record carrying them is corrupt.
        guard let actual = derForm(der) else {
            throw unusable("publicKey is not an RSA public key in SPKI or PKCS#1 DER form")
        }
        if let format, actual != format {
            throw unusable("publicKey is \(actual) DER but keyFormat says \(format)")
        }
        let publicKey = try parsePublicKey(der)
        return AddressKey(
            emailAddressId: emailAddressId, owner: owner, keyId: keyId,
            algorithm: algorithm, publicKey: publicKey)
    }

    /// Parses SPKI or PKCS#1 DER (swift-crypto tries both) and enforces the minimum size with a
    /// reason of its own: a too-short key is a provisioning mistake, not a corrupt record.
    public static func parsePublicKey(_ der: [UInt8]) throws(InputError) -> _RSA.Encryption.PublicKey {
        let key: _RSA.Encryption.PublicKey
        do {
            // The `unsafe` initializer admits 1024-bit keys, so that they can be named as such.
            key = try _RSA.Encryption.PublicKey(unsafeDERRepresentation: der)
        } catch CryptoKitError.incorrectParameterSize {
            // Parsed, but under 1024 bits (or not a whole number of bytes).
            throw unusable("RSA key must be at least \(minimumKeyBits) bits")
        } catch {
            throw unusable("publicKey is not an RSA public key in SPKI or PKCS#1 DER form")
        }
        guard key.keySizeInBits >= minimumKeyBits else {
            throw unusable("RSA key must be at least \(minimumKeyBits) bits")
        }
        return key
    }

    /// `SPKI` or `RSA_PUBLIC_KEY` from the DER's shape: both are a SEQUENCE, whose first element is
    /// the AlgorithmIdentifier SEQUENCE in SPKI and the modulus INTEGER in PKCS#1. `nil` for
    /// anything else, including DER that is truncated or followed by trailing bytes.
    static func derForm(_ der: [UInt8]) -> String? {
        guard let root = try? DER.parse(der), root.identifier == .sequence,
            case .constructed(let children) = root.content
        else { return nil }
        var elements = children.makeIterator()
        switch elements.next()?.identifier {
        case .sequence: return "SPKI"
        case .integer: return "RSA_PUBLIC_KEY"
        default: return nil
        }
    }

    private static func unusable(_ reason: String) -> InputError {
        InputError(reason: reason, category: InputError.Category.unusableKey)
    }
}

/// swift-crypto 3.12 does not mark `_RSA.Encryption.PublicKey` `Sendable`, although it is an
/// immutable wrapper around a BoringSSL `EVP_PKEY` (reference-counted, never mutated after
/// parsing) and every `encrypt` call creates its own `EVP_PKEY_CTX`. Sharing it across threads
/// is therefore safe; this box states that once instead of weakening checks module-wide.
private final class PublicKeyBox: @unchecked Sendable {
    let key: _RSA.Encryption.PublicKey
    init(_ key: _RSA.Encryption.PublicKey) { self.key = key }
}
