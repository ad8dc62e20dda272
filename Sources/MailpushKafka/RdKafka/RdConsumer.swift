import CRdKafka
import MailpushPartition

/// Typed wrapper over librdkafka's consumer calls. `consume` blocks: call it from a thread that may block.
///
/// `@unchecked Sendable`: `queue` is a librdkafka queue handle, thread-safe like the client it belongs to;
/// it is destroyed in `deinit`, after every other use.
final class RdConsumer: @unchecked Sendable {
    let client: RdClient
    private let queue: OpaquePointer

    /// librdkafka 2.0.2 only allows `rd_kafka_assign` on a consumer with a `group.id` (without one, assign
    /// returns _UNKNOWN_GROUP). The group is never joined (no subscribe) and nothing is ever committed,
    /// so a fixed id is harmless; it only makes librdkafka look up the group coordinator.
    static let defaults: KeyValuePairs<String, String> = [
        "group.id": "mailpush-assign-only",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "enable.partition.eof": "false",
        // A start offset outside the log must surface (we would otherwise silently skip or re-read data).
        "auto.offset.reset": "error",
    ]

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        client = try RdClient(
            role: .consumer, configuration: Self.boundingFetches(configuration), defaults: Self.defaults,
            servePollQueue: false)
        // Route error events and other callbacks to the consumer queue, so `consume` serves them.
        rd_kafka_poll_set_consumer(client.rk)
        queue = rd_kafka_queue_get_consumer(client.rk)
    }

    deinit {
        rd_kafka_queue_destroy(queue)
    }

    /// `configuration` with `fetch.max.bytes` at 8 MiB (or `message.max.bytes`, if larger: librdkafka refuses less)
    /// unless it is set. A fetch response lands on top of librdkafka's prefetch queue (64 MB), one per broker, and
    /// librdkafka's 50 MB let a backlog of records near the broker's 1 MB limit take over 200 MB before the application
    /// had taken one. 8 MiB is still thousands of ordinary records per request.
    static func boundingFetches(_ configuration: KafkaConfiguration) -> KafkaConfiguration {
        guard configuration.properties["fetch.max.bytes"] == nil else { return configuration }
        var bounded = configuration
        let largestRecord = configuration.properties["message.max.bytes"].flatMap { Int($0) } ?? 0
        bounded.properties["fetch.max.bytes"] = String(max(8 << 20, largestRecord))
        return bounded
    }

    /// How long `assign` waits for a new topic's metadata before leaving it to librdkafka's topic scan.
    static let learnTopicTimeoutMs: Int32 = 1_000

    /// Replaces the assignment; asks for the metadata of topics new to this consumer first
    /// (`RdClient.learnTopics`), so that fetching starts at once.
    func assign(_ assignments: [TopicPartition: StartOffset]) throws(KafkaError) {
        var entries: [(TopicPartition, Int64)] = []
        for (tp, start) in assignments.sorted(by: { ($0.key.topic, $0.key.partition) < ($1.key.topic, $1.key.partition) }) {
            switch start {
            case .beginning: entries.append((tp, RdOffset.beginning))
            case .end: entries.append((tp, RdOffset.end))
            case .offset(let offset):
                guard offset >= 0 else { throw .invalidArgument("invalid start offset \(offset) for \(tp)") }
                entries.append((tp, offset))
            }
        }
        client.learnTopics(Set(assignments.keys.map(\.topic)), timeoutMs: Self.learnTopicTimeoutMs)
        let code = withPartitionList(entries) { rd_kafka_assign(client.rk, $0) }
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(rd: code) }
    }

    struct Batch {
        var records: [KafkaRecord] = []
        /// Errors to report and carry on (transport trouble, unknown topic while it is being created…).
        var reported: [KafkaError] = []
        /// An error the caller must see: fatal, or a partition that stopped fetching.
        var failure: KafkaError?
        /// The records' keys and values.
        var bytes = 0
    }

    /// Waits up to `timeoutMs` for the first record, then takes whatever else is already fetched, up to
    /// `maxRecords`, stopping once the keys and values taken reach `maxBytes` (at most `consumeStep` records
    /// past it). (`rd_kafka_consume_batch_queue` alone would wait until the batch is full.)
    func consume(maxRecords: Int, maxBytes: Int, timeoutMs: Int32) -> Batch {
        var batch = Batch()
        let deadline = ContinuousClock.now + .milliseconds(timeoutMs)
        while batch.records.isEmpty && batch.failure == nil {
            let remaining = (deadline - ContinuousClock.now).clampedMilliseconds
            guard let message = rd_kafka_consume_queue(queue, remaining) else { break } // timeout or wake()
            take(message, into: &batch)
            if remaining == 0 { break }
        }
        guard !batch.records.isEmpty else { return batch }
        // In steps, so that what is left stays in librdkafka's queue, which bounds its own prefetch.
        var messages = [UnsafeMutablePointer<rd_kafka_message_t>?](repeating: nil, count: min(Self.consumeStep, maxRecords))
        while batch.records.count < maxRecords, batch.bytes < maxBytes {
            let count = rd_kafka_consume_batch_queue(queue, 0, &messages, min(messages.count, maxRecords - batch.records.count))
            guard count > 0 else { break }
            for message in messages.prefix(count) { take(message!, into: &batch) }
        }
        return batch
    }

    static let consumeStep = 16

    /// The offset after the last record handed to the application, per partition; a partition nothing was
    /// consumed from yet (or that is not assigned) is left out.
    func positions(_ partitions: [TopicPartition]) -> [TopicPartition: Int64] {
        guard !partitions.isEmpty else { return [:] }
        return withPartitionList(partitions.map { ($0, RdOffset.invalid) }) { list in
            guard rd_kafka_position(client.rk, list) == RD_KAFKA_RESP_ERR_NO_ERROR else { return [:] }
            var positions: [TopicPartition: Int64] = [:]
            for (tp, offset, error) in partitionEntries(list) where error == RD_KAFKA_RESP_ERR_NO_ERROR && offset >= 0 {
                positions[tp] = offset
            }
            return positions
        }
    }

    /// Makes a blocked `consume` return early.
    func wake() { rd_kafka_queue_yield(queue) }

    /// Leaves the (never joined) group and stops fetching. The handle stays valid until deinit.
    func close() { _ = rd_kafka_consumer_close(client.rk) }

    private func take(_ message: UnsafeMutablePointer<rd_kafka_message_t>, into batch: inout Batch) {
        defer { rd_kafka_message_destroy(message) }
        let m = message.pointee
        let topic = m.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? ""
        guard m.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            let error = KafkaError(rd: m.err, message: "\(topic)[\(m.partition)]: \(String(cString: rd_kafka_message_errstr(message)))")
            switch m.err {
            case RD_KAFKA_RESP_ERR__PARTITION_EOF: break
            case RD_KAFKA_RESP_ERR__FATAL: batch.failure = client.fatalError() ?? error
            case RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET: batch.failure = error // librdkafka stopped this partition
            default: batch.reported.append(error)
            }
            return
        }
        batch.bytes += m.key_len + m.len
        var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let timestamp = rd_kafka_message_timestamp(message, &timestampType)
        batch.records.append(
            KafkaRecord(
                topic: topic, partition: m.partition, offset: m.offset,
                key: m.key.map { Array(UnsafeRawBufferPointer(start: $0, count: m.key_len)) },
                value: m.payload.map { Array(UnsafeRawBufferPointer(start: $0, count: m.len)) },
                headers: headers(of: message),
                timestampMs: timestampType == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE ? nil : timestamp))
    }

    private func headers(of message: UnsafeMutablePointer<rd_kafka_message_t>) -> [KafkaHeader] {
        var list: OpaquePointer?
        guard rd_kafka_message_headers(message, &list) == RD_KAFKA_RESP_ERR_NO_ERROR, let list else { return [] }
        var headers: [KafkaHeader] = []
        var name: UnsafePointer<CChar>?
        var value: UnsafeRawPointer?
        var size = 0
        while rd_kafka_header_get_all(list, headers.count, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
            headers.append(
                KafkaHeader(
                    key: name.map { String(cString: $0) } ?? "",
                    value: value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) }))
        }
        return headers
    }
}
