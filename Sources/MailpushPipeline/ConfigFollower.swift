import Foundation
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
    private let log: RecordLog
    private let metrics: PipelineMetrics

    let directory: ConfigDirectory
    /// Next offset to apply per config partition.
    private var positions: [TopicPartition: Int64]
    /// Told how far a catch-up got (the service: liveness, readiness detail and a log line every few seconds).
    var progress: ProgressReporter?

    /// Config records read, decoded and stored together in a catch-up, up to `PartitionReader.chunkBytes` (8 MiB) of
    /// them: a registration at the contract's limits (1,000 filter items, 64 KB of rule text: about 130 KB) takes about
    /// 0.25 MB decoded, and 1,500 of them in one chunk made a first start peak at 826 MB. Ordinary registrations (under
    /// 800 bytes) fill the 10,000 first.
    static let catchUpChunk = 10_000

    /// Whether the consumer is assigned yet (the first catch-up assigns it).
    private var assigned = false
    /// Per partition, the end the last catch-up reached: every record below it is applied (positions alone can
    /// stay below an end that only control records or compacted-away records fill).
    private var caughtUpTo: [TopicPartition: Int64] = [:]
    /// When a catch-up last found records to apply (nil: none since the start).
    private var lastRecordsApplied: ContinuousClock.Instant?

    /// Config that changed within this long is not planned ahead of its catch-up (`isQuiet`).
    static let quietAfter = Duration.seconds(1)

    /// Follows `partitions` from the offsets in `stored` (from the beginning where none is); the first
    /// `catchUp` assigns the consumer.
    /// - Parameter giveUpAfter: how long a catch-up waits for records before throwing `PartitionReader.Stalled`;
    ///   nil waits as long as it takes.
    init(
        configuration: PipelineConfiguration, cluster: KafkaCluster, partitions: [TopicPartition],
        directory: ConfigDirectory, stored: [TopicPartition: Int64], store: StateStore,
        log: RecordLog, metrics: PipelineMetrics, giveUpAfter: Duration? = nil
    ) throws {
        topics = configuration.topics
        self.partitions = partitions
        consumer = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaConsumer(configuration: configuration.kafka) }
        var reader = PartitionReader(
            consumer: consumer, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout,
            giveUpAfter: giveUpAfter)
        // A chunk is one SQLite transaction: a first start with a million registrations caught up about 1.4 s
        // faster in chunks of 10,000 than of 5,000, for about 30 MB more at its peak (two chunks decoded at once).
        reader.chunkSize = Self.catchUpChunk
        self.reader = reader
        self.store = store
        self.log = log
        self.metrics = metrics
        self.directory = directory
        positions = stored.filter { partitions.contains($0.key) }
    }

    /// Assigns the consumer at concrete offsets: where nothing is stored, the log start, asked of the cluster. A
    /// logical start (`BEGINNING`) makes librdkafka query the offset itself, and a query sent before the partition's
    /// leader was known is retried only after 500 ms (measured: a fresh start was then ready in 0.55 s, not 0.05 s).
    private mutating func assignOnce() async throws {
        guard !assigned else { return }
        let fresh = partitions.filter { positions[$0] == nil }
        if !fresh.isEmpty {
            positions.merge(try await reader.cluster.beginningOffsets(fresh, timeout: reader.requestTimeout)) { stored, _ in stored }
        }
        try consumer.assign(try assignment())
        assigned = true
    }

    /// Every config partition at its position.
    private func assignment() throws(KafkaError) -> [TopicPartition: StartOffset] {
        var assignment: [TopicPartition: StartOffset] = [:]
        for partition in partitions {
            // Never left out silently: a partition not assigned would never be read.
            guard let position = positions[partition] else {
                throw KafkaError(
                    code: KafkaError.Code.invalidArgument, name: "_INVALID_ARG", message: "the cluster gave no log start for \(partition)",
                    isRetriable: true)
            }
            assignment[partition] = .offset(position)
        }
        return assignment
    }

    func close() { consumer.close() }

    /// Reads the config topics up to their current ends and applies what it read.
    mutating func catchUp() async throws {
        try await catchUp(to: try await currentEnds())
    }

    /// The config partitions' ends now, asked of the cluster: every config record the broker acknowledged
    /// before this call lies below them.
    func currentEnds() async throws(KafkaError) -> [TopicPartition: Int64] {
        try await reader.cluster.endOffsets(partitions, timeout: reader.requestTimeout)
    }

    /// `currentEnds`, asked now and awaited later (`KafkaCluster.startEndOffsets`).
    func startCurrentEnds(whenAnswered: @escaping @Sendable ([TopicPartition: Int64]) -> Void) -> Answer<[TopicPartition: Int64]> {
        reader.cluster.startEndOffsets(partitions, timeout: reader.requestTimeout, whenAnswered: whenAnswered)
    }

    /// Whether every record below `ends` is applied already (then a catch-up to them would read nothing).
    func isCaughtUp(to ends: [TopicPartition: Int64]) -> Bool { caughtUpTest(ends) }

    /// `isCaughtUp(to:)` with what is applied now, to be asked on any thread.
    var caughtUpTest: @Sendable (_ ends: [TopicPartition: Int64]) -> Bool {
        let caughtUpTo = caughtUpTo
        let positions = positions
        return { ends in ends.allSatisfy { partition, end in end <= max(caughtUpTo[partition] ?? 0, positions[partition] ?? 0) } }
    }

    /// No config records applied for `quietAfter`: a batch is then planned while its catch-up's round trip is
    /// under way, and planned again only if that catch-up finds something (rare while config is quiet).
    var isQuiet: Bool {
        guard let lastRecordsApplied else { return true }
        return ContinuousClock.now - lastRecordsApplied >= Self.quietAfter
    }

    /// Reads the config topics up to `ends` (from `currentEnds`) and applies what it read.
    mutating func catchUp(to ends: [TopicPartition: Int64]) async throws {
        try await assignOnce()
        let total = ends.reduce(Int64(0)) { sum, end in sum + max(0, end.value - (positions[end.key] ?? 0)) }
        var read: Int64 = 0
        progress?.start(total: total)
        // Chunk k+1 is decoded (on the cooperative threads) while chunk k is written (on SQLite's writer
        // thread); chunks are still stored and their offsets advanced in order. A polled chunk is applied
        // even when reading fails after it: the consumer has moved past it.
        var decoding: (records: [KafkaRecord], meanings: Task<[ConfigRecordMeaning], Never>)?
        let topics = self.topics
        func applyDecoding(_ follower: inout ConfigFollower) async throws {
            guard let (records, meanings) = decoding else { return }
            decoding = nil
            try follower.apply(records, meanings: await meanings.value)
            read += Int64(records.count)
            follower.progress?.report(read: min(read, total), of: total)
        }
        var moved = false
        while true {
            do {
                try await reader.readAssigned(at: positions, to: ends) { records in
                    let next = (records, Task { await Self.meanings(of: records, topics: topics) })
                    try await applyDecoding(&self)
                    decoding = next
                }
                break
            } catch let reset as KafkaError where reset.code == KafkaError.Code.autoOffsetReset && !moved {
                try await applyDecoding(&self)
                try await continueFromLogStarts(after: reset)
                moved = true
            } catch {
                try await applyDecoding(&self)
                throw error
            }
        }
        try await applyDecoding(&self)
        progress?.finish(read: read)
        caughtUpTo.merge(ends) { old, new in max(old, new) }
        if read > 0 { lastRecordsApplied = .now }
    }

    /// librdkafka stopped reading a config partition whose next offset is outside its log: retention (or
    /// DeleteRecords) removed records before they were read, or the topic was made again. They cannot be read any
    /// more, and the registrations and keys a partition still holds are its log from its start, so the partition
    /// continues there, said in a warning. Without this the catch-up waited for ever for records librdkafka no longer
    /// fetched, and a restart on that state never became ready.
    private mutating func continueFromLogStarts(after reset: KafkaError) async throws {
        let starts = try await reader.cluster.beginningOffsets(partitions, timeout: reader.requestTimeout)
        let ends = try await reader.cluster.endOffsets(partitions, timeout: reader.requestTimeout)
        var moved: [TopicPartition: Int64] = [:]
        for partition in partitions {
            guard let position = positions[partition], let start = starts[partition], let end = ends[partition],
                position < start || position > end
            else { continue }
            log.logger.warning(
                "config records were removed before they were read; continuing from the partition's log start",
                metadata: [
                    "partition": "\(partition)", "storedOffset": "\(position)", "logStart": "\(start)", "logEnd": "\(end)",
                    "cause": "\(reset.message)",
                ])
            moved[partition] = start
        }
        // Told by librdkafka, but no position is outside its log now: the partition is read from where it stands again.
        if moved.isEmpty {
            log.logger.warning("config partitions assigned again after librdkafka stopped one", metadata: ["cause": "\(reset.message)"])
        }
        positions.merge(moved) { _, start in start }
        if !moved.isEmpty {
            do {
                try store.applyConfig([], offsets: moved)
            } catch {
                throw PipelineError.state(error)
            }
        }
        // `reassign`: the assignment stopped before is changed again only once its stops are confirmed (librdkafka 2.0.2).
        try await consumer.reassign(try assignment())
    }

    /// Applies what the consumer has already fetched, without waiting: config that arrives while no events
    /// do is applied at once, so readiness and restarts see it.
    mutating func applyFetched() async throws {
        let records = try await consumer.poll(maxRecords: 5000, maxBytes: reader.chunkBytes, timeout: .zero)
        if !records.isEmpty {
            try apply(records, meanings: await Self.meanings(of: records, topics: topics))
            lastRecordsApplied = .now
        }
    }

    private mutating func apply(_ records: [KafkaRecord], meanings decoded: [ConfigRecordMeaning]) throws {
        var meanings: [ConfigRecordMeaning] = []
        var changes: [ConfigChange] = []
        meanings.reserveCapacity(records.count)
        changes.reserveCapacity(records.count)
        var offsets: [TopicPartition: Int64] = [:]
        var appliedByTopic: [String: Int] = [:]
        for (record, meaning) in zip(records, decoded) {
            offsets[record.topicPartition] = record.offset + 1
            switch meaning {
            case .skipped(let reason):
                metrics.configRecord(topic: record.topic, result: "skipped").increment()
                log.log(
                    .warning, "config record skipped; the previous registration stays in force", of: ("topic", record.topic),
                    countedIn: "mailpush_config_records_total{result=\"skipped\"} counts every one",
                    metadata: [
                        "source": "\(record.topic)/\(record.partition)/\(record.offset)", "reason": "\(reason)",
                    ])
                continue
            case .device(let registration, _) where registration.filter.invalidRuleCount > 0:
                metrics.invalidFilterRules.increment(by: registration.filter.invalidRuleCount)
                log.log(
                    .warning, "device filter has rules that never match (unparsable or unsupported operator)",
                    countedIn: "mailpush_invalid_filter_rules_total counts every rule",
                    metadata: [
                        "deviceId": "\(registration.deviceId)", "invalidRules": "\(registration.filter.invalidRuleCount)",
                    ])
            case .key(.rejected(let reason), let address, _, _):
                metrics.rejectedKeys.increment()
                log.log(
                    .warning, "address key rejected; events for the address go to the dead-letter topic until a usable key arrives",
                    countedIn: "mailpush_rejected_address_keys_total counts every one",
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
        do {
            try store.applyConfig(changes, offsets: offsets)
        } catch {
            throw PipelineError.state(error)
        }
        // After the store has them: a lookup that misses the cache reads the store.
        directory.apply(meanings)
        positions.merge(offsets) { _, new in new }
        // Counted once per chunk and topic: a first start applies a million records.
        for (topic, count) in appliedByTopic { metrics.configRecord(topic: topic, result: "applied").increment(by: count) }
    }

    /// Decodes a chunk's records (JSON, filter rules, public keys) spread over the cores, in record order:
    /// on a first start with a million registrations decoding is a third of the catch-up, the SQLite
    /// writes after it the rest.
    private static func meanings(of records: [KafkaRecord], topics: Topics) async -> [ConfigRecordMeaning] {
        let parallelism = ProcessInfo.processInfo.activeProcessorCount
        guard parallelism > 1, records.count >= 64 else { return records.map { ConfigRecordMeaning.of($0, topics: topics) } }
        let chunk = (records.count + parallelism - 1) / parallelism
        return await withTaskGroup(of: (Int, [ConfigRecordMeaning]).self) { group in
            for start in stride(from: 0, to: records.count, by: chunk) {
                let slice = records[start..<min(start + chunk, records.count)]
                group.addTask { (start, slice.map { ConfigRecordMeaning.of($0, topics: topics) }) }
            }
            var parts: [(Int, [ConfigRecordMeaning])] = []
            for await part in group { parts.append(part) }
            return parts.sorted { $0.0 < $1.0 }.flatMap(\.1)
        }
    }
}
