import Foundation
import Logging
import MailpushCore
import MailpushKafka
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
        var directory = try ConfigDirectory.load(from: store, logger: logger)
        try await readLatestConfig(into: &directory, cluster: cluster)

        let processor = BatchProcessor(
            topics: topics, renderer: JobRenderer(options: configuration.render),
            sponsorWebhookURL: configuration.render.sponsorWebhookURL)
        let producer = try KafkaProducer(configuration: configuration.producerKafka)
        let consumer = try KafkaConsumer(configuration: kafka)
        defer { consumer.close() }
        let wanted = ranges.filter { $0.from < $0.to }
        var remaining = Dictionary(uniqueKeysWithValues: wanted.map { ($0.partition, $0.to) })
        try consumer.assign(Dictionary(uniqueKeysWithValues: wanted.map {
            (TopicPartition(topic: topics.events, partition: $0.partition), StartOffset.offset($0.from))
        }))

        var state = ReplayProgress(
            eventsRead: 0, eventsTotal: wanted.reduce(0) { $0 + Int($1.to - $1.from) }, jobs: 0, deadLetters: 0, duplicates: 0)
        var idlePolls = 0
        while !remaining.isEmpty {
            var records = try await consumer.poll(maxRecords: configuration.maxBatchSize, timeout: .milliseconds(200))
            if records.isEmpty {
                idlePolls += 1
                if idlePolls > 50 {
                    logger.warning("replay found no more records before the end of its range (deleted by retention?)", metadata: [
                        "partitions": "\(remaining.keys.sorted())",
                    ])
                    break
                }
                continue
            }
            idlePolls = 0
            records.removeAll { record in
                guard let end = remaining[record.partition] else { return true }
                return record.offset >= end
            }
            for record in records where record.offset + 1 >= remaining[record.partition] ?? .max {
                remaining[record.partition] = nil
            }
            guard !records.isEmpty else { continue }

            let now = Int64(Date().timeIntervalSince1970 * 1000)
            let windowStart = force ? Int64.max : now - configuration.dedupeWindowSeconds * 1000
            let batch = try await processor.process(records, directory: directory, nowMs: now) { keys in
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
        return state
    }

    /// Applies, in memory only, config newer than the state store holds.
    private func readLatestConfig(into directory: inout ConfigDirectory, cluster: KafkaCluster) async throws {
        let topics = configuration.topics
        var partitions: [TopicPartition] = []
        for topic in [topics.devices, topics.addressKeys] {
            let count = try await cluster.partitionCount(topic: topic, timeout: configuration.kafkaRequestTimeout) ?? 0
            partitions += (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
        }
        let stored = try store.offsets()
        let ends = try await cluster.endOffsets(partitions, timeout: configuration.kafkaRequestTimeout)
        var behind = ends.filter { (stored[PartitionKey($0.key)] ?? 0) < $0.value }
        guard !behind.isEmpty else { return }
        let consumer = try KafkaConsumer(configuration: configuration.kafka)
        defer { consumer.close() }
        try consumer.assign(Dictionary(uniqueKeysWithValues: behind.keys.map {
            ($0, stored[PartitionKey($0)].map(StartOffset.offset) ?? .beginning)
        }))
        var idlePolls = 0
        while !behind.isEmpty && idlePolls < 50 {
            let records = try await consumer.poll(maxRecords: 5000, timeout: .milliseconds(100))
            idlePolls = records.isEmpty ? idlePolls + 1 : 0
            for record in records {
                ConfigRecordMeaning.of(record, topics: topics).apply(to: &directory)
                let partition = TopicPartition(topic: record.topic, partition: record.partition)
                if let end = behind[partition], record.offset + 1 >= end { behind[partition] = nil }
            }
        }
    }
}
