import Crypto
import MailpushMultiBufferRSA
import SwiftASN1
import Synchronization
import _CryptoExtras

/// How a notification is sealed for an address (CONTRACT §5–6).
public enum SealingAlgorithm: String, Sendable, Hashable, CaseIterable {
    /// RSA-OAEP(SHA-1) + AES-256-CBC, zero IV: what Sudo clients register and can open.
    case rsaOAEPAESCBC = "RSAEncryptionOAEPAESCBC"
    /// RSA-OAEP(SHA-256) + AES-256-GCM, keyId as AAD: the authenticated variant.
    case rsaOAEP256AESGCM = "RSAEncryptionOAEP256AESGCM"

    /// The RSA-OAEP padding of the AES key: SHA-1 with MGF1-SHA-1, or SHA-256 with MGF1-SHA-256.
    var oaepPadding: _RSA.Encryption.Padding {
        switch self {
        case .rsaOAEPAESCBC: .PKCS1_OAEP
        case .rsaOAEP256AESGCM: .PKCS1_OAEP_SHA256
        }
    }
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
        // Ids (CONTRACT §2, §5). `keyId` travels in every job of the address and filters read it (`meta.keyId`):
        // unbounded, one rule repeating it 2,900 times built a 290 MB string at every evaluation.
        let emailAddressId = try r.id("emailAddressId")
        let owner = try r.id("owner")
        let keyId = try r.id("keyId")

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
        let (actual, numbers) = try readPublicKeyDER(der)
        if let format, actual != format {
            throw unusable("publicKey is \(actual) DER but keyFormat says \(format)")
        }
        let publicKey = try makePublicKey(numbers)
        return AddressKey(
            emailAddressId: emailAddressId, owner: owner, keyId: keyId,
            algorithm: algorithm, publicKey: publicKey)
    }

    public static let maximumKeyBits = 16384

    /// An RSA public key's two numbers, big-endian, without leading zero bytes.
    struct RSANumbers {
        var modulus: ArraySlice<UInt8>
        var exponent: ArraySlice<UInt8>
    }

    /// The DER's form (`SPKI` or `RSA_PUBLIC_KEY`) and the key's modulus and exponent, read here rather than by
    /// swift-crypto's DER initializer: on DER it could not load, swift-crypto 3.12 freed its key object twice,
    /// and the process died on a key record. Its initializer from the two numbers fails cleanly. Truncated DER,
    /// trailing bytes, a non-RSA SPKI and integers that are negative or not minimally encoded are refused here.
    static func readPublicKeyDER(
        _ der: [UInt8]
    ) throws(InputError) -> (form: String, numbers: RSANumbers) {
        func pkcs1(_ node: ASN1Node) throws -> RSANumbers {
            try DER.sequence(node, identifier: .sequence) { elements in
                RSANumbers(
                    modulus: try ArraySlice<UInt8>(derEncoded: &elements), exponent: try ArraySlice<UInt8>(derEncoded: &elements))
            }
        }
        do {
            let root = try DER.parse(der)
            guard case .constructed(let children) = root.content, root.identifier == .sequence else {
                throw ASN1Error.unexpectedFieldType(root.identifier)
            }
            var elements = children.makeIterator()
            guard elements.next()?.identifier == .sequence else { return ("RSA_PUBLIC_KEY", try pkcs1(root)) }
            let numbers = try DER.sequence(root, identifier: .sequence) { elements in
                let algorithm = try DER.sequence(of: ASN1Any.self, identifier: .sequence, nodes: &elements)
                let key = try ASN1BitString(derEncoded: &elements)
                guard let oid = algorithm.first, try ASN1ObjectIdentifier(asn1Any: oid) == .AlgorithmIdentifier.rsaEncryption
                else { throw NotRSA() }
                guard key.paddingBits == 0 else { throw ASN1Error.invalidASN1Object(reason: "key bits") }
                return try pkcs1(DER.parse(key.bytes))
            }
            return ("SPKI", numbers)
        } catch is NotRSA {
            throw unusable("publicKey is not an RSA key")
        } catch {
            throw unusable("publicKey is not an RSA public key in SPKI or PKCS#1 DER form")
        }
    }

    private struct NotRSA: Error {}

    /// Enforces the bounds BoringSSL enforces when it loads a key, each with a reason a person can act on.
    static func makePublicKey(_ numbers: RSANumbers) throws(InputError) -> _RSA.Encryption.PublicKey {
        let modulusBits = bitCount(numbers.modulus)
        guard modulusBits >= minimumKeyBits else {
            throw unusable("RSA key must be at least \(minimumKeyBits) bits")
        }
        guard modulusBits <= maximumKeyBits else {
            throw unusable("RSA key must be at most \(maximumKeyBits) bits")
        }
        guard let lastByte = numbers.modulus.last, lastByte & 1 == 1 else {
            throw unusable("RSA key's modulus is even")
        }
        // BoringSSL refuses an exponent over 33 bits: a larger one would make every seal as slow as a private-key
        // operation, a cost one address could put on the whole fleet.
        guard let lastExponentByte = numbers.exponent.last, lastExponentByte & 1 == 1,
            (2...33).contains(bitCount(numbers.exponent))
        else {
            throw unusable("RSA key's public exponent must be odd, from 3 to 2^33 - 1")
        }
        do {
            return try _RSA.Encryption.PublicKey(n: numbers.modulus, e: numbers.exponent)
        } catch {
            throw unusable("publicKey is not a usable RSA key")
        }
    }

    /// The bit length of a big-endian unsigned integer without leading zero bytes (swift-asn1 strips the one
    /// DER allows).
    private static func bitCount(_ bytes: ArraySlice<UInt8>) -> Int {
        guard let first = bytes.first else { return 0 }
        return bytes.count * 8 - first.leadingZeroBitCount
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
    /// Asked of BoringSSL once: every job's size arithmetic needs it.
    let sizeInBytes: Int
    let framing = Mutex<PayloadFraming?>(nil)
    /// The modulus as `MultiBufferRSA` takes it, for a key it may take (exponent 65537, a size it has a method for).
    let multiBufferModulus: [UInt64]?

    init(_ key: _RSA.Encryption.PublicKey) {
        self.key = key
        sizeInBytes = key.keySizeInBits / 8
        multiBufferModulus =
            if let numbers = try? key.getKeyPrimitives(), MultiBufferRSA.words(bigEndian: numbers.publicExponent) == [65537],
                MultiBufferRSA.keyBits.contains(key.keySizeInBits)
            {
                MultiBufferRSA.words(bigEndian: numbers.modulus)
            } else {
                nil
            }
    }
}

