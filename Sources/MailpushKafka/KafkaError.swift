/// An error from librdkafka or a broker. `code` is librdkafka's `rd_kafka_resp_err_t`:
/// negative codes are local to the client (names start with `_`), positive ones come from the broker.
public struct KafkaError: Error, CustomStringConvertible, Sendable, Hashable {
    public var code: Int32
    /// librdkafka's symbolic name, e.g. "_TRANSPORT", "NOT_LEADER_FOR_PARTITION".
    public var name: String
    public var message: String
    /// The client instance is unusable after this error and must be recreated.
    public var isFatal: Bool
    /// Retrying the same operation later may succeed.
    public var isRetriable: Bool

    public init(code: Int32, name: String, message: String, isFatal: Bool = false, isRetriable: Bool = false) {
        self.code = code
        self.name = name
        self.message = message
        self.isFatal = isFatal
        self.isRetriable = isRetriable
    }

    /// e.g. "Local: Broker transport failure (_TRANSPORT)"
    public var description: String { "\(message) (\(name))" }
}

extension KafkaError {
    /// Codes the embedding app is likely to branch on (values of `rd_kafka_resp_err_t`).
    public enum Code {
        public static let timedOut: Int32 = -185 // RD_KAFKA_RESP_ERR__TIMED_OUT
        public static let invalidArgument: Int32 = -186 // RD_KAFKA_RESP_ERR__INVALID_ARG
        public static let interrupted: Int32 = -163 // RD_KAFKA_RESP_ERR__INTR (task cancelled)
        public static let destroyed: Int32 = -197 // RD_KAFKA_RESP_ERR__DESTROY (used after close)
        public static let autoOffsetReset: Int32 = -140 // RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET
        /// The application withdrew permission to write (a partition lease ended); RD_KAFKA_RESP_ERR__FENCED.
        public static let leaseExpired: Int32 = -144
        public static let queueFull: Int32 = -184 // RD_KAFKA_RESP_ERR__QUEUE_FULL
    }
}
