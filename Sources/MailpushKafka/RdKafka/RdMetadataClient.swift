import CRdKafka
import Dispatch
import MailpushPartition
import Synchronization

/// Typed wrapper over librdkafka's metadata and ListOffsets calls, on a producer-type handle that never
/// produces (lighter than a consumer: no group machinery). All methods block up to their timeout.
final class RdMetadataClient: Sendable {
    let client: RdClient

    /// Queries about a missing topic must not create it (on brokers that honour the flag: see `partitionCount`).
    static let defaults: KeyValuePairs<String, String> = ["allow.auto.create.topics": "false"]

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        client = try RdClient(
            role: .producer, configuration: configuration, defaults: Self.defaults,
            servePollQueue: true)
    }

    /// Partition count of `topic`, nil if the cluster has no such topic.
    ///
    /// Asks for all topics rather than this one: a Metadata request that names a topic may create it.
    /// `allow.auto.create.topics=false` prevents that only from Metadata v4 on, and librdkafka 2.0.2's mock
    /// cluster speaks at most v2, so it auto-creates every topic named in a metadata request.
    func partitionCount(topic: String, timeoutMs: Int32) throws(KafkaError) -> Int? {
        var metadata: UnsafePointer<rd_kafka_metadata_t>?
        let code = rd_kafka_metadata(client.rk, 1, nil, &metadata, timeoutMs)
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else { throw KafkaError(rd: code) }
        defer { rd_kafka_metadata_destroy(metadata) }
        let topics = UnsafeBufferPointer(start: metadata.pointee.topics, count: Int(metadata.pointee.topic_cnt))
        guard let t = topics.first(where: { String(cString: $0.topic) == topic }) else { return nil }
        switch t.err {
        case RD_KAFKA_RESP_ERR_NO_ERROR: return Int(t.partition_cnt)
        case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART: return nil
        default: throw KafkaError(rd: t.err, message: "metadata for \(topic): \(String(cString: rd_kafka_err2str(t.err)))")
        }
    }

    /// One metadata round trip to any broker; throws if none answers within the timeout.
    func brokerMetadata(timeoutMs: Int32) throws(KafkaError) {
        var metadata: UnsafePointer<rd_kafka_metadata_t>?
        // all_topics=0 without a topic asks only for locally known topics: a cheap request.
        let code = rd_kafka_metadata(client.rk, 0, nil, &metadata, timeoutMs)
        if let metadata { rd_kafka_metadata_destroy(metadata) }
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(rd: code) }
    }

    /// The ids of the cluster's brokers, from one metadata round trip (which also refreshes the cached
    /// controller id).
    func brokerIds(timeoutMs: Int32) throws(KafkaError) -> Set<Int32> {
        var metadata: UnsafePointer<rd_kafka_metadata_t>?
        let code = rd_kafka_metadata(client.rk, 0, nil, &metadata, timeoutMs)
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else { throw KafkaError(rd: code) }
        defer { rd_kafka_metadata_destroy(metadata) }
        return Set(UnsafeBufferPointer(start: metadata.pointee.brokers, count: Int(metadata.pointee.broker_cnt)).map(\.id))
    }

    /// ListOffsets for each partition with the given query: a timestamp in ms, or `RdOffset.end` /
    /// `RdOffset.beginning`. An offset of -1 in the result means "no record at or after that timestamp".
    ///
    /// Asked `partitionsPerCall` partitions a call, the calls at once: librdkafka 2.0.2 matches every answered
    /// partition against the whole list it was given, one by one (a `strcmp` of the topic each time, in
    /// `rd_kafka_offsets_for_times`), so one call for n partitions costs about n² comparisons, on the calling thread.
    /// The service asks for every config partition's end before each batch, and the batch waits for the answer.
    func listOffsets(_ queries: [(TopicPartition, Int64)], timeoutMs: Int32) throws(KafkaError) -> [TopicPartition: Int64] {
        guard queries.count > Self.partitionsPerCall else { return try listOffsetsInOneCall(queries, timeoutMs: timeoutMs) }
        let sorted = queries.sorted { ($0.0.topic, $0.0.partition) < ($1.0.topic, $1.0.partition) }
        let calls = stride(from: 0, to: sorted.count, by: Self.partitionsPerCall).map {
            Array(sorted[$0..<min($0 + Self.partitionsPerCall, sorted.count)])
        }
        let answers = Mutex([Result<[TopicPartition: Int64], KafkaError>?](repeating: nil, count: calls.count))
        DispatchQueue.concurrentPerform(iterations: calls.count) { index in
            let answer = Result { () throws(KafkaError) in try listOffsetsInOneCall(calls[index], timeoutMs: timeoutMs) }
            answers.withLock { $0[index] = answer }
        }
        var offsets: [TopicPartition: Int64] = [:]
        for answer in answers.withLock({ $0 }) {
            guard let answer else { continue }
            offsets.merge(try answer.get()) { _, new in new }
        }
        return offsets
    }

    /// How many partitions one `rd_kafka_offsets_for_times` call asks for (`listOffsets`). Each call is a request of
    /// its own to every leader: with 64 partitions a topic (128 config partitions) two calls of 64 cost the service
    /// 1.6% more CPU per job than one; with 256 a topic, four calls of 128 instead of one brought the steady p50
    /// under a light load from 28.6 to 23.2 ms (docs/performance.md, session 55).
    static let partitionsPerCall = 128

    /// `listOffsets` in one call; librdkafka sends one request per partition leader.
    private func listOffsetsInOneCall(_ queries: [(TopicPartition, Int64)], timeoutMs: Int32) throws(KafkaError) -> [TopicPartition: Int64]
    {
        if queries.isEmpty { return [:] }
        let result: Result<[TopicPartition: Int64], KafkaError> = withPartitionList(queries) { list in
            let code = rd_kafka_offsets_for_times(client.rk, list, timeoutMs)
            guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { return .failure(KafkaError(rd: code)) }
            var offsets: [TopicPartition: Int64] = [:]
            for (tp, offset, error) in partitionEntries(list) {
                guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
                    return .failure(KafkaError(rd: error, message: "ListOffsets \(tp): \(String(cString: rd_kafka_err2str(error)))"))
                }
                offsets[tp] = offset
            }
            return .success(offsets)
        }
        return try result.get()
    }

    /// The cluster id from the broker's metadata; nil if unknown within the timeout.
    func clusterId(timeoutMs: Int32) -> String? {
        guard let id = rd_kafka_clusterid(client.rk, timeoutMs) else { return nil }
        defer { rd_kafka_mem_free(client.rk, id) }
        return String(cString: id)
    }
}