/// A key's payload prefixes (`JobRenderer.payloadPrefix`) for one renderer's APNs head, with what they were made of.
struct PayloadFraming: Sendable {
    var apnsHead: [UInt8]
    var keyId: String
    var algorithm: SealingAlgorithm
    var apnsPrefix: [UInt8]
    var fcmPrefix: [UInt8]
}

extension AddressKey {
    /// The modulus's length in bytes: the RSA part of every sealed payload.
    var rsaBytes: Int { keyBox.sizeInBytes }

    /// The modulus in `MultiBufferRSA`'s form (little-endian words), if it may seal for this key.
    var multiBufferModulus: [UInt64]? { keyBox.multiBufferModulus }

    /// The payload prefixes of this key for a renderer whose APNs head is `apnsHead`, made by `make` the first time.
    /// Why kept with the key: they depend on it alone, and the config cache keeps a parsed key for its address's
    /// next emails; made per email they were about 1% of a drain's CPU. They hold about 500 bytes beside the parsed
    /// key (the alert's length more), so the 10,000 addresses the cache holds by default keep about 5 MB of them.
    func payloadFraming(
        apnsHead: [UInt8], make: () -> (apns: [UInt8], fcm: [UInt8])
    ) -> (apns: [UInt8], fcm: [UInt8]) {
        if let kept = keyBox.framing.withLock({ $0 }), kept.apnsHead == apnsHead, kept.keyId == keyId,
            kept.algorithm == algorithm
        {
            return (kept.apnsPrefix, kept.fcmPrefix)
        }
        let made = make()
        keyBox.framing.withLock {
            $0 = PayloadFraming(apnsHead: apnsHead, keyId: keyId, algorithm: algorithm, apnsPrefix: made.apns, fcmPrefix: made.fcm)
        }
        return made
    }
}
