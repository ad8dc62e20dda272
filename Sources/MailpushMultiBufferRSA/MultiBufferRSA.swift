#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// RSA public-key operations (e = 65537) eight at a time on one core, through the multi-buffer part of Intel's
/// Cryptography Primitives Library (`libcrypto_mb`, AVX-512 IFMA), loaded when the service starts if it is installed.
///
/// Why: a push job's one RSA operation is most of its CPU. One call here computes eight of them, for up to eight
/// different keys, in the 52-bit lanes of AVX-512's integer multiply-add: on the machine this was written on, 5.8 µs
/// an operation against BoringSSL's 17 µs one at a time (docs/performance.md, session 49). Only the modular
/// exponentiation is done here; the OAEP padding around it is the caller's (`KeyEncryption` in MailpushCore).
///
/// Every call of the library is in this file. It is loaded with `dlopen`, so building and running mailpush never
/// needs it: without it, or on a processor without AVX-512 IFMA, or if its answer to a known-answer test is wrong,
/// `load()` says why and sealing stays with swift-crypto alone.
public final class MultiBufferRSA: Sendable {
    public static let lanes = 8
    /// Key sizes the library has methods for (e = 65537); other keys are sealed one at a time.
    public static let keyBits: Set<Int> = [2048, 3072, 4096]

    /// The library's sonames, its Intel compiler runtime first: loaded by name, they are found as any shared library
    /// is (`LD_LIBRARY_PATH`, or a directory `ldconfig` knows), and `libcrypto_mb`'s own dependencies on them are met
    /// by the copies already loaded.
    public static let runtimeLibraries = ["libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so"]
    public static let library = "libcrypto_mb.so.13"

    private typealias MethodFunction = @convention(c) (Int32) -> OpaquePointer?
    private typealias BufferSizeFunction = @convention(c) (OpaquePointer?) -> Int32
    private typealias PublicFunction =
        @convention(c) (
            UnsafePointer<UnsafePointer<UInt8>?>?, UnsafePointer<UnsafeMutablePointer<UInt8>?>?,
            UnsafePointer<UnsafePointer<UInt64>?>?, Int32, OpaquePointer?, UnsafeMutablePointer<UInt8>?
        ) -> UInt32

    private struct Method: @unchecked Sendable {
        let method: OpaquePointer
        let bufferSize: Int
    }

    private let publicMB8: PublicFunction
    /// By key size in bits. The methods are constant tables inside the library.
    private let methods: [Int: Method]
    /// What was loaded, for the start-up line.
    public let description: String

    public enum LoadError: Error, CustomStringConvertible {
        case notInstalled(String)
        case missingSymbol(String)
        case unsupported(String)

        public var description: String {
            switch self {
            case .notInstalled(let why): return "\(MultiBufferRSA.library) is not installed (\(why))"
            case .missingSymbol(let name): return "\(MultiBufferRSA.library) has no \(name)"
            case .unsupported(let why): return why
            }
        }
    }

    private init(publicMB8: PublicFunction, methods: [Int: Method], description: String) {
        self.publicMB8 = publicMB8
        self.methods = methods
        self.description = description
    }

    /// Loads the library and checks it against a known answer.
    public static func load() -> Result<MultiBufferRSA, LoadError> {
        for runtime in runtimeLibraries where dlopen(runtime, RTLD_NOW | RTLD_GLOBAL) == nil {
            return .failure(.notInstalled(lastError()))
        }
        guard let handle = dlopen(library, RTLD_NOW | RTLD_LOCAL) else { return .failure(.notInstalled(lastError())) }
        func symbol<T>(_ name: String, as type: T.Type) -> T? {
            dlsym(handle, name).map { unsafeBitCast($0, to: type) }
        }
        guard let methodOfSize = symbol("mbx_RSA_pub65537_Method", as: MethodFunction.self) else {
            return .failure(.missingSymbol("mbx_RSA_pub65537_Method"))
        }
        guard let bufferSize = symbol("mbx_RSA_Method_BufSize", as: BufferSizeFunction.self) else {
            return .failure(.missingSymbol("mbx_RSA_Method_BufSize"))
        }
        guard let publicMB8 = symbol("mbx_rsa_public_mb8", as: PublicFunction.self) else {
            return .failure(.missingSymbol("mbx_rsa_public_mb8"))
        }
        var methods: [Int: Method] = [:]
        for bits in keyBits {
            guard let method = methodOfSize(Int32(bits)) else { continue }
            let size = Int(bufferSize(method))
            if size > 0 { methods[bits] = Method(method: method, bufferSize: size) }
        }
        guard methods[2048] != nil else { return .failure(.unsupported("\(library) has no RSA-2048 public-key method")) }
        let loaded = MultiBufferRSA(
            publicMB8: publicMB8, methods: methods, description: "\(library), eight operations a call (AVX-512 IFMA)")
        if let wrong = loaded.knownAnswerFailure() { return .failure(.unsupported(wrong)) }
        return .success(loaded)
    }

