import Crypto
import _CryptoExtras

/// AES-256-CBC encryption with PKCS#7 padding and the all-zero IV of CONTRACT §6.
///
/// Why not `AES._CBC.encrypt`: in swift-crypto 3.12 it runs the AES key schedule again for
/// every 16-byte block, through unspecialized generic code; profiled on a typical 418-byte
/// notification it cost more than the RSA-OAEP encryption itself, dominating the cost of a
/// push job.
///
/// Instead this computes the very same ciphertext with one call to swift-crypto's AES-CFB
/// (one key schedule, BoringSSL's loop). CBC with blocks P₁…Pₙ and IV 0 is
/// Xᵢ = Pᵢ ⊕ Cᵢ₋₁ (X₁ = P₁), Cᵢ = E(Xᵢ). CFB with IV Y₀ and input blocks Q₁…Qₙ is
/// Yⱼ = Qⱼ ⊕ E(Yⱼ₋₁). Taking Y₀ = P₁ and Q = P₂ ‖ … ‖ Pₙ ‖ 0¹⁶ gives, by induction,
/// Yⱼ₋₁ = Xⱼ, hence Cⱼ = E(Yⱼ₋₁) = Yⱼ ⊕ Qⱼ: the CBC ciphertext is CFB(Q) ⊕ Q.
///
/// Decryption (`Unsealer`) uses swift-crypto's own `AES._CBC.decrypt`, so every round-trip
/// test checks this construction against an independent CBC implementation.
enum AESCBC {
    static let blockSize = 16

    /// Appends `AES-CBC(key, IV = 0, PKCS7(plaintext))` to `out`.
    static func appendEncrypted(_ plaintext: [UInt8], key: SymmetricKey, to out: inout [UInt8]) throws {
        let padded = (plaintext.count / blockSize + 1) * blockSize
        // PKCS#7: 1–16 bytes, each holding the pad length.
        let padByte = UInt8(padded - plaintext.count)
        var blocks = plaintext
        blocks.append(contentsOf: repeatElement(padByte, count: padded - plaintext.count))

        // Q = P₂ ‖ … ‖ Pₙ ‖ 0¹⁶, IV = P₁.
        let iv = try AES._CFB.IV(ivBytes: blocks[0..<blockSize])
        blocks.removeFirst(blockSize)
        blocks.append(contentsOf: repeatElement(0, count: blockSize))
        let keystreamXorQ = try AES._CFB.encrypt(blocks, using: key, iv: iv)

        let start = out.count
        out.append(contentsOf: keystreamXorQ)
        out.withUnsafeMutableBufferPointer { o in
            blocks.withUnsafeBufferPointer { q in
                for i in 0..<padded { o[start + i] ^= q[i] }
            }
        }
    }
}
