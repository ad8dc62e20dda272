import Foundation
import MailpushCore
import MailpushTestSupport
import Testing

/// `Sources/MailpushTestSupport/Vectors/sealing.json` (the contract's vectors) plus round trips with our own sealer (CONTRACT §6).
@Suite("Sealing")
struct SealingTests {
    struct Vectors {
        let privateKeyPEM: String
        let spki: String
        let pkcs1: String
        let plaintext: JSONValue
        let cases: [(algorithm: String, keyId: String, data: String)]
    }

    static func vectors() throws -> Vectors {
        let root = try SpecVectors.load("sealing.json")
        return Vectors(
            privateKeyPEM: try #require(root["privateKeyPem"]?.stringValue),
            spki: try #require(root["publicKeySPKI"]?.stringValue),
            pkcs1: try #require(root["publicKeyPKCS1"]?.stringValue),
            plaintext: try #require(root["plaintext"]),
            cases: try #require(root["cases"]?.arrayValue).map {
                (
                    try #require($0["algorithm"]?.stringValue), try #require($0["keyId"]?.stringValue),
                    try #require($0["data"]?.stringValue)
                )
            })
    }

    static func vectorKey(format: String, algorithm: SealingAlgorithm, keyId: String = "key-1") throws -> AddressKey {
        let v = try vectors()
        return try AddressKey.decode(
            Fixtures.addressKey(
                keyId: keyId, algorithm: algorithm.rawValue, keyFormat: format,
                publicKey: format == "SPKI" ? v.spki : v.pkcs1
            ).bytes)
    }

    /// The vector plaintext as an event, so that our plaintext serializer is checked too.
    static func vectorEvent() throws -> EmailReceived {
        try EmailReceived.decode(try vectors().plaintext.serialized)
    }

    @Test func opensBothIndependentVectors() throws {
        let v = try Self.vectors()
        #expect(v.cases.count == 2)
        #expect(Set(v.cases.map(\.algorithm)) == Set(SealingAlgorithm.allCases.map(\.rawValue)))
        for c in v.cases {
            let opened = try Unsealer.open(notificationData: c.data, privateKeyPEM: v.privateKeyPEM)
            #expect(try JSONValue.parse(opened) == v.plaintext, "\(c.algorithm)")
        }
    }

    @Test func ourPlaintextEqualsTheVectorPlaintext() throws {
        let v = try Self.vectors()
        let ours = notificationPlaintext(try Self.vectorEvent())
        #expect(try JSONValue.parse(ours) == v.plaintext)
        // Key order of CONTRACT §6.
        let text = String(decoding: ours, as: UTF8.self)
        let order = [
            "type", "owner", "emailAddressId", "sudoId", "messageId", "folderId", "encryptionStatus",
            "subject", "from", "hasAttachments", "sentAtEpochMs", "receivedAtEpochMs",
        ]
        let positions = order.map { text.range(of: "\"\($0)\":")!.lowerBound }
        #expect(positions == positions.sorted())
    }

    @Test func plaintextAlwaysHasSubjectAndReplyToOnlyIfPresent() throws {
        var e = try Self.vectorEvent()
        e.subject = nil
        e.replyTo = EmailAddress(emailAddress: "r@example.com", displayName: "R")
        let text = String(decoding: notificationPlaintext(e), as: UTF8.self)
        #expect(text.contains(#""subject":null,"from":"#))
        #expect(text.contains(#""replyTo":{"emailAddress":"r@example.com","displayName":"R"},"hasAttachments""#))
        e.replyTo = nil
        #expect(!String(decoding: notificationPlaintext(e), as: UTF8.self).contains("replyTo"))
    }

    @Test(arguments: ["SPKI", "RSA_PUBLIC_KEY"], SealingAlgorithm.allCases)
    func sealsWithBothKeyFormsAndOpensWithTheVectorPrivateKey(_ format: String, _ algorithm: SealingAlgorithm) throws {
        let v = try Self.vectors()
        let key = try Self.vectorKey(format: format, algorithm: algorithm)
        #expect(key.publicKey.keySizeInBits == 2048)
        let plaintext = notificationPlaintext(try Self.vectorEvent())
        let sealed = try Sealer.seal(plaintext, with: key)
        #expect(sealed.utf8.count == Sealer.sealedBase64Length(plaintextCount: plaintext.count, key: key))
        let data = Self.notificationData(keyId: "key-1", algorithm: algorithm, sealed: sealed)
        #expect(try Unsealer.open(notificationData: data, privateKeyPEM: v.privateKeyPEM) == plaintext)
    }

    @Test(arguments: SealingAlgorithm.allCases)
    func everySealingUsesAFreshKey(_ algorithm: SealingAlgorithm) throws {
        let key = try Self.vectorKey(format: "SPKI", algorithm: algorithm)
        // 300 sealings cross the AES key source's refills (128 keys each). The AES part differs every time,
        // not only the randomized OAEP part: with the fixed CBC IV a repeated key would repeat it.
        var aesParts = Set<[UInt8]>()
        for _ in 0..<300 {
            let sealed = try Sealer.seal(Array("same".utf8), with: key)
            aesParts.insert(Array(Base64.decode(sealed)!.suffix(16)))
        }
        #expect(aesParts.count == 300)
    }

    @Test func gcmBindsTheKeyId() throws {
        let v = try Self.vectors()
        let gcm = try #require(v.cases.first { $0.algorithm == SealingAlgorithm.rsaOAEP256AESGCM.rawValue })
        let tampered = gcm.data.replacingOccurrences(of: #""keyId":"key-1""#, with: #""keyId":"key-2""#)
        #expect(tampered != gcm.data)
        #expect(throws: UnsealError("AES-GCM authentication failed (wrong keyId or tampered payload)")) {
            try Unsealer.open(notificationData: tampered, privateKeyPEM: v.privateKeyPEM)
        }
        // Our own GCM sealing binds it as well.
        let key = try Self.vectorKey(format: "SPKI", algorithm: .rsaOAEP256AESGCM, keyId: "key-9")
        let sealed = try Sealer.seal(Array("x".utf8), with: key)
        #expect(throws: UnsealError.self) {
            try Unsealer.open(
                notificationData: Self.notificationData(keyId: "key-1", algorithm: .rsaOAEP256AESGCM, sealed: sealed),
                privateKeyPEM: v.privateKeyPEM)
        }
        #expect(
            try Unsealer.open(
                notificationData: Self.notificationData(keyId: "key-9", algorithm: .rsaOAEP256AESGCM, sealed: sealed),
                privateKeyPEM: v.privateKeyPEM) == Array("x".utf8))
    }

    @Test func wrongPrivateKeyOrAlgorithmFails() throws {
        let v = try Self.vectors()
        let cbc = try #require(v.cases.first { $0.algorithm == SealingAlgorithm.rsaOAEPAESCBC.rawValue })
        #expect(throws: UnsealError.self) {
            try Unsealer.open(notificationData: cbc.data, privateKeyPEM: TestKeys.shared.privateKeyPEM)
        }
        let relabelled = cbc.data.replacingOccurrences(of: "RSAEncryptionOAEPAESCBC", with: "RSAEncryptionOAEP256AESGCM")
        #expect(throws: UnsealError.self) {
            try Unsealer.open(notificationData: relabelled, privateKeyPEM: v.privateKeyPEM)
        }
    }

    /// Also checks the sealer's AES-CBC against swift-crypto's decryption (padding included)
    /// for every residue modulo the block size.
    @Test(arguments: SealingAlgorithm.allCases)
    func sealedLengthIsExactAndOpensForEveryPlaintextLength(_ algorithm: SealingAlgorithm) throws {
        let v = try Self.vectors()
        let key = try Self.vectorKey(format: "SPKI", algorithm: algorithm)
        for n in Array(0...48) + [100, 1000, 2999] {
            let plaintext = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ n) }
            let sealed = try Sealer.seal(plaintext, with: key)
            #expect(sealed.utf8.count == Sealer.sealedBase64Length(plaintextCount: n, key: key), "n=\(n)")
            let data = Self.notificationData(keyId: "key-1", algorithm: algorithm, sealed: sealed)
            #expect(try Unsealer.open(notificationData: data, privateKeyPEM: v.privateKeyPEM) == plaintext, "n=\(n)")
        }
    }

    @Test func generatedKeysWorkInBothFormats() throws {
        let pair = TestKeys.shared
        for format in ["SPKI", "RSA_PUBLIC_KEY"] {
            let key = try TestKeys.addressKey(pair, format: format, algorithm: .rsaOAEP256AESGCM)
            let sealed = try Sealer.seal(Array("hi".utf8), with: key)
            let data = Self.notificationData(keyId: "key-1", algorithm: .rsaOAEP256AESGCM, sealed: sealed)
            #expect(try Unsealer.open(notificationData: data, privateKeyPEM: pair.privateKeyPEM) == Array("hi".utf8))
        }
        #expect(pair.publicKeySPKIBase64 != pair.publicKeyPKCS1Base64)
    }

    static func notificationData(keyId: String, algorithm: SealingAlgorithm, sealed: String) -> String {
        var w = JSONWriter()
        w.beginObject()
        w.field("keyId", keyId)
        w.field("algorithm", algorithm.rawValue)
        w.field("type", "messageReceived")
        w.field("sealed", sealed)
        w.endObject()
        return String(decoding: w.bytes, as: UTF8.self)
    }
}

