import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushState

/// The service: reads `email.received` and the two config topics, writes push jobs and dead letters,
/// and keeps every input offset in the state store in the same transaction as what it produced.
///
/// Exactly once rests on three things (docs/exactly-once.md has the argument):
/// 1. a batch's offsets, dedupe entries and output marks commit together, after all its outputs are acknowledged;
/// 2. on start-up and after a failed delivery, the output topics are read back from the marks, and an output
///    already there (same source record, same jobId) is not produced again;
/// 3. marks only move past outputs whose batch has committed.
public final class Pipeline: Sendable {
    public let configuration: PipelineConfiguration
    public let health = HealthState()
    private let store: StateStore
    private let logger: Logger
    private let metrics = PipelineMetrics()

    public init(configuration: PipelineConfiguration, store: StateStore, logger: Logger) {
        self.configuration = configuration
        self.store = store
        self.logger = logger
        metrics.announce(topics: [configuration.topics.devices, configuration.topics.addressKeys])
    }

    /// Runs until `shouldStop` turns true between batches (graceful shutdown: the batch in flight is finished,
    /// delivered and committed first) or the task is cancelled (nothing half-committed: recovery covers it).
    public func run(startupTimeout: Duration, until shouldStop: @escaping @Sendable () -> Bool) async throws {
        let cluster = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaCluster(configuration: configuration.kafka) }
        do {
            try await cluster.waitUntilReachable(timeout: startupTimeout)
        } catch {
            throw PipelineError.brokerUnreachable("\(configuration.kafka.bootstrapServers): \(error)")
        }
        var run = try await RunState.start(pipeline: self, cluster: cluster)
        defer { run.close() }
        try await run.loop(until: shouldStop)
    }

    // Accessors for RunState, which lives in its own file.
    var state: StateStore { store }
    var log: Logger { logger }
    var counters: PipelineMetrics { metrics }
}

/// The mutable state of one run, owned by the single task that runs the loop.
struct RunState {
    let pipeline: Pipeline
    let cluster: KafkaCluster
    let topics: Topics
    let processor: BatchProcessor
    let scanner: OutputScanner
    var producer: KafkaProducer
    let events: KafkaConsumer
    let config: KafkaConsumer

    var directory: ConfigDirectory
    var ownedEventPartitions: [TopicPartition]
    var configPartitions: [TopicPartition]
    var outputPartitions: [TopicPartition]
    /// Next offset to commit per input partition (what the state store holds).
    var committed: [PartitionKey: Int64]
    /// Outputs of an unfinished batch found in the output topics at start-up; skipped when re-rendered.
    var recovered: Set<OutputIdentity>
    var recoveryHorizon: [PartitionKey: Int64]
    var lastHousekeeping = ContinuousClock.now
    var lastExpiry = ContinuousClock.now - .seconds(3600)

    private var logger: Logger { pipeline.log }
    private var store: StateStore { pipeline.state }
    private var metrics: PipelineMetrics { pipeline.counters }
    private var health: HealthState { pipeline.health }
    private var timeout: Duration { pipeline.configuration.kafkaRequestTimeout }

    static func start(pipeline: Pipeline, cluster: KafkaCluster) async throws -> RunState {
        let configuration = pipeline.configuration
        let logger = pipeline.log
        let store = pipeline.state
        let topics = configuration.topics

        let directory: ConfigDirectory
        let committed: [PartitionKey: Int64]
        do {
            directory = try ConfigDirectory.load(from: store, logger: logger)
            committed = try store.offsets()
        } catch {
            throw PipelineError.state(error.description)
        }
        logger.info("state loaded", metadata: [
            "devices": "\(directory.deviceCount)", "addressKeys": "\(directory.keyCount)",
            "stateFile": "\(store.path)", "ownership": "\(configuration.ownership)",
        ])

        func partitions(_ topic: String) async throws -> [TopicPartition] {
            var attempt = 0
            while true {
                if let count = try await cluster.partitionCount(topic: topic, timeout: configuration.kafkaRequestTimeout), count > 0 {
                    return (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
                }
                attempt += 1
                if attempt == 1 {
                    // A request naming the topic creates it where the broker auto-creates topics (the development
                    // broker does); elsewhere it must be created by the operator, and we wait, unready, until it is.
                    _ = try? await cluster.endOffsets([TopicPartition(topic: topic, partition: 0)], timeout: configuration.kafkaRequestTimeout)
                    continue
                }
                pipeline.health.setReady(false, "waiting for topic \(topic) to exist")
                if attempt == 2 { logger.warning("topic does not exist yet; waiting", metadata: ["topic": "\(topic)"]) }
                try await Task.sleep(for: .seconds(1))
            }
        }
        let eventPartitions = try await partitions(topics.events)
        let owned = eventPartitions.filter { configuration.ownership.owns(partition: $0.partition) }
        let configPartitions = try await partitions(topics.devices) + (try await partitions(topics.addressKeys))
        let outputPartitions = try await partitions(topics.jobs) + (try await partitions(topics.deadLetters))
        if owned.isEmpty {
            logger.warning("this instance owns no event partition", metadata: [
                "partitions": "\(eventPartitions.count)", "ownership": "\(configuration.ownership)",
            ])
        }

        let producer = try PipelineError.creatingClient { () throws(KafkaError) in
            try KafkaProducer(configuration: configuration.producerKafka)
        }
        let eventsConsumer = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaConsumer(configuration: configuration.kafka) }
        let configConsumer = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaConsumer(configuration: configuration.kafka) }

