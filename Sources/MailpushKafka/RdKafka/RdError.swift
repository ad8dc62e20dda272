import CRdKafka

extension KafkaError {
    /// A librdkafka/broker error code, with librdkafka's own name and text unless `message` overrides the text.
    init(rd code: rd_kafka_resp_err_t, message: String? = nil, isFatal: Bool = false) {
        self.init(
            code: code.rawValue,
            name: String(cString: rd_kafka_err2name(code)),
            message: message ?? String(cString: rd_kafka_err2str(code)),
            isFatal: isFatal || code == RD_KAFKA_RESP_ERR__FATAL,
            isRetriable: Self.retriableCodes.contains(code.rawValue))
    }

    init(rdCode code: Int32, message: String? = nil) {
        self.init(rd: rd_kafka_resp_err_t(rawValue: code), message: message)
    }

    /// Takes ownership of (and destroys) an `rd_kafka_error_t`, which carries its own fatal/retriable flags.
    init(consuming error: OpaquePointer) {
        defer { rd_kafka_error_destroy(error) }
        self.init(
            code: rd_kafka_error_code(error).rawValue,
            name: String(cString: rd_kafka_error_name(error)),
            message: String(cString: rd_kafka_error_string(error)),
            isFatal: rd_kafka_error_is_fatal(error) != 0,
            isRetriable: rd_kafka_error_is_retriable(error) != 0)
    }

    static func invalidArgument(_ message: String) -> KafkaError {
        KafkaError(rd: RD_KAFKA_RESP_ERR__INVALID_ARG, message: message)
    }

    static func timedOut(_ message: String) -> KafkaError {
        KafkaError(rd: RD_KAFKA_RESP_ERR__TIMED_OUT, message: message)
    }

    /// Plain error codes carry no retriable flag; these are the ones where waiting and retrying
    /// is the right reaction (transport trouble, leadership moving, timeouts).
    private static let retriableCodes = Set(
        ([
            RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR__TIMED_OUT,
            RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__RESOLVE,
            RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE, RD_KAFKA_RESP_ERR__WAIT_COORD, RD_KAFKA_RESP_ERR__INTR,
            RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS,
            RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR, RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH,
            RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH, RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_PREFERRED_LEADER_NOT_AVAILABLE,
        ] as [rd_kafka_resp_err_t]).map(\.rawValue))
}

extension KafkaError {
    /// The cluster refuses this client (authorization or authentication): trying again cannot help until an
    /// operator grants access or fixes the credentials.
    public var isAccessDenied: Bool { Self.accessDeniedCodes.contains(code) }

    private static let accessDeniedCodes: Set<Int32> = Set(
        ([
            RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED,
            RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED, RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTHORIZATION_FAILED,
            RD_KAFKA_RESP_ERR__AUTHENTICATION,
        ] as [rd_kafka_resp_err_t]).map(\.rawValue))

    /// The broker (or the producer itself) refuses this record for what it is, so producing it again can
    /// only fail again: too large, malformed, or written to a topic this client may not write. Timeouts,
    /// transport trouble, leadership moves and missing replicas are not: they pass.
    public var isPermanentForRecord: Bool { Self.permanentRecordCodes[code] != nil }

    /// A short phrase a person can act on, e.g. "message too large"; librdkafka's text for other codes.
    public var recordRejection: String { Self.permanentRecordCodes[code] ?? message }

    private static let permanentRecordCodes: [Int32: String] = Dictionary(
        uniqueKeysWithValues: ([
            (RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, "message too large"),
            (RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, "record batch too large"),
            (RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE, "invalid message size"),
            (RD_KAFKA_RESP_ERR_INVALID_MSG, "invalid message (CRC or format)"),
            (RD_KAFKA_RESP_ERR_INVALID_RECORD, "invalid record"),
            (RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP, "invalid timestamp"),
            (RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, "unsupported for the topic's message format"),
            (RD_KAFKA_RESP_ERR_POLICY_VIOLATION, "topic policy violation"),
            (RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, "invalid topic"),
            (RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, "not authorized to write the topic"),
            (RD_KAFKA_RESP_ERR__BAD_MSG, "malformed message"),
        ] as [(rd_kafka_resp_err_t, String)]).map { ($0.0.rawValue, $0.1) })
}
