import MailpushPartition

/// Reads partitions up to given end offsets: the one "read these partitions to their end" loop of the
/// service (config catch-up, output read-back, replay, the mock's timestamp lookup).
///
/// A partition is finished when
/// - a record at or past `end - 1` arrived;
/// - the next readable position is at or past its end, though no record said so: the consumer's position
///   (librdkafka moves it past transaction markers, which are never handed out) or the log start
///   (retention removed the rest);
/// and the read is over when every partition is finished. A start below the log start begins at the log start.
public struct PartitionReader: Sendable {
    public var consumer: KafkaConsumer
    public var cluster: KafkaCluster
    public var requestTimeout: Duration
    /// Records handed to `body` at most at once.
    public var chunkSize = 5000
    /// About the most bytes of keys and values handed to `body` at once (a chunk stops a few records past it): records
    /// of up to 1 MB each (state records, registrations at their limits) must not fill a chunk of thousands.
    public var chunkBytes = 8 << 20
    public var pollTimeout: Duration = .milliseconds(100)
    /// How long without a record the reader waits before asking the cluster for log starts again.
    public var logStartInterval: Duration = .seconds(2)
    /// nil waits for the end however long it takes; otherwise the read throws `Stalled` when no record
    /// arrived for this long and some partition is still short of its end.
    public var giveUpAfter: Duration?

    /// Some partitions did not reach their end within `giveUpAfter` of the last record.
    public struct Stalled: Error, CustomStringConvertible, Sendable {
        public var partitions: [TopicPartition]
        public var description: String {
            "reading \(partitions.map(\.description).joined(separator: ", ")) did not reach the end"
        }
    }

    public init(consumer: KafkaConsumer, cluster: KafkaCluster, requestTimeout: Duration, giveUpAfter: Duration? = nil) {
        self.consumer = consumer
        self.cluster = cluster
        self.requestTimeout = requestTimeout
        self.giveUpAfter = giveUpAfter
    }

    /// Assigns the consumer to the partitions that have something to read between `starts` and `ends`
    /// (starts below the log start begin at the log start: what retention removed cannot be read), then
    /// reads them to their ends. Returns at once, without assigning, when there is nothing to read.
    /// It assigns through `KafkaConsumer.reassign`, so that a consumer kept from one read to the next (unassigned
    /// in between) can be used again.
    public func read(
        from starts: [TopicPartition: Int64], to ends: [TopicPartition: Int64],
        _ body: ([KafkaRecord]) async throws -> Void
    ) async throws {
        let wanted = starts.filter { partition, start in start < ends[partition] ?? 0 }
        guard !wanted.isEmpty else { return }
        let logStarts = try await cluster.beginningOffsets(Array(wanted.keys), timeout: requestTimeout)
        var from: [TopicPartition: Int64] = [:]
        for (partition, start) in wanted {
            let first = max(start, logStarts[partition] ?? 0)
            if first < ends[partition]! { from[partition] = first }
        }
        guard !from.isEmpty else { return }
        try await consumer.reassign(from.mapValues { .offset($0) })
        // Only the partitions assigned here: one already at its end is never polled, so waiting for it would
        // stall the read (readAssigned takes a partition without a position to be at 0).
        try await readAssigned(at: from, to: ends.filter { from[$0.key] != nil }, body)
    }

    /// Reads a consumer that is already assigned and positioned at `positions` until each partition in
    /// `ends` is finished. Every record polled goes to `body`, including records past an end or of other
    /// assigned partitions: a long-lived consumer must not lose them.
    public func readAssigned(
        at positions: [TopicPartition: Int64], to ends: [TopicPartition: Int64],
        _ body: ([KafkaRecord]) async throws -> Void
    ) async throws {
        var remaining = ends.filter { partition, end in (positions[partition] ?? 0) < end }
        var lastRecord = ContinuousClock.now
        var lastLogStartCheck = ContinuousClock.now
        while !remaining.isEmpty {
            let records = try await consumer.poll(maxRecords: chunkSize, maxBytes: chunkBytes, timeout: pollTimeout)
            if !records.isEmpty {
                lastRecord = .now
                for record in records {
                    let partition = record.topicPartition
                    guard let end = remaining[partition] else { continue }
                    if record.offset + 1 >= end { remaining[partition] = nil }
                }
                try await body(records)
                continue
            }
            for (partition, position) in consumer.positions(Array(remaining.keys)) where position >= remaining[partition]! {
                remaining[partition] = nil
            }
            if !remaining.isEmpty, ContinuousClock.now - lastLogStartCheck >= logStartInterval {
                lastLogStartCheck = .now
                let logStarts = try await cluster.beginningOffsets(Array(remaining.keys), timeout: requestTimeout)
                for (partition, start) in logStarts where start >= remaining[partition] ?? .max { remaining[partition] = nil }
            }
            if !remaining.isEmpty, let giveUpAfter, ContinuousClock.now - lastRecord >= giveUpAfter {
                throw Stalled(partitions: remaining.keys.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) })
            }
        }
    }
}
