import Crypto

/// EME-OAEP encoding (RFC 8017, 7.1.1) with an empty label and MGF1 over the same hash: what BoringSSL does inside
/// `RSA-OAEP` encryption before its modular exponentiation, done here when the exponentiation is done eight at a
/// time elsewhere (`MultiBufferRSA`). swift-crypto has no call for the padding alone. Every test that opens such a
/// sealing checks this against BoringSSL's OAEP decoding (`Unsealer`, through swift-crypto).
enum OAEP {
    /// Writes `EM = 0x00 ‖ maskedSeed ‖ maskedDB` for `message` into `encoded` (the modulus's length in bytes), with a
    /// fresh random seed; `labelHash` is the hash of the empty label (`labelHash(_:)`).
    static func encode<H: HashFunction>(
        message: UnsafeRawBufferPointer, labelHash: [UInt8], hash: H.Type, into encoded: UnsafeMutableBufferPointer<UInt8>
    ) {
        let hashLength = H.Digest.byteCount
        precondition(hashLength <= AESKeySource.keyLength && message.count <= encoded.count - 2 * hashLength - 2)
        withUnsafeTemporaryAllocation(byteCount: hashLength, alignment: 8) { seed in
            // As secret as the message it masks: zeroed before the buffer is given back.
            defer { seed.initializeMemory(as: UInt8.self, repeating: 0) }
            AESKeySource.fill(seed)
            encode(message: message, seed: UnsafeRawBufferPointer(seed), labelHash: labelHash, hash: H.self, into: encoded)
        }
    }

    private static func encode<H: HashFunction>(
        message: UnsafeRawBufferPointer, seed: UnsafeRawBufferPointer, labelHash: [UInt8], hash: H.Type,
        into encoded: UnsafeMutableBufferPointer<UInt8>
    ) {
        let hashLength = H.Digest.byteCount
        // DB = lHash ‖ PS ‖ 0x01 ‖ M, in place after the leading zero and the seed.
        let db = UnsafeMutableBufferPointer(rebasing: encoded[(1 + hashLength)...])
        db.update(repeating: 0)
        for index in 0..<hashLength { db[index] = labelHash[index] }
        db[db.count - message.count - 1] = 0x01
        for index in 0..<message.count { db[db.count - message.count + index] = message[index] }
        // maskedDB = DB ⊕ MGF1(seed), maskedSeed = seed ⊕ MGF1(maskedDB).
        mask(db, with: seed, hash: H.self)
        let maskedSeed = UnsafeMutableBufferPointer(rebasing: encoded[1..<(1 + hashLength)])
        for index in 0..<hashLength { maskedSeed[index] = seed[index] }
        mask(maskedSeed, with: UnsafeRawBufferPointer(db), hash: H.self)
        encoded[0] = 0
    }

    /// The hash of the empty label, the start of every data block.
    static func labelHash<H: HashFunction>(_ hash: H.Type) -> [UInt8] {
        Array(H.hash(data: [UInt8]()))
    }

    /// `target ⊕= MGF1(seed, target.count)`.
    private static func mask<H: HashFunction>(_ target: UnsafeMutableBufferPointer<UInt8>, with seed: UnsafeRawBufferPointer, hash: H.Type)
    {
        withUnsafeTemporaryAllocation(byteCount: seed.count + 4, alignment: 8) { input in
            input.copyMemory(from: seed)
            var done = 0
            var counter: UInt32 = 0
            while done < target.count {
                input.storeBytes(of: counter.bigEndian, toByteOffset: seed.count, as: UInt32.self)
                H.hash(data: UnsafeRawBufferPointer(input)).withUnsafeBytes { block in
                    let count = min(block.count, target.count - done)
                    for index in 0..<count { target[done + index] ^= block[index] }
                    done += count
                }
                counter += 1
            }
        }
    }
}
