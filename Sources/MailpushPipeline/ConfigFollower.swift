import Logging
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

/// Follows the config topics (devices, address keys) into a `ConfigDirectory`. The service stores what it
/// applies together with the config offsets; a replay applies in memory only (the service owns that state).
struct ConfigFollower {
    private let topics: Topics
    private let partitions: [TopicPartition]
    private let consumer: KafkaConsumer
    private let reader: PartitionReader
    private let store: StateStore
    private let persists: Bool
    private let logger: Logger
    private let metrics: PipelineMetrics

    let directory: ConfigDirectory
    /// Next offset to apply per config partition.
    private var positions: [TopicPartition: Int64]
    /// Told how far a catch-up got (the service: liveness, readiness detail and a log line every few seconds).
    var progress: ProgressReporter?

    /// Assigns a consumer to `partitions`, from the offsets in `stored` (from the beginning where none is).
    /// - Parameter giveUpAfter: how long a catch-up waits for records before throwing `PartitionReader.Stalled`;
    ///   nil waits as long as it takes.
    init(
        configuration: PipelineConfiguration, cluster: KafkaCluster, partitions: [TopicPartition],
        directory: ConfigDirectory, stored: [TopicPartition: Int64], store: StateStore, persists: Bool,
        logger: Logger, metrics: PipelineMetrics, giveUpAfter: Duration? = nil
    ) throws {
        topics = configuration.topics
        self.partitions = partitions
        consumer = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaConsumer(configuration: configuration.kafka) }
        reader = PartitionReader(
            consumer: consumer, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout,
            giveUpAfter: giveUpAfter)
        self.store = store
        self.persists = persists
        self.logger = logger
        self.metrics = metrics
        self.directory = directory
        positions = stored.filter { partitions.contains($0.key) }
        try consumer.assign(
            Dictionary(
                uniqueKeysWithValues: partitions.map { partition in
                    (partition, positions[partition].map(StartOffset.offset) ?? .beginning)
                }))
    }

    func close() { consumer.close() }

    /// Reads the config topics up to their current ends and applies what it read.
    mutating func catchUp() async throws {
        let ends = try await reader.cluster.endOffsets(partitions, timeout: reader.requestTimeout)
        let total = ends.reduce(Int64(0)) { sum, end in sum + max(0, end.value - (positions[end.key] ?? 0)) }
        var read: Int64 = 0
        progress?.start()
        try await reader.readAssigned(at: positions, to: ends) { records in
            try apply(records)
            read += Int64(records.count)
            progress?.report(read: min(read, total), of: total)
        }
    }

    /// Applies what the consumer has already fetched, without waiting: config that arrives while no events
    /// do is applied at once, so readiness and restarts see it.
    mutating func applyFetched() async throws {
        let records = try await consumer.poll(maxRecords: 5000, timeout: .zero)
        if !records.isEmpty { try apply(records) }
    }

    private mutating func apply(_ records: [KafkaRecord]) throws {
        var meanings: [ConfigRecordMeaning] = []
        var changes: [ConfigChange] = []
        meanings.reserveCapacity(records.count)
        changes.reserveCapacity(records.count)
        var offsets: [TopicPartition: Int64] = [:]
        var appliedByTopic: [String: Int] = [:]
        for record in records {
            let meaning = ConfigRecordMeaning.of(record, topics: topics)
            offsets[record.topicPartition] = record.offset + 1
            switch meaning {
            case .skipped(let reason):
                metrics.configRecord(topic: record.topic, result: "skipped").increment()
                logger.warning(
                    "config record skipped; the previous registration stays in force",
                    metadata: [
                        "source": "\(record.topic)/\(record.partition)/\(record.offset)", "reason": "\(reason)",
                    ])
                continue
            case .device(let registration, _) where registration.filter.invalidRuleCount > 0:
                metrics.invalidFilterRules.increment(by: registration.filter.invalidRuleCount)
                logger.warning(
                    "device filter has rules that never match (unparsable or unsupported operator)",
                    metadata: [
                        "deviceId": "\(registration.deviceId)", "invalidRules": "\(registration.filter.invalidRuleCount)",
                    ])
            case .key(.rejected(let reason), let address, _, _):
                metrics.rejectedKeys.increment()
                logger.warning(
                    "address key rejected; events for the address go to the dead-letter topic until a usable key arrives",
                    metadata: [
                        "emailAddressId": "\(address)", "reason": "\(reason)",
                    ])
            default:
                break
            }
            appliedByTopic[record.topic, default: 0] += 1
            if let change = meaning.stateChange { changes.append(change) }
            meanings.append(meaning)
        }
        if persists {
            do {
                try store.applyConfig(changes, offsets: offsets)
            } catch {
                throw PipelineError.state(error.description)
            }
        }
        // After the store has them: a lookup that misses the cache reads the store.
        directory.apply(meanings)
        positions.merge(offsets) { _, new in new }
        // Counted once per chunk and topic: a first start applies a million records.
        for (topic, count) in appliedByTopic { metrics.configRecord(topic: topic, result: "applied").increment(by: count) }
    }
}
