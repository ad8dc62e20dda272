import Foundation
import MailpushMultiBufferRSA
import MailpushTestSupport
import Testing
import _CryptoExtras

@testable import MailpushCore

/// Sealings whose RSA operations were made eight at a time (`MultiBufferRSA`, Intel's libcrypto_mb), opened by
/// BoringSSL's RSA-OAEP decryption through swift-crypto: the OAEP padding written for them, the library's
/// exponentiation and the lanes' bookkeeping are all checked against an implementation that shares none of them.
@Suite("Multi-buffer sealing")
struct MultiBufferSealingTests {
    /// `make deps` installs the library; whether it can run depends on the processor.
    static let processorHasIFMA = ((try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? "").contains(" avx512ifma")

    static func loaded() throws -> MultiBufferRSA {
        switch MultiBufferRSA.load() {
        case .success(let multiBuffer): return multiBuffer
        case .failure(let why): throw LoadFailed(reason: why.description)
        }
    }

    struct LoadFailed: Error, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }

    @Test func loadsExactlyWhereTheProcessorHasAVX512IFMA() {
        switch MultiBufferRSA.load() {
        case .success(let multiBuffer):
            #expect(Self.processorHasIFMA)
            #expect(multiBuffer.supports(keyBits: 2048))
        case .failure(let why):
            #expect(!Self.processorHasIFMA, "the processor has AVX-512 IFMA, but: \(why)")
        }
    }

    struct Signer {
        let privateKey: _RSA.Encryption.PrivateKey
        let key: AddressKey
    }

    static func signer(bits: Int, algorithm: SealingAlgorithm, keyId: String) throws -> Signer {
        let pair = try RSAKeyPair.generate(bits: bits)
        return Signer(
            privateKey: try _RSA.Encryption.PrivateKey(pemRepresentation: pair.privateKeyPEM),
            key: try TestKeys.addressKey(pair, keyId: keyId, algorithm: algorithm))
    }

    @Test(.enabled(if: processorHasIFMA))
    func freshKeysEncryptedTogetherOpenWithTheirOwnPrivateKeysOnly() throws {
        let multiBuffer = try Self.loaded()
        // Three 2048-bit keys in both algorithms share calls; a 3072-bit key has calls of its own; a 2560-bit key has
        // no multi-buffer method and is encrypted one at a time. 31 sealings: full calls, a short one, and singles.
        var signers: [Signer] = []
        for index in 0..<3 {
            signers.append(try Self.signer(bits: 2048, algorithm: .rsaOAEPAESCBC, keyId: "cbc-\(index)"))
        }
        signers.append(try Self.signer(bits: 2048, algorithm: .rsaOAEP256AESGCM, keyId: "gcm"))
        signers.append(try Self.signer(bits: 3072, algorithm: .rsaOAEPAESCBC, keyId: "big"))
        signers.append(try Self.signer(bits: 2560, algorithm: .rsaOAEPAESCBC, keyId: "odd"))
        #expect(signers[0].key.multiBufferModulus?.count == 32)
        #expect(signers[4].key.multiBufferModulus?.count == 48)
        #expect(signers[5].key.multiBufferModulus == nil)
        let order = (0..<31).map { ($0 * 7) % signers.count }
        let encrypted = Sealer.encryptFreshKeys(for: order.map { signers[$0].key }, multiBuffer: multiBuffer)
        #expect(encrypted.count == order.count)

        let plaintext = Array(#"{"type":"messageReceived","subject":"multi-buffer"}"#.utf8)
        var seen = Set<[UInt8]>()
        for (position, signerIndex) in order.enumerated() {
            let signer = signers[signerIndex]
            let one = try #require(encrypted[position], "sealing \(position) (\(signer.key.keyId))")
            #expect(seen.insert(one.encrypted).inserted, "two sealings share encrypted bytes")
            let sealed = try Sealer.sealRaw(plaintext, with: signer.key, encryptedKey: one)
            let opened = try Unsealer.open(
                sealed: sealed, algorithm: signer.key.algorithm, keyId: signer.key.keyId, privateKey: signer.privateKey)
            #expect(opened == plaintext, "sealing \(position) (\(signer.key.keyId))")
            // Another key's private key does not open it.
            let other = signers[(signerIndex + 1) % signers.count]
            #expect(throws: (any Error).self) {
                try Unsealer.open(sealed: sealed, algorithm: signer.key.algorithm, keyId: signer.key.keyId, privateKey: other.privateKey)
            }
        }
    }

    @Test(.enabled(if: processorHasIFMA))
    func aRendererWithMultiBufferRSAWritesJobsASudoClientOpens() throws {
        var options = RenderOptions()
        options.multiBufferRSA = try Self.loaded()
        let renderer = JobRenderer(options: options)
        let pair = TestKeys.shared
        let key = try TestKeys.addressKey(pair)
        let event = try EmailReceived.decode(Fixtures.event().bytes)
        let devices = try (0..<10).map { index in
            try DeviceRegistration.decode(
                Fixtures.device(
                    deviceId: "dev-\(index)", target: index % 2 == 0 ? .ios(token: "apns-\(index)") : .android(token: "fcm-\(index)")
                ).bytes)
        }
        let email = renderer.prepare(event: event, key: key)
        let encrypted = renderer.encryptFreshKeys(for: devices.map { _ in key })
        var payloads = Set<String>()
        for (index, device) in devices.enumerated() {
            let job = try renderer.render(
                email, device: device, source: SourceRef(topic: "email.received", partition: 0, offset: 1), nowMs: 1,
                encryptedKey: encrypted[index])
            let opened = try Unsealer.open(pushJob: job.value, privateKeyPEM: pair.privateKeyPEM)
            #expect(opened == notificationPlaintext(event))
            #expect(payloads.insert(try Unsealer.notificationData(inPushJob: job.value)).inserted)
        }
    }
}