@Suite("Decoding address keys")
struct AddressKeyDecodingTests {
    /// Made with `openssl genrsa 1024 | openssl rsa -pubout -outform DER | base64`.
    static let rsa1024SPKI =
        "MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQChdv4r1q5RHcoz59EIBjt5iRvI45A5bo4KOudSrZMl03R6FlXGTYtsp8OQOdTYDnY5Un9dSJXBM4cwEofK80y2TkfnTWphcdQ5HEgm+b0Ckk0uot3M92f/MCs08+vcAwWxvcf47AQGL2WKtKgYeylo8FBuA7jomPCMtd6rThReBQIDAQAB"
    /// Same, `-RSAPublicKey_out` (PKCS#1).
    static let rsa1024PKCS1 =
        "MIGJAoGBAM917LaZSYYE3E8INGWwuPJ0YyPqyDmRb4zleGvjmlKBkc74mMXBP6jLmivfItt6MXsJZEeuGNGMx5AFxAQpnr3SxinUZ/UOxQ84Yjl6qANMjpZhrGjRg4v/DbF/Iuu3h3klk7JIkCXRefIwHCyM1YzjC5XQJwROHd0whOVmhjznAgMBAAE="
    /// 512 bits, below what the crypto library parses at all.
    static let rsa512SPKI =
        "MFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAMVgiAuWwXa4S6rZX03iywXGK37UZFTBqJG27U825+6WOXA/aZDlggIPd3Ocf3EseoXEoLNQGyQfRQmDDPX0f/MCAwEAAQ=="

