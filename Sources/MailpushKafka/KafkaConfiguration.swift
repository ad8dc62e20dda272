/// syslog(3) severities, as librdkafka reports them.
public enum KafkaLogLevel: Int32, Sendable, Comparable {
    case emergency = 0
    case alert, critical, error, warning, notice, info, debug

    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// Receives librdkafka log lines, from librdkafka's internal threads: must be thread-safe and quick.
public typealias KafkaLogHandler = @Sendable (_ level: KafkaLogLevel, _ facility: String, _ message: String) -> Void
/// Receives client-level error events (broker down, all brokers down, fatal errors, consumer errors
/// that `poll` does not throw). Called from whichever thread serves the client's queue.
public typealias KafkaErrorHandler = @Sendable (KafkaError) -> Void

/// Typed configuration plus passthrough of arbitrary librdkafka properties (like `kcat -X`).
///
/// Each client applies its role defaults first (see `KafkaProducer`, `KafkaConsumer`, `KafkaCluster`),
/// then `bootstrap.servers` and `client.id`, then `properties`, so passthrough always wins.
/// An unknown or invalid property makes the client initializer throw an error naming key and value.
public struct KafkaConfiguration: Sendable {
    public var bootstrapServers: String
    public var clientId: String = "mailpush"
    /// librdkafka properties, applied last.
    public var properties: [String: String] = [:]
    /// nil (default) drops librdkafka's log lines instead of printing them to stderr.
    public var logHandler: KafkaLogHandler?
    /// nil (default) ignores error events (the API calls still return or throw their own errors).
    public var errorHandler: KafkaErrorHandler?

    public init(bootstrapServers: String, properties: [String: String] = [:]) {
        self.bootstrapServers = bootstrapServers
        self.properties = properties
    }
}

extension Duration {
    /// Milliseconds for librdkafka's `int timeout_ms` arguments: rounded up so a tiny positive
    /// timeout still waits, clamped to [0, Int32.max].
    var clampedMilliseconds: Int32 {
        let (seconds, attoseconds) = components
        if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
        let ms = seconds.multipliedReportingOverflow(by: 1000)
        if ms.overflow || ms.partialValue >= Int64(Int32.max) { return Int32.max }
        let fraction = (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(min(ms.partialValue + fraction, Int64(Int32.max)))
    }
}