    /// Whether keys of this size (with e = 65537) go through here.
    public func supports(keyBits bits: Int) -> Bool { methods[bits] != nil }

    /// `outputs[i] = inputs[i]^65537 mod moduli[i]` for the eight lanes, all of `keyBits` bits: inputs and outputs
    /// big-endian, `keyBits / 8` bytes each; moduli as little-endian 64-bit words, `keyBits / 64` each. Every input
    /// must be below its modulus. Returns the lanes that failed (none, normally).
    public func publicOperation(
        keyBits: Int, inputs: [UnsafePointer<UInt8>], outputs: [UnsafeMutablePointer<UInt8>],
        moduli: [UnsafePointer<UInt64>]
    ) -> Set<Int> {
        precondition(inputs.count == Self.lanes && outputs.count == Self.lanes && moduli.count == Self.lanes)
        guard let method = methods[keyBits] else { return Set(0..<Self.lanes) }
        // `map`, not `as`: an upcast of the arrays to optional pointers casts each element at run time.
        let from = inputs.map { Optional($0) }
        let to = outputs.map { Optional($0) }
        let n = moduli.map { Optional($0) }
        let status = withUnsafeTemporaryAllocation(byteCount: method.bufferSize, alignment: 64) { buffer in
            publicMB8(from, to, n, Int32(keyBits), method.method, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        // Four bits of status a lane; zero is success.
        if status == 0 { return [] }
        return Set((0..<Self.lanes).filter { (status >> (4 * UInt32($0))) & 0xF != 0 })
    }

    /// Nil if the library computes a known RSA-2048 public operation right in every lane, else what went wrong. On a
    /// processor without AVX-512 IFMA the library answers with an error status instead of a result.
    private func knownAnswerFailure() -> String? {
        let modulus = Self.words(bigEndian: Self.bytes(hex: KnownAnswer.modulus))
        let messages = [Self.bytes(hex: KnownAnswer.message1), Self.bytes(hex: KnownAnswer.message2)]
        let expected = [Self.bytes(hex: KnownAnswer.result1), Self.bytes(hex: KnownAnswer.result2)]
        var outputs = [UInt8](repeating: 0, count: Self.lanes * 256)
        let failed = modulus.withUnsafeBufferPointer { n in
            messages[0].withUnsafeBufferPointer { m0 in
                messages[1].withUnsafeBufferPointer { m1 in
                    outputs.withUnsafeMutableBufferPointer { out in
                        publicOperation(
                            keyBits: 2048, inputs: (0..<Self.lanes).map { $0 % 2 == 0 ? m0.baseAddress! : m1.baseAddress! },
                            outputs: (0..<Self.lanes).map { out.baseAddress! + $0 * 256 },
                            moduli: Array(repeating: n.baseAddress!, count: Self.lanes))
                    }
                }
            }
        }
        if !failed.isEmpty {
            return "\(Self.library) refused a known RSA-2048 operation in lanes \(failed.sorted()): this processor may lack AVX-512 IFMA"
        }
        for lane in 0..<Self.lanes where Array(outputs[(lane * 256)..<((lane + 1) * 256)]) != expected[lane % 2] {
            return "\(Self.library) computed a known RSA-2048 operation wrong in lane \(lane)"
        }
        return nil
    }

    /// A big-endian unsigned integer as little-endian 64-bit words, the library's form of a modulus.
    public static func words(bigEndian bytes: some Collection<UInt8>) -> [UInt64] {
        let digits = Array(bytes.drop { $0 == 0 })
        var words = [UInt64](repeating: 0, count: (digits.count + 7) / 8)
        for (index, byte) in digits.reversed().enumerated() {
            words[index / 8] |= UInt64(byte) << (8 * UInt64(index % 8))
        }
        return words
    }

    private static func bytes(hex: String) -> [UInt8] {
        var result: [UInt8] = []
        var iterator = hex.utf8.makeIterator()
        while let high = iterator.next(), let low = iterator.next() {
            result.append(UInt8(hexValue(high) << 4 | hexValue(low)))
        }
        return result
    }

    private static func hexValue(_ character: UInt8) -> UInt8 {
        character <= UInt8(ascii: "9") ? character - UInt8(ascii: "0") : character - UInt8(ascii: "a") + 10
    }

    private static func lastError() -> String {
        dlerror().map { String(cString: $0) } ?? "unknown dlopen error"
    }
}

/// An RSA-2048 modulus (e = 65537) and two messages with their public-key results, computed with Python's `pow`.
private enum KnownAnswer {
    static let modulus =
        "c1248512df5a7b124ec8537ec26541eb3bf6cc623e5948f4080d1e81a2faedbb7354e6c7b80ee1b2910fcad4628b49c48a043a4516a0ad6323c6b224484828387954a2b465d7fedd1214b372bc752b091d8f266cbf6b4a28bc1dd936ed5446e2a545cce926c85ee00cff33ffc9132b3200e4679cfb671ad184648c47991fd89d600dd478c48fe2e6523fea8485a8c66c12b14b1eca902d39beb8861031c1aeacbf0eafc8db1674dcc91730444ff3a3586f73c5d7e3fe7811849eaacb86b00f1ed811f3ba96c038be7d7b3d82557cb7b8357348f9fb5bf2faa1212857da831d3385814ca14ac587c9873b25e10ed9ce24e30e830688a87c0b5e96dac532abd223"
    static let message1 =
        "00ba71fc270cd9d091fa19b8ca5d2ee88275a22c8f1e2026d282d2ef7d515835d9508b7f8792c54753fc451fe79ffbb9b1a0839d045e8c61c102b32199d3f532ea1b269288c839f91aa0c9822e390bff9e92617a8b042a2d41f1ae77d428697d8cdb386b0b9e38261afcdfd0af90aec6d4a0d9063369a73fcb26488e27a3d995eca6acc1e774a1aede85b94eb10affb0659576220a1ae273202b413209111dd842a43587f51b4b61429bbd42c7fe7d1adcfb764fe6f07f44c2065e322ec9532f2d10b9d128a0c31ad3888ebfbefad2915db26e507a7ca849469dc816df22c9a3edcffe5543e8e415ac22e36897bb6958ea04b629fc58c5f0c0ea1d8316bef347"
    static let result1 =
        "70b578af633d63fdcd02a53117f5d7a87fee11ff7df0063601061c6f079c4d48694ad801af3a3e432d803e5bf8967c02319ac703db659681b39e20a9147a4274fda975313c9d8088a3540bbda8f135f87efc09038e05814175e25f0f73db1169822edea2da81eaa974a51f29507e828ad130939126a4b67e656686bf8c69a6d31f27274c139790be2adf73b4bfa5781149dd8c0ba08e8f98ae54484567df9516caab5334807ce1e22106f5f2fac281937226ad48d66a19d80af8d204294d256b17a58436370906b7788e8377425e5b7ac569f64e9996b9d76107b8044f0c5d34b74f6e810d6bc4bc1535c53805d9fa5e6826fb967d87a063db72aa5f1115a5d5"
    static let message2 =
        "00fd7647a536ca226652ddefb51c9a92703bd7fb8fafabc8c5a4c4124ece675326b9d721275fbe880bf412392eb3f29e526d8ee10ae84a956a86de6843b1a8207315622fd6cbb756cc7508f8801d2c9862c4e8891379b57e27d0dd8cfb617356ca0f34b58b440892498ad347dd477220d561ca6eefeda2c014a7607555bb959a00002c46d5c6e618f58e874204711f9a6a61a411d20d1aca51c921c9f3f5899df513ecaf5a2dfcd191b49defb8caae05deab2e2b83095593ee8d1d3960c948014c952ee349cb5f1e2d1b0b1e84baac2d6fbd91d2cd76638ee9252fa79a9aa0a17bfa469950bd2979d8ac56e7a86f61512ae965d8a0eef0b5d4ae1a0a61d5f7e8"
    static let result2 =
        "4e931aba67e75c4d6c7db86e1a3b9aff6a8a3c66d2b67125b33e85e4cf43b8e77486c911edeb79e441b2b8312e71dc3d81496e6a1f0e78f23c6f17fd9ee31d91ba08d13da47d92e282808d18a61811cf80ed717dee000283f41fe493cfac2142b5a8241a9726c4c2b391842c1e0518725dbda7416058e3d99ad51d78ba03fb6bad84c510a66c14cfb6522edfd3104cc9b0d4a076c5ab219a02e8181edc0f223d012b0d901a0752f2c8973572f4d534a6de14e2e7e07398c4ed67fa24fbb847f9c7829bd3f755fb35f5e9eda74e8ab95cce9fb2c90a65e6f76670eabe81a0cd722586d93e6ae69ee92db574168a1867fa524fb1357226b4a3e3ef1b77c85f6935"
}