    /// PKCS#1 with a 2048-bit modulus and the exponent 2^63 + 1, which BoringSSL refuses to load (made with Python).
    static let exponent64BitsPKCS1 =
        "MIIBEAKCAQEApIAxhbRPs2OSLJCf/UgcRLuUID3dU+orFeiLQCCPFEHeMpXvJ1363jJbtM+yzeZilAI93hD0Q/a6v/kZxv2K6pXzJTCIZfX6XYyRB3Yh3cImP4pFYXzoe88bddxbfVnoHtdektOeZlrAJXKU2YE0qOwuxcXsQyvOWS2hJ7bu1YiXuW5sdt2QT6660x4Z9hfw5AhgutnJhT13odyNNVTn2xNP3nELioTZFXz9lPwIT2pVXaitHk9yDcHRKFyf9dPJrdimbqyB17LILmhp4wRsbZJV0iRR/LleanvigUBhiZQ3BjaN+YCxduVJsz4NXz02ej4cD0lGgyPWFdxSt9DEXQIJAIAAAAAAAAAB"
    /// An EC P-256 SubjectPublicKeyInfo.
    static let ecP256SPKI =
        "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEaMzDhgileIkgd8dtzQOF/5Mm2eB50M0x/X+emCLr6SKA4EwegHQHOkFIRAS/5p+XBKllInw2E0TC0b2oaDtjiw=="

    @Test(arguments: ["SPKI", "RSA_PUBLIC_KEY"], SealingAlgorithm.allCases)
    func decodesBothFormatsAndAlgorithms(_ format: String, _ algorithm: SealingAlgorithm) throws {
        let key = try TestKeys.addressKey(format: format, emailAddressId: "em-add-5", keyId: "k-5", algorithm: algorithm)
        #expect(key.emailAddressId == "em-add-5")
        #expect(key.owner == "user-1")
        #expect(key.keyId == "k-5")
        #expect(key.algorithm == algorithm)
        #expect(key.publicKey.keySizeInBits == 2048)
    }

