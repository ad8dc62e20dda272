import CRdKafka

extension KafkaError {
    /// A librdkafka/broker error code, with librdkafka's own name and text unless `message` overrides the text.
    init(rd code: rd_kafka_resp_err_t, message: String? = nil, isFatal: Bool = false) {
        self.init(code: code.rawValue,
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
        self.init(code: rd_kafka_error_code(error).rawValue,
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
    private static let retriableCodes = Set(([
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
