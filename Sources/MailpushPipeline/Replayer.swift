import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

/// A range of `email.received` to read again: `[from, to)` of one partition.
public struct ReplayRange: Sendable, Hashable {
    public var partition: Int32
    public var from: Int64
    public var to: Int64

    public init(partition: Int32, from: Int64, to: Int64) {
        self.partition = partition
        self.from = from
        self.to = to
    }
}

/// Backfill: re-reads ranges of `email.received` through the same rendering, delivery and recovery as the
/// service. Replays are recorded in the state as requests (`StateStore.submitReplay`) and executed by the
/// one process that holds the state directory: the service between its batches (ServiceReplay.swift), or
/// this type, in the `mailpush replay` process, when no service runs (docs/exactly-once.md, "Replays").
public struct Replayer: Sendable {
    public var configuration: PipelineConfiguration
    public var store: StateStore
    public var logger: Logger

    public init(configuration: PipelineConfiguration, store: StateStore, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
    }

    /// Reads `email.received` for a replay in chunks of one poll (`pollRecords`); gives up after 10 s without a record
    /// (records deleted by retention). The caller closes the consumer.
    private func replayReader(cluster: KafkaCluster) throws -> (KafkaConsumer, PartitionReader) {
        let consumer = try KafkaConsumer(configuration: configuration.kafka)
        var reader = PartitionReader(
            consumer: consumer, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout,
            giveUpAfter: .seconds(10))
        reader.chunkSize = configuration.pollRecords
        return (consumer, reader)
    }

    /// Executes every pending replay request, oldest first. The caller must hold the state directory's lock.
    ///
    /// Like a restarted service, it first reads the output topics back from the marks: outputs of an
    /// interrupted replay batch (or of an unfinished event batch) are not produced again. It never moves
    /// the marks: only the service does, which knows when nothing of its own is unsettled.
    public func executePending(progress: @Sendable (ReplayRequest) -> Void) async throws {
        let requests = try store.pendingReplays()
        guard !requests.isEmpty else { return }
        let cluster = try await connect()
        let topics = configuration.topics
        let outputPartitions = try await topics.outputPartitions(in: cluster, timeout: configuration.kafkaRequestTimeout)
        let pipeline = Pipeline(configuration: configuration, store: store, logger: logger)
        let developmentBroker = await cluster.isDevelopmentBroker(timeout: configuration.kafkaRequestTimeout)
        var delivery = try OutputDelivery(
            pipeline: pipeline, cluster: cluster, partitions: outputPartitions,
            producerKafka: configuration.producerKafka(developmentBroker: developmentBroker))
        await delivery.prepare()
        let committed = try store.offsets()
        let recovery = Recovery(try await delivery.scan(committed: committed))
        if !recovery.isSettled {
            logger.notice(
                "found outputs of an interrupted replay or batch; they will not be produced again",
                metadata: [
                    "outputs": "\(recovery.found.count + recovery.replayFound.count)"
                ])
        }
        let directory = try await caughtUpConfig(cluster: cluster)
        let processor = BatchProcessor(topics: topics, configuration: configuration)

        for request in requests {
            var tracker = ReplayProgressTracker(request)
            progress(tracker.request)
            let partition = { (number: Int32) in TopicPartition(topic: request.eventsTopic, partition: number) }
            let (consumer, reader) = try replayReader(cluster: cluster)
            defer { consumer.close() }
            do {
                try await reader.read(
                    from: Dictionary(uniqueKeysWithValues: request.remaining.map { (partition($0.partition), $0.next) }),
                    to: Dictionary(uniqueKeysWithValues: request.remaining.map { (partition($0.partition), $0.end) })
                ) { polled in
                    let records = tracker.inRange(polled)
                    guard !records.isEmpty else { return }
                    let now = Int64(Date().timeIntervalSince1970 * 1000)
                    let windowMs = configuration.dedupeWindowSeconds * 1000
                    let batch = try await processor.process(
                        records, nowMs: now, config: { owners, addresses in try directory.view(owners: owners, addresses: addresses) }
                    ) { keys in
                        request.force ? [] : try store.processedEmails(among: keys, nowMs: now, windowMs: windowMs)
                    }
                    let outputs = batch.outputs.taggedAsReplay(store.replayTag(localId: request.id))
                    _ = try await delivery.deliver(recovery.notYetWritten(outputs), committed: committed)
                    let cursors = tracker.cursors(after: records)
                    let counts = ReplayRequest.Counts(batch, events: records.count)
                    try store.commitReplayBatch(
                        id: request.id, cursors: cursors, counts: counts, processedEmails: batch.processedEmails,
                        processedAtMs: now, outputMarks: [:])
                    tracker.advance(to: cursors, counts: counts)
                    progress(tracker.request)
                }
            } catch let stalled as PartitionReader.Stalled {
                logger.warning(
                    "replay found no more records before the end of its range (deleted by retention?)",
                    metadata: [
                        "partitions": "\(stalled.partitions.map(\.partition).sorted())"
                    ])
            }
            try store.finishReplay(id: request.id, status: .done)
            progress(try store.replay(id: request.id) ?? tracker.request)
        }
    }

