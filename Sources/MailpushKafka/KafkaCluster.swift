import Dispatch
import MailpushPartition

/// Cluster metadata and offsets, through a lightweight client handle that never produces.
///
/// `partitionCount` never creates a topic. The offset queries name their topics in metadata requests with
/// `allow.auto.create.topics=false`, which real brokers honour but librdkafka 2.0.2's mock ignores (there,
/// asking for offsets of a missing topic creates it with 4 partitions).
public final class KafkaCluster: Sendable {
    let admin: RdMetadataClient
    private let configuration: KafkaConfiguration
    /// Runs the blocking metadata/ListOffsets calls off Swift's cooperative pool, side by side: one caller's
    /// request (a fleet's lease renewal, a takeover) must not hold up another's (the batch loop's config
    /// catch-up, on the path every event waits on). librdkafka's calls are thread-safe.
    let worker = DispatchQueue(label: "mailpush.kafka.cluster", attributes: .concurrent)

    public init(configuration: KafkaConfiguration) throws(KafkaError) {
        admin = try RdMetadataClient(configuration: configuration)
        self.configuration = configuration
    }

    /// nil if the topic does not exist.
    public func partitionCount(topic: String, timeout: Duration) async throws(KafkaError) -> Int? {
        let admin = self.admin
        return try await worker.run { () throws(KafkaError) in
            try admin.partitionCount(topic: topic, timeoutMs: timeout.clampedMilliseconds)
        }
    }

    /// High watermarks (the offset the next record will get), fresh from the partition leaders, one
    /// ListOffsets request per leader.
    public func endOffsets(_ partitions: [TopicPartition], timeout: Duration) async throws(KafkaError) -> [TopicPartition: Int64] {
        try await listOffsets(Set(partitions).map { ($0, RdOffset.end) }, timeout: timeout)
    }

    /// `endOffsets`, asked now on a thread of its own and awaited later (`Answer.value`). `whenAnswered` is given
    /// the answer on that thread: a caller about to keep every cooperative thread busy (sealing) still gets its
    /// request sent and learns the answer when it comes, not when a thread is free again.
    public func startEndOffsets(
        _ partitions: [TopicPartition], timeout: Duration, whenAnswered: @escaping @Sendable ([TopicPartition: Int64]) -> Void
    ) -> Answer<[TopicPartition: Int64]> {
        let admin = self.admin
        let queries = Set(partitions).map { ($0, RdOffset.end) }
        return worker.start { () throws(KafkaError) in
            let offsets = try admin.listOffsets(queries, timeoutMs: timeout.clampedMilliseconds)
            whenAnswered(offsets)
            return offsets
        }
    }

    /// Log start offsets, like `endOffsets`.
    public func beginningOffsets(_ partitions: [TopicPartition], timeout: Duration) async throws(KafkaError) -> [TopicPartition: Int64] {
        try await listOffsets(Set(partitions).map { ($0, RdOffset.beginning) }, timeout: timeout)
    }

    /// For each partition, the first offset whose record timestamp is >= `ts`, or the end offset if there is none.
    ///
    /// Real brokers answer this with ListOffsets by timestamp. librdkafka 2.0.2's mock cluster does not
    /// implement that (its ListOffsets handler answers -1 for every timestamp query: see
    /// `rd_kafka_mock_handle_ListOffsets`, "FIXME: by timestamp"), so against a mock cluster (recognised by
    /// its cluster id, "mockCluster…") the answer is found by reading each partition from its start up to
    /// its current end and taking the first record with timestamp >= `ts`. That scan is exact even when
    /// timestamps are not monotonic, and cheap enough for the bounded logs of a development broker.
    public func offsets(forTimestampMs ts: Int64, _ partitions: [TopicPartition], timeout: Duration) async throws(KafkaError)
        -> [TopicPartition: Int64]
    {
        guard ts >= 0 else { throw .invalidArgument("timestamp must be >= 0, got \(ts)") }
        let deadline = ContinuousClock.now + timeout
        let partitions = Array(Set(partitions))
        if partitions.isEmpty { return [:] }
        if await isDevelopmentBroker(timeout: timeout) {
            return try await scanOffsets(forTimestampMs: ts, partitions, deadline: deadline)
        }

        var offsets = try await listOffsets(partitions.map { ($0, ts) }, timeout: deadline.remaining)
        let none = offsets.filter { $0.value < 0 }.map(\.key)
        if !none.isEmpty {
            try await offsets.merge(endOffsets(none, timeout: deadline.remaining)) { $1 }
        }
        return offsets
    }

    /// Whether the cluster is librdkafka's mock cluster (`mailpush devbroker`), recognised by its cluster id
    /// ("mockCluster…"). false if the cluster id is not known within `timeout`.
    public func isDevelopmentBroker(timeout: Duration) async -> Bool {
        let admin = self.admin
        return await worker.run { admin.clusterId(timeoutMs: timeout.clampedMilliseconds)?.hasPrefix("mockCluster") == true }
    }

    /// Returns once a broker answers a metadata request; throws the last error if none does within `timeout`.
    /// Each try waits at most a second, so that `stopWaiting` (a shutdown asked for meanwhile) or a cancellation
    /// ends the wait within about a second, with the last try's error: one try of the whole timeout could not be
    /// interrupted, and a SIGTERM while the broker was unreachable ended in a crash once the grace period was over.
    public func waitUntilReachable(
        timeout: Duration, stopWaiting: @escaping @Sendable () -> Bool = { false }
    ) async throws(KafkaError) {
        let deadline = ContinuousClock.now + timeout
        let admin = self.admin
        while true {
            do {
                let slice = min(deadline.remaining, .seconds(1))
                return try await worker.run { () throws(KafkaError) in
                    try admin.brokerMetadata(timeoutMs: slice.clampedMilliseconds)
                }
            } catch {
                guard deadline.remaining > .zero, !stopWaiting(), !Task.isCancelled else { throw error }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    private func listOffsets(_ queries: [(TopicPartition, Int64)], timeout: Duration) async throws(KafkaError) -> [TopicPartition: Int64] {
        let admin = self.admin
        return try await worker.run { () throws(KafkaError) in
            try admin.listOffsets(queries, timeoutMs: timeout.clampedMilliseconds)
        }
    }

    /// The mock-cluster fallback of `offsets(forTimestampMs:)`: read each partition from its start up to the
    /// end offset seen when the scan began, taking the first record with timestamp >= `ts`.
    private func scanOffsets(
        forTimestampMs ts: Int64, _ partitions: [TopicPartition],
        deadline: ContinuousClock.Instant
    ) async throws(KafkaError) -> [TopicPartition: Int64] {
        let ends = try await endOffsets(partitions, timeout: deadline.remaining)
        var found: [TopicPartition: Int64] = [:]
        let consumer = try KafkaConsumer(configuration: configuration)
        defer { consumer.close() }
        let reader = PartitionReader(
            consumer: consumer, cluster: self, requestTimeout: deadline.remaining,
            giveUpAfter: deadline.remaining)
        do {
            try await reader.read(from: ends.mapValues { _ in 0 }, to: ends) { records in
                for record in records where (record.timestampMs ?? -1) >= ts {
                    let tp = record.topicPartition
                    if found[tp] == nil, record.offset < ends[tp] ?? 0 { found[tp] = record.offset }
                }
            }
        } catch let error as KafkaError {
            throw error
        } catch {
            throw .timedOut("timestamp scan: \(error)")
        }
        return ends.merging(found) { _, offset in offset }
    }
}
