import CRdKafka

/// A librdkafka version as librdkafka encodes it: `0xMMmmrrpp` (major, minor, revision, pre-release;
/// `pp == 0xff` for a final release).
public struct LibrdkafkaVersion: Sendable, Equatable, CustomStringConvertible {
    public let encoded: UInt32

    public init(encoded: UInt32) { self.encoded = encoded }

    public var major: Int { Int(encoded >> 24 & 0xff) }
    public var minor: Int { Int(encoded >> 16 & 0xff) }
    public var revision: Int { Int(encoded >> 8 & 0xff) }

    public var description: String { "\(major).\(minor).\(revision)" }

    /// The library this process actually loaded (the shared object can differ from the headers).
    public static var runtime: LibrdkafkaVersion { LibrdkafkaVersion(encoded: UInt32(bitPattern: rd_kafka_version())) }

    /// librdkafka's own spelling of the loaded version, e.g. `2.0.2`.
    public static var runtimeString: String { String(cString: rd_kafka_version_str()) }

    /// The headers this binary was compiled against: its calls and constants assume at least this library.
    public static let headers = LibrdkafkaVersion(encoded: UInt32(RD_KAFKA_VERSION))

    /// Whether a loaded library can serve a binary built against `headers`: anything from that
    /// major.minor.revision on. The pre-release byte is ignored so a distribution's build of the same
    /// release is not refused.
    public static func runtime(_ runtime: LibrdkafkaVersion, satisfies headers: LibrdkafkaVersion) -> Bool {
        (runtime.major, runtime.minor, runtime.revision) >= (headers.major, headers.minor, headers.revision)
    }
}