    /// Catches the stored config up with the config topics and stores it, as a service start would. The caller must
    /// hold the state directory's lock.
    public func catchUpConfig() async throws {
        _ = try await caughtUpConfig(cluster: try await connect())
    }

    /// Reads and renders `ranges` as a replay would, with the stored config, and counts what it would write. Writes
    /// nothing.
    public func dryRun(
        ranges: [ReplayRange], force: Bool, progress: @Sendable (_ done: Int, _ total: Int, _ detail: String) -> Void
    ) async throws -> ReplayDryRunSummary {
        let cluster = try await connect()
        let directory = ConfigDirectory(store: store, log: RecordLog(logger: logger))
        let processor = BatchProcessor(topics: configuration.topics, configuration: configuration)
        let wanted = ranges.filter { $0.from < $0.to }
        let total = wanted.reduce(0) { $0 + Int($1.to - $1.from) }
        var ends: [Int32: Int64] = [:]
        for range in wanted { ends[range.partition] = range.to }
        let partition = { (number: Int32) in TopicPartition(topic: configuration.topics.events, partition: number) }
        let (consumer, reader) = try replayReader(cluster: cluster)
        defer { consumer.close() }
        var summary = ReplayDryRunSummary()
        do {
            try await reader.read(
                from: Dictionary(uniqueKeysWithValues: wanted.map { (partition($0.partition), $0.from) }),
                to: Dictionary(uniqueKeysWithValues: wanted.map { (partition($0.partition), $0.to) })
            ) { polled in
                let records = polled.filter { $0.offset < ends[$0.partition] ?? 0 }
                guard !records.isEmpty else { return }
                let now = Int64(Date().timeIntervalSince1970 * 1000)
                let windowMs = configuration.dedupeWindowSeconds * 1000
                let batch = try await processor.process(
                    records, nowMs: now, config: { owners, addresses in try directory.view(owners: owners, addresses: addresses) }
                ) { keys in
                    force ? [] : try store.processedEmails(among: keys, nowMs: now, windowMs: windowMs)
                }
                summary.add(batch, events: records.count)
                progress(summary.events, total, "\(summary.jobs) jobs, \(summary.deadLetters) dead letters, \(summary.skipped) skipped")
            }
        } catch let stalled as PartitionReader.Stalled {
            logger.warning(
                "replay found no more records before the end of its range (deleted by retention?)",
                metadata: [
                    "partitions": "\(stalled.partitions.map(\.partition).sorted())"
                ])
        }
        progress(summary.events, total, "\(summary.jobs) jobs, \(summary.deadLetters) dead letters, \(summary.skipped) skipped")
        return summary
    }

    private func connect() async throws -> KafkaCluster {
        let kafka = configuration.kafka
        let cluster = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaCluster(configuration: kafka) }
        do {
            try await cluster.waitUntilReachable(timeout: configuration.kafkaRequestTimeout)
        } catch {
            throw PipelineError.brokerUnreachable("\(kafka.bootstrapServers): \(error)")
        }
        return cluster
    }

    /// The stored config caught up with the config topics and stored, as a service's start would, so that what a
    /// replay reads is held no more than the service holds it, however far behind the state directory was.
    private func caughtUpConfig(cluster: KafkaCluster) async throws -> ConfigDirectory {
        let log = RecordLog(logger: logger)
        let topics = configuration.topics
        var partitions: [TopicPartition] = []
        for topic in [topics.devices, topics.addressKeys] {
            let count = try await cluster.partitionCount(topic: topic, timeout: configuration.kafkaRequestTimeout) ?? 0
            partitions += (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
        }
        // What retention removed cannot be read: start there rather than fail the consumer.
        let logStarts = try await cluster.beginningOffsets(partitions, timeout: configuration.kafkaRequestTimeout)
        var follower = try ConfigFollower(
            configuration: configuration, cluster: cluster, partitions: partitions,
            directory: ConfigDirectory(store: store, log: log),
            stored: logStarts.merging(store.offsets().filter { logStarts[$0.key] != nil }) { max($0, $1) },
            store: store, log: log, metrics: PipelineMetrics(), giveUpAfter: .seconds(5))
        defer {
            follower.close()
            log.flush(all: true)
        }
        do {
            try await follower.catchUp()
        } catch is PartitionReader.Stalled {
            // Config that cannot be read to its end is applied as far as it was read: replay goes on with it.
        }
        return follower.directory
    }
}