        var run = RunState(
            pipeline: pipeline, cluster: cluster, topics: topics,
            processor: BatchProcessor(
                topics: topics, renderer: JobRenderer(options: configuration.render),
                sponsorWebhookURL: configuration.render.sponsorWebhookURL),
            scanner: OutputScanner(kafka: configuration.kafka, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout),
            producer: producer, events: eventsConsumer, config: configConsumer,
            directory: directory, ownedEventPartitions: owned, configPartitions: configPartitions,
            outputPartitions: outputPartitions, committed: committed, recovered: [], recoveryHorizon: [:])

        try await run.pinStartOffsets()
        try run.config.assign(Dictionary(uniqueKeysWithValues: configPartitions.map { partition in
            (partition, run.committed[PartitionKey(partition)].map(StartOffset.offset) ?? .beginning)
        }))
        try run.events.assign(Dictionary(uniqueKeysWithValues: owned.map { partition in
            (partition, StartOffset.offset(run.committed[PartitionKey(partition)]!))
        }))

        try await run.retrying("catching up with the config topics") { run in
            try await run.catchUpConfig()
        }
        try await run.retrying("recovering outputs of an unfinished batch") { run in
            try await run.recover()
        }
        run.health.setReady(true, "config topics caught up")
        logger.info("ready", metadata: [
            "ownedEventPartitions": "\(owned.map(\.partition))", "devices": "\(run.directory.deviceCount)",
            "addressKeys": "\(run.directory.keyCount)",
        ])
        return run
    }

    func close() {
        events.close()
        config.close()
    }

    // MARK: Main loop

    mutating func loop(until shouldStop: @Sendable () -> Bool) async throws {
        while !shouldStop() {
            health.beat()
            let records = try await events.poll(maxRecords: pipeline.configuration.maxBatchSize, timeout: .milliseconds(100))
            if records.isEmpty {
                try await retrying("idle housekeeping", until: shouldStop) { run in try await run.idle() }
                continue
            }
            let started = ContinuousClock.now
            let finished = try await retrying("processing a batch of \(records.count) events", until: shouldStop) { run in
                try await run.process(records)
            }
            guard finished else { break }
            metrics.batchDuration.record(duration: ContinuousClock.now - started)
            metrics.batchSize.record(records.count)
            if !health.isReady { health.setReady(true, "processing") }
        }
        logger.info("stopping: no batch in flight, everything delivered is committed")
    }

    /// Retries `body` with capped exponential backoff while Kafka or the network fails, reporting unready meanwhile.
    /// Returns false if `shouldStop` turned true before it succeeded (the work is left to recovery).
    @discardableResult
    mutating func retrying(
        _ what: String, until shouldStop: @Sendable () -> Bool = { false },
        _ body: (inout RunState) async throws -> Void
    ) async throws -> Bool {
        var attempt = 0
        while true {
            do {
                try await body(&self)
                return true
            } catch let error as PipelineError {
                throw error
            } catch let error as StateError {
                throw PipelineError.state(error.description)
            } catch let error as KafkaError where error.isFatal {
                throw PipelineError.kafka("\(what): \(error)")
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                if shouldStop() { return false }
                try await backoff(&attempt, what, error)
                if shouldStop() { return false }
            }
        }
    }

    // MARK: Events

    mutating func process(_ records: [KafkaRecord]) async throws {
        let clock = ContinuousClock()
        let started = clock.now
        // Config acknowledged before these events were published must apply to them (CONTRACT §8).
        try await catchUpConfig()
        let configDone = clock.now

        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let store = self.store
        // Not before the expiry horizon: after a forward clock jump the unexpired entries still count.
        let windowStart = min(now - pipeline.configuration.dedupeWindowSeconds * 1000, try store.dedupeHorizonMs() ?? .max)
        let batch = try await processor.process(records, directory: directory, nowMs: now) { keys throws(StateError) in
            try store.processedEmails(among: keys, sinceMs: windowStart)
        }

        let rendered = clock.now
        let pending = batch.outputs.filter { !recovered.contains($0.identity) }
        if pending.count < batch.outputs.count {
            metrics.recoveredOutputs.increment(by: batch.outputs.count - pending.count)
            logger.notice("skipped outputs already written before a restart", metadata: ["count": "\(batch.outputs.count - pending.count)"])
        }
        let marks = try await deliver(pending)
        let delivered = clock.now

        var offsets: [PartitionKey: Int64] = [:]
        for record in records {
            let key = PartitionKey(topic: record.topic, partition: record.partition)
            offsets[key] = max(offsets[key] ?? 0, record.offset + 1)
        }
        do {
            try store.commitEventBatch(offsets: offsets, processedEmails: batch.processedEmails, processedAtMs: now, outputMarks: marks)
        } catch {
            throw PipelineError.state(error.description)
        }
        committed.merge(offsets) { _, new in new }
        dropRecoveredOutputsBehindCommit()

        metrics.eventsReceived.increment(by: records.count)
        metrics.duplicateEvents.increment(by: batch.duplicates)
        metrics.notificationsFiltered.increment(by: batch.filteredNotifications)
        metrics.webhookWithoutEndpoint.increment(by: batch.webhookWithoutEndpoint)
        if batch.webhookWithoutEndpoint > 0 {
            logger.warning("sponsor webhook devices got no job: no --sponsor-webhook-url configured", metadata: ["devices": "\(batch.webhookWithoutEndpoint)"])
        }
        for output in batch.outputs {
            switch output.kind {
            case .job(_, let platform):
                metrics.jobsProduced(platform: platform).increment()
            case .deadLetter(let reason, let category):
                metrics.deadLetter(reason: category).increment()
                logger.notice("event dead-lettered", metadata: ["source": "\(output.source.headerValue)", "reason": "\(reason)"])
            }
        }
        logger.debug("batch committed", metadata: [
            "events": "\(records.count)", "outputs": "\(batch.outputs.count)", "duplicates": "\(batch.duplicates)",
            "configMs": "\((configDone - started).milliseconds)", "renderMs": "\((rendered - configDone).milliseconds)",
            "prepareMs": "\(batch.prepareTime.milliseconds)", "sealMs": "\(batch.renderTime.milliseconds)",
            "deliverMs": "\((delivered - rendered).milliseconds)", "commitMs": "\((clock.now - delivered).milliseconds)",
        ])
    }

    /// Produces `outputs` until every one is acknowledged. After a failure it reads the output topics back
    /// before producing again, so an output that did reach Kafka is never written twice.
    /// Returns the new output marks (one past the last offset written per output partition).
    mutating func deliver(_ outputs: [Output]) async throws -> [PartitionKey: Int64] {
        var pending = outputs
        var marks: [PartitionKey: Int64] = [:]
        var mustScan = false
        var attempt = 0
        while true {
            if mustScan {
                do {
                    let storedMarks = try store.outputMarks()
                    let scan = try await scanner.scan(
                        from: storedMarks, outputPartitions: outputPartitions, eventsTopic: topics.events,
                        committed: committed, owned: { pipeline.configuration.ownership.owns(partition: $0) })
                    let before = pending.count
                    pending.removeAll { scan.found.contains($0.identity) }
                    if before > pending.count {
                        logger.notice("outputs of a failed delivery had reached Kafka; not producing them again", metadata: ["count": "\(before - pending.count)"])
                    }
                    // Nothing of ours is in flight now: everything up to these ends is settled.
                    marks.merge(scan.ends) { max($0, $1) }
                    mustScan = false
                } catch let error as StateError {
                    throw PipelineError.state(error.description)
                } catch {
                    try await backoff(&attempt, "reading back the output topics", error)
                    continue
                }
            }
            if pending.isEmpty { return marks }

            var failed: [Output] = []
            var lastError: (any Error)?
            do {
                let results = try await producer.send(pending.map(\.record), timeout: pipeline.configuration.deliveryTimeout)
                for (output, result) in zip(pending, results) {
                    if let error = result.error {
                        failed.append(output)
                        lastError = error
                    } else {
                        let key = PartitionKey(topic: output.record.topic, partition: result.partition)
                        marks[key] = max(marks[key] ?? 0, result.offset + 1)
                    }
                }
            } catch {
                failed = pending
                lastError = error
            }
            if failed.isEmpty { return marks }
            metrics.deliveryRetries.increment()
            if let error = lastError as? KafkaError, error.isFatal {
                // A fatal idempotence error poisons the producer: start a fresh one (its sequence numbers restart).
                logger.error("producer failed fatally; replacing it", metadata: ["error": "\(error)"])
                producer = try KafkaProducer(configuration: pipeline.configuration.producerKafka)
            }
            pending = failed
            mustScan = true
            try await backoff(&attempt, "delivering \(failed.count) outputs", lastError)
        }
    }

    /// Capped exponential backoff (0.2 s … 5 s), reporting unready with the reason meanwhile.
    private func backoff(_ attempt: inout Int, _ what: String, _ error: (any Error)?) async throws {
        attempt += 1
        let delay = min(5000, 100 << min(attempt, 6))
        health.setReady(false, "\(what) failed: \(error.map { "\($0)" } ?? "unknown error")")
        logger.warning("retrying after a failure", metadata: [
            "while": "\(what)", "error": "\(error.map { "\($0)" } ?? "-")", "attempt": "\(attempt)", "retryInMs": "\(delay)",
        ])
        try await Task.sleep(for: .milliseconds(delay))
    }

    // MARK: Recovery

    /// Reads back what an earlier run wrote for events it had not committed.
    mutating func recover() async throws {
        let marks = try store.outputMarks()
        let scan = try await scanner.scan(
            from: marks, outputPartitions: outputPartitions, eventsTopic: topics.events, committed: committed,
            owned: { pipeline.configuration.ownership.owns(partition: $0) })
        recovered = scan.found
        recoveryHorizon = scan.horizon
        if scan.found.isEmpty {
            // Nothing of ours is unsettled: later scans can start at today's ends.
            try store.setOutputMarks(scan.ends)
        } else {
            logger.notice("found outputs of an unfinished batch; they will not be produced again", metadata: [
                "outputs": "\(scan.found.count)",
                "eventPartitions": "\(scan.horizon.keys.sorted().map(\.description))",
            ])
        }
    }

    private mutating func dropRecoveredOutputsBehindCommit() {
        guard !recoveryHorizon.isEmpty else { return }
        recoveryHorizon = recoveryHorizon.filter { key, horizon in (committed[key] ?? 0) <= horizon }
        if recoveryHorizon.isEmpty {
            recovered = []
            logger.info("recovery complete: every unfinished batch is committed")
        }
    }

    // MARK: Start offsets

    /// Resolves `earliest`/`latest` to concrete offsets and stores them before anything is read, so a crash
    /// before the first commit cannot move the starting point.
    mutating func pinStartOffsets() async throws {
        let missing = ownedEventPartitions.filter { committed[PartitionKey($0)] == nil }
        guard !missing.isEmpty else { return }
        var pinned: [PartitionKey: Int64] = [:]
        try await retrying("reading start offsets") { run in
            let offsets = switch run.pipeline.configuration.initialPosition {
            case .earliest: try await run.cluster.beginningOffsets(missing, timeout: run.timeout)
            case .latest: try await run.cluster.endOffsets(missing, timeout: run.timeout)
            }
            pinned = Dictionary(uniqueKeysWithValues: offsets.map { (PartitionKey($0.key), $0.value) })
        }
        do {
            try store.setOffsets(pinned)
        } catch {
            throw PipelineError.state(error.description)
        }
        committed.merge(pinned) { _, new in new }
        logger.info("new event partitions start at their \(pipeline.configuration.initialPosition.rawValue) offset", metadata: [
            "offsets": "\(pinned.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" })",
        ])
    }

    // MARK: Config topics

    /// Reads the config topics up to their current ends and applies what it read.
    mutating func catchUpConfig() async throws {
        let ends = try await cluster.endOffsets(configPartitions, timeout: timeout)
        var behind = ends.filter { (committed[PartitionKey($0.key)] ?? 0) < $0.value }
        var idlePolls = 0
        while !behind.isEmpty {
            let records = try await config.poll(maxRecords: 5000, timeout: .milliseconds(100))
            if records.isEmpty {
                idlePolls += 1
                if idlePolls % 20 == 0 {
                    // Retention may have removed what we expected to read: the log start is then as far as it goes.
                    let starts = try await cluster.beginningOffsets(Array(behind.keys), timeout: timeout)
                    for (partition, start) in starts where start >= behind[partition]! { behind[partition] = nil }
                }
                continue
            }
            idlePolls = 0
            try applyConfig(records)
            behind = behind.filter { (committed[PartitionKey($0.key)] ?? 0) < $0.value }
        }
    }

    mutating func applyConfig(_ records: [KafkaRecord]) throws {
        var changes: [ConfigChange] = []
        var offsets: [PartitionKey: Int64] = [:]
        for record in records {
            let meaning = ConfigRecordMeaning.of(record, topics: topics)
            offsets[PartitionKey(topic: record.topic, partition: record.partition)] = record.offset + 1
            let source = "\(record.topic)/\(record.partition)/\(record.offset)"
            switch meaning {
            case .skipped(let reason):
                metrics.configRecord(topic: record.topic, result: "skipped").increment()
                logger.warning("config record skipped; the previous registration stays in force", metadata: ["source": "\(source)", "reason": "\(reason)"])
                continue
            case .device(let registration, _) where registration.filter.invalidRuleCount > 0:
                metrics.invalidFilterRules.increment(by: registration.filter.invalidRuleCount)
                logger.warning("device filter has rules that never match (unparsable or unsupported operator)", metadata: [
                    "deviceId": "\(registration.deviceId)", "invalidRules": "\(registration.filter.invalidRuleCount)",
                ])
            case .key(.rejected(let reason), let address, _, _):
                metrics.rejectedKeys.increment()
                logger.warning("address key rejected; events for the address go to the dead-letter topic until a usable key arrives", metadata: [
                    "emailAddressId": "\(address)", "reason": "\(reason)",
                ])
            default:
                break
            }
            metrics.configRecord(topic: record.topic, result: "applied").increment()
            meaning.apply(to: &directory)
            if let change = meaning.stateChange { changes.append(change) }
        }
        do {
            try store.applyConfig(changes, offsets: offsets)
        } catch {
            throw PipelineError.state(error.description)
        }
        committed.merge(offsets) { _, new in new }
    }

    // MARK: Housekeeping

    mutating func idle() async throws {
        // Config that arrives while no events do is applied at once, so readiness and restarts see it.
        let records = try await config.poll(maxRecords: 5000, timeout: .zero)
        if !records.isEmpty { try applyConfig(records) }

        guard ContinuousClock.now - lastHousekeeping > .seconds(5) else { return }
        lastHousekeeping = .now
        let ends = try await cluster.endOffsets(ownedEventPartitions, timeout: timeout)
        for (partition, end) in ends {
            metrics.lag(topic: partition.topic, partition: partition.partition)
                .record(max(0, end - (committed[PartitionKey(partition)] ?? end)))
        }
        if recovered.isEmpty {
            // Idle and nothing unsettled: move the marks up so a future recovery reads little.
            let outputEnds = try await cluster.endOffsets(outputPartitions, timeout: timeout)
            try store.setOutputMarks(Dictionary(uniqueKeysWithValues: outputEnds.map { (PartitionKey($0.key), $0.value) }))
        }
        if ContinuousClock.now - lastExpiry > .seconds(60) {
            lastExpiry = .now
            let windowMs = pipeline.configuration.dedupeWindowSeconds * 1000
            // Twice the run interval: expiry keeps up with real time but a wall-clock jump cannot drop the window.
            let cutoff = try store.advanceDedupeHorizon(
                towardMs: Int64(Date().timeIntervalSince1970 * 1000) - windowMs, windowMs: windowMs, maxAdvanceMs: 120_000)
            var expired = 0
            while true {
                let batch = try store.expireProcessedEmails(beforeMs: cutoff)
                expired += batch
                if batch == 0 { break }
                await Task.yield()
            }
            if expired > 0 {
                metrics.expiredDedupeEntries.increment(by: expired)
                logger.info("expired dedupe entries", metadata: ["count": "\(expired)"])
            }
            metrics.dedupeEntries.record(try store.processedEmailCount())
        }
        if !health.isReady { health.setReady(true, "idle, config caught up") }
    }
}

extension PartitionKey {
    init(_ partition: TopicPartition) {
        self.init(topic: partition.topic, partition: partition.partition)
    }
}

extension Duration {
    var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
}