    static let broken: [(JSONObjectFixture, String, String)] = {
        let k = TestKeys.addressKeyJSON()
        return [
            (k.setting("algorithm", .string("AES")), "unsupported algorithm \"AES\"", "unusable_key"),
            (k.setting("keyFormat", .string("PEM")), "unsupported keyFormat \"PEM\" (expected SPKI or RSA_PUBLIC_KEY)", "unusable_key"),
            (k.setting("publicKey", .string("not base64!")), "publicKey is not valid base64", "unusable_key"),
            (
                k.setting("publicKey", .string("eyJhIjoxfQ==")), "publicKey is not an RSA public key in SPKI or PKCS#1 DER form",
                "unusable_key"
            ),
            (k.setting("publicKey", .string(rsa1024SPKI)), "RSA key must be at least 2048 bits", "unusable_key"),
            (
                k.setting("publicKey", .string(rsa1024PKCS1)).setting("keyFormat", .string("RSA_PUBLIC_KEY")),
                "RSA key must be at least 2048 bits", "unusable_key"
            ),
            (k.setting("publicKey", .string(rsa512SPKI)), "RSA key must be at least 2048 bits", "unusable_key"),
            // Both crashed the process before (swift-crypto 3.12 freed a key it could not load twice).
            (
                k.setting("publicKey", .string(exponent64BitsPKCS1)).setting("keyFormat", .string("RSA_PUBLIC_KEY")),
                "RSA key's public exponent must be odd, from 3 to 2^33 - 1", "unusable_key"
            ),
            (k.setting("publicKey", .string(ecP256SPKI)), "publicKey is not an RSA key", "unusable_key"),
            (k.setting("keyFormat", .string("RSA_PUBLIC_KEY")), "publicKey is SPKI DER but keyFormat says RSA_PUBLIC_KEY", "unusable_key"),
            (
                TestKeys.addressKeyJSON(format: "RSA_PUBLIC_KEY").setting("keyFormat", .string("SPKI")),
                "publicKey is RSA_PUBLIC_KEY DER but keyFormat says SPKI", "unusable_key"
            ),
            (k.removing("keyId"), "missing field keyId", "missing_field"),
            (k.removing("publicKey"), "missing field publicKey", "missing_field"),
            (k.setting("emailAddressId", .string("")), "field emailAddressId must not be empty", "invalid_field"),
        ]
    }()

    @Test(arguments: broken)
    func rejectsUnusableKeys(_ fixture: JSONObjectFixture, _ reason: String, _ category: String) {
        #expect(throws: InputError(reason: reason, category: DeadLetterReason(rawValue: category)!)) {
            try AddressKey.decode(fixture.bytes)
        }
    }

    /// A key whose DER is cut short or followed by more bytes is not a key, whether or not
    /// `keyFormat` names its form.
    @Test(arguments: ["SPKI", "RSA_PUBLIC_KEY"], [true, false])
    func rejectsTruncatedOrPaddedDER(_ format: String, _ labelled: Bool) throws {
        let pair = TestKeys.shared
        let der = try #require(Base64.decode(format == "SPKI" ? pair.publicKeySPKIBase64 : pair.publicKeyPKCS1Base64))
        // A whole NULL element after the key: well-formed DER on its own, but not part of the key.
        for mangled in [Array(der.dropLast(7)), der + [0x05, 0x00]] {
            var fixture = TestKeys.addressKeyJSON(format: format).setting("publicKey", .string(Base64.encode(mangled)))
            if !labelled { fixture = fixture.removing("keyFormat") }
            #expect(
                throws: InputError(
                    reason: "publicKey is not an RSA public key in SPKI or PKCS#1 DER form",
                    category: .unusableKey)
            ) {
                try AddressKey.decode(fixture.bytes)
            }
        }
    }

    @Test func keyFormatMayBeOmitted() throws {
        let key = try AddressKey.decode(TestKeys.addressKeyJSON(format: "RSA_PUBLIC_KEY").removing("keyFormat").bytes)
        #expect(key.publicKey.keySizeInBits == 2048)
    }
}
