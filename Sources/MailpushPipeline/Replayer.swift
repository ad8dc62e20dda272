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

public struct ReplayProgress: Sendable {
    public var eventsRead: Int
    public var eventsTotal: Int
    public var jobs: Int
    public var deadLetters: Int
    public var duplicates: Int
}

/// Backfill: re-reads ranges of `email.received` through the same rendering as the service.
/// It writes no input offsets and no config state (a running service owns those), only the dedupe entries
/// of what it processed, so a replay and the service never send the same email twice within the window.
public struct Replayer: Sendable {
    public var configuration: PipelineConfiguration
    public var store: StateStore
    public var logger: Logger

    public init(configuration: PipelineConfiguration, store: StateStore, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
    }

    public func run(
        ranges: [ReplayRange], force: Bool, progress: @Sendable (ReplayProgress) -> Void
    ) async throws -> ReplayProgress {
        let kafka = configuration.kafka
        let topics = configuration.topics
        let cluster = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaCluster(configuration: kafka) }
        do {
            try await cluster.waitUntilReachable(timeout: configuration.kafkaRequestTimeout)
        } catch {
            throw PipelineError.brokerUnreachable("\(kafka.bootstrapServers): \(error)")
        }
        let directory = try await latestConfig(cluster: cluster)

        let processor = BatchProcessor(
            topics: topics, renderer: JobRenderer(options: configuration.render),
            sponsorWebhookURL: configuration.render.sponsorWebhookURL)
        let producer = try KafkaProducer(configuration: configuration.producerKafka)
        let wanted = ranges.filter { $0.from < $0.to }
        var state = ReplayProgress(
            eventsRead: 0, eventsTotal: wanted.reduce(0) { $0 + Int($1.to - $1.from) }, jobs: 0, deadLetters: 0, duplicates: 0)
        var ends: [Int32: Int64] = [:]
        for range in wanted { ends[range.partition] = range.to }
        let partition = { (number: Int32) in TopicPartition(topic: topics.events, partition: number) }

        let consumer = try KafkaConsumer(configuration: kafka)
        defer { consumer.close() }
        var reader = PartitionReader(consumer: consumer, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout,
                                     giveUpAfter: .seconds(10))
        reader.chunkSize = configuration.maxBatchSize
        do {
            try await reader.read(
                from: Dictionary(uniqueKeysWithValues: wanted.map { (partition($0.partition), $0.from) }),
                to: Dictionary(uniqueKeysWithValues: wanted.map { (partition($0.partition), $0.to) })
            ) { polled in
                let records = polled.filter { $0.offset < ends[$0.partition] ?? 0 }
                guard !records.isEmpty else { return }
                let now = Int64(Date().timeIntervalSince1970 * 1000)
                let windowStart = force ? Int64.max : try store.dedupeWindowStartMs(nowMs: now, windowMs: configuration.dedupeWindowSeconds * 1000)
                let batch = try await processor.process(
                    records, nowMs: now, config: { owners, addresses in try directory.view(owners: owners, addresses: addresses) }
                ) { keys in
                    try store.processedEmails(among: keys, sinceMs: windowStart)
                }
                let results = try await producer.send(batch.outputs.map(\.record), timeout: configuration.deliveryTimeout)
                if let failure = results.first(where: { $0.error != nil })?.error {
                    throw PipelineError.kafka("replay delivery failed: \(failure); rerun the replay (dedupe skips what was done)")
                }
                try store.commitEventBatch(offsets: [:], processedEmails: batch.processedEmails, processedAtMs: now, outputMarks: [:])
                state.eventsRead += records.count
                state.duplicates += batch.duplicates
                for output in batch.outputs {
                    if case .job = output.kind { state.jobs += 1 } else { state.deadLetters += 1 }
                }
                progress(state)
            }
        } catch let stalled as PartitionReader.Stalled {
            logger.warning("replay found no more records before the end of its range (deleted by retention?)", metadata: [
                "partitions": "\(stalled.partitions.map(\.partition).sorted())",
            ])
        }
        return state
    }

    /// The stored config with, in memory only, what the config topics hold beyond it.
    private func latestConfig(cluster: KafkaCluster) async throws -> ConfigDirectory {
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
            directory: ConfigDirectory(store: store, storesChanges: false, logger: logger),
            stored: logStarts.merging(store.offsets().filter { logStarts[$0.key] != nil }) { max($0, $1) },
            store: store, persists: false, logger: logger, metrics: PipelineMetrics(), giveUpAfter: .seconds(5))
        defer { follower.close() }
        do {
            try await follower.catchUp()
        } catch is PartitionReader.Stalled {
            // Config that cannot be read to its end is applied as far as it was read: replay goes on with it.
        }
        return follower.directory
    }
}
