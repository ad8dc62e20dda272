import MailpushPartition

/// A Kafka record header. Keys may repeat; order is preserved end to end.
/// `value == nil` is a null header value, distinct from an empty one.
public struct KafkaHeader: Sendable, Hashable {
    public var key: String
    public var value: [UInt8]?

    public init(key: String, value: [UInt8]?) {
        self.key = key
        self.value = value
    }
}

/// A record as read from a partition.
public struct KafkaRecord: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    public var value: [UInt8]?
    public var headers: [KafkaHeader]
    /// The record timestamp (producer create time on our topics); nil if the record has none.
    public var timestampMs: Int64?

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8]?,
        headers: [KafkaHeader], timestampMs: Int64?
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestampMs = timestampMs
    }
}

extension KafkaRecord {
    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }
}

/// A record to produce. The partition is chosen by librdkafka's default partitioner from the key
/// (records without a key are spread over partitions).
public struct OutgoingRecord: Sendable, Hashable {
    public var topic: String
    public var key: [UInt8]?
    public var value: [UInt8]?
    public var headers: [KafkaHeader]
    /// Create time to stamp on the record; nil means "now" (librdkafka's clock at enqueue).
    public var timestampMs: Int64?
    /// The partition to write to; nil lets the partitioner choose from the key.
    public var partition: Int32?

    public init(
        topic: String, key: [UInt8]?, value: [UInt8]?, headers: [KafkaHeader] = [],
        timestampMs: Int64? = nil, partition: Int32? = nil
    ) {
        self.partition = partition
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.timestampMs = timestampMs
    }
}

/// Outcome of one produced record, in the same position as its `OutgoingRecord`.
public struct DeliveryResult: Sendable, Hashable {
    /// -1 if the record never reached a partition.
    public var partition: Int32
    /// The offset the broker assigned; -1 on error.
    public var offset: Int64
    public var error: KafkaError?
    /// A failed record that is certainly not in the log: it never left the producer (refused when enqueued, or timed
    /// out or purged in librdkafka's own queue), or the broker refused it in a way that says so. Producing it again
    /// cannot duplicate it. False for a record that may have landed (it was sent and no acknowledgement came).
    public var notWritten: Bool

    public init(partition: Int32, offset: Int64, error: KafkaError?, notWritten: Bool = false) {
        self.partition = partition
        self.offset = offset
        self.error = error
        self.notWritten = notWritten
    }

    /// The result of a record librdkafka refused to enqueue: it never left the producer.
    static func refusedWhenEnqueued(_ error: KafkaError) -> DeliveryResult {
        DeliveryResult(partition: -1, offset: -1, error: error, notWritten: true)
    }
}

public enum StartOffset: Sendable, Hashable {
    case offset(Int64)
    case beginning
    case end
}

/// Kafka protocol API keys, for `MockKafkaCluster.pushRequestErrors` (the ones tests fail on purpose).
public enum KafkaApiKey {
    public static let produce: Int16 = 0
    public static let fetch: Int16 = 1
}
