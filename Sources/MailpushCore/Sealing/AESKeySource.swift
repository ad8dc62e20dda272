import Crypto
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Fresh AES keys from the system's CSPRNG, read 4 KiB at a time.
///
/// Why: `SymmetricKey(size:)` asks the kernel for its bytes eight at a time, a system call each, which
/// profiled at about a tenth of a push job's CPU. Reading 128 keys' worth at once costs one call. Every
/// key is handed out once and its bytes are zeroed in the buffer as they are taken: the CBC IV of the
/// contract is fixed, so an AES key must never be used twice.
enum AESKeySource {
    private static let pool = Mutex(Pool())
    static let keyLength = 32

    /// A new random 256-bit key.
    static func next() -> SymmetricKey {
        var bytes = pool.withLock { $0.nextBytes() }
        defer { withUnsafeMutableBytes(of: &bytes) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        return withUnsafeBytes(of: &bytes) { SymmetricKey(data: $0) }
    }

    /// Fills `buffer` (at most 32 bytes) with fresh random bytes from the same pool: an OAEP seed.
    static func fill(_ buffer: UnsafeMutableRawBufferPointer) {
        precondition(buffer.count <= keyLength)
        var bytes = pool.withLock { $0.nextBytes() }
        withUnsafeBytes(of: &bytes) { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[0..<buffer.count])) }
        withUnsafeMutableBytes(of: &bytes) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) }
    }

    private struct Pool: ~Copyable {
        private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16)
        private var position = 4096

        /// The next 32 bytes, zeroed in the pool as they are taken.
        mutating func nextBytes() -> SIMD32<UInt8> {
            if position + AESKeySource.keyLength > buffer.count {
                Self.fillRandom(buffer)
                position = 0
            }
            let taken = UnsafeMutableRawBufferPointer(rebasing: buffer[position..<position + AESKeySource.keyLength])
            defer {
                taken.initializeMemory(as: UInt8.self, repeating: 0)
                position += AESKeySource.keyLength
            }
            return taken.loadUnaligned(as: SIMD32<UInt8>.self)
        }

        /// glibc 2.36 and Darwin: a whole request from the kernel's CSPRNG (glibc aborts the process if it
        /// cannot get randomness, rather than return guessable bytes).
        private static func fillRandom(_ buffer: UnsafeMutableRawBufferPointer) {
            arc4random_buf(buffer.baseAddress!, buffer.count)
        }

        deinit { buffer.deallocate() }
    }
}
