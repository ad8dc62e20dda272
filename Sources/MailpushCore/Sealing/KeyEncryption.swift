import Crypto
import MailpushMultiBufferRSA
import _CryptoExtras

/// The RSA part of one sealing (CONTRACT §6): a fresh AES key, and that key encrypted with RSA-OAEP for an address
/// key. Made for one sealing and used by it alone: the AES-CBC IV is fixed, so a key must never seal twice.
public struct EncryptedAESKey {
    let aesKey: SymmetricKey
    let encrypted: [UInt8]
}

extension Sealer {
    /// Fewest lanes worth a multi-buffer call: it costs about three operations one at a time, however many lanes are
    /// used (docs/performance.md, session 49).
    static let minimumLanes = 3

    /// A fresh AES key for each of `keys` (one entry per sealing), each encrypted for its address key: eight RSA
    /// operations a call where `multiBuffer` takes the key (2048-, 3072- and 4096-bit keys with exponent 65537), one at
    /// a time through swift-crypto otherwise. Nil where encrypting failed: that sealing then encrypts on its own and
    /// reports the failure.
    public static func encryptFreshKeys(for keys: [AddressKey], multiBuffer: MultiBufferRSA?) -> [EncryptedAESKey?] {
        var result = [EncryptedAESKey?](repeating: nil, count: keys.count)
        var byBits: [Int: [Int]] = [:]
        for index in keys.indices {
            if let multiBuffer, let bits = keys[index].multiBufferModulus.map({ $0.count * 64 }), multiBuffer.supports(keyBits: bits) {
                byBits[bits, default: []].append(index)
            } else {
                result[index] = try? encryptFreshKey(for: keys[index])
            }
        }
        guard let multiBuffer else { return result }
        for (bits, indices) in byBits {
            var start = indices.startIndex
            while start < indices.endIndex {
                let lanes = Array(indices[start..<min(start + MultiBufferRSA.lanes, indices.endIndex)])
                start += lanes.count
                var failed = Set(lanes)
                if lanes.count >= minimumLanes {
                    for (index, encrypted) in encryptTogether(lanes.map { keys[$0] }, keyBits: bits, multiBuffer).enumerated() {
                        guard let encrypted else { continue }
                        result[lanes[index]] = encrypted
                        failed.remove(lanes[index])
                    }
                }
                for index in failed { result[index] = try? encryptFreshKey(for: keys[index]) }
            }
        }
        return result
    }

    /// One sealing's key, encrypted by swift-crypto.
    static func encryptFreshKey(for key: AddressKey) throws -> EncryptedAESKey {
        let aesKey = AESKeySource.next()
        let encrypted = try aesKey.withUnsafeBytes { try key.publicKey.encrypt($0, padding: key.algorithm.oaepPadding) }
        return EncryptedAESKey(aesKey: aesKey, encrypted: Array(encrypted))
    }

    private static let sha1LabelHash = OAEP.labelHash(Insecure.SHA1.self)
    private static let sha256LabelHash = OAEP.labelHash(SHA256.self)

    /// Up to eight sealings' keys of one size in one multi-buffer call; nil for a lane the library refused.
    private static func encryptTogether(_ keys: [AddressKey], keyBits: Int, _ multiBuffer: MultiBufferRSA) -> [EncryptedAESKey?] {
        let lanes = MultiBufferRSA.lanes
        let k = keyBits / 8
        let words = keyBits / 64
        let aesKeys = keys.map { _ in AESKeySource.next() }
        var moduli = [UInt64](repeating: 0, count: lanes * words)
        for (lane, key) in keys.enumerated() {
            for (index, word) in key.multiBufferModulus!.enumerated() { moduli[lane * words + index] = word }
        }
        var outputs = [UInt8](repeating: 0, count: lanes * k)
        let failed = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: lanes * k) { inputs in
            // The padded AES keys are as secret as the keys: gone before the buffer is given back.
            defer { inputs.update(repeating: 0) }
            for (lane, key) in keys.enumerated() {
                let encoded = UnsafeMutableBufferPointer(rebasing: inputs[(lane * k)..<((lane + 1) * k)])
                aesKeys[lane].withUnsafeBytes { message in
                    // The same hashes as `oaepPadding`'s, which decryption expects.
                    switch key.algorithm {
                    case .rsaOAEPAESCBC:
                        OAEP.encode(message: message, labelHash: sha1LabelHash, hash: Insecure.SHA1.self, into: encoded)
                    case .rsaOAEP256AESGCM:
                        OAEP.encode(message: message, labelHash: sha256LabelHash, hash: SHA256.self, into: encoded)
                    }
                }
            }
            return moduli.withUnsafeBufferPointer { n in
                outputs.withUnsafeMutableBufferPointer { out in
                    // Lanes past the keys repeat the first one's work into outputs nobody reads.
                    let used = keys.count
                    return multiBuffer.publicOperation(
                        keyBits: keyBits,
                        inputs: (0..<lanes).map { UnsafePointer(inputs.baseAddress! + ($0 < used ? $0 : 0) * k) },
                        outputs: (0..<lanes).map { out.baseAddress! + $0 * k },
                        moduli: (0..<lanes).map { n.baseAddress! + ($0 < used ? $0 : 0) * words })
                }
            }
        }
        return keys.indices.map { lane in
            failed.contains(lane) ? nil : EncryptedAESKey(aesKey: aesKeys[lane], encrypted: Array(outputs[(lane * k)..<((lane + 1) * k)]))
        }
    }
}
