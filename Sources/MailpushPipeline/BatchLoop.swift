import Foundation
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState
import Synchronization

extension PipelineRun {
    /// Polls events and processes them batch by batch; idle polls do housekeeping.
    ///
    /// While a batch is delivered and committed, the next one is polled, planned and its first round rendered
    /// (`Lookahead`): sealing, the main cost, overlaps the wait for the broker's acknowledgements and the
    /// commit. Outputs are still produced and committed one batch after the other, in poll order, so crash
    /// recovery sees exactly what it saw without the overlap (docs/exactly-once.md).
    mutating func loop(until shouldStop: @Sendable () -> Bool) async throws {
        var prepared: BatchPlan?
        // A batch with outputs written ahead is delivered and committed before a graceful stop.
        while !shouldStop() || prepared?.aheadWrites.isEmpty == false {
            health.beat()
            if owned.hasNews {
                guard
                    try await retrying(
                        "acting on a rebalance", until: shouldStop, { run in try await run.applyGroupChanges(prepared: &prepared) })
                else { break }
            }
            if owned.hasFoundFleetReplays {
                try await retrying("recording fleet replays", until: shouldStop) { run in try run.recordFoundFleetReplays() }
            }
            do {
                guard try await processNext(&prepared, until: shouldStop) else { break }
            } catch let lost as OwnershipLost {
                prepared = nil
                try await abandonBatch(lost)
            }
        }
        try await leaveGroup()
        logger.info("stopping: no batch in flight, everything delivered is committed")
    }

    /// Polls (unless a batch is prepared) and processes one batch; false when stopping.
    private mutating func processNext(_ prepared: inout BatchPlan?, until shouldStop: @Sendable () -> Bool) async throws -> Bool {
        do {
            if prepared == nil {
                let configuration = pipeline.configuration
                let records = try await events.poll(
                    maxRecords: configuration.pollRecords, maxBytes: configuration.maxBatchBytes, timeout: .milliseconds(100))
                if records.isEmpty {
                    try await retrying("idle housekeeping", until: shouldStop) { run in try await run.idle() }
                    try await retrying("replaying", until: shouldStop) { run in try await run.replayStep() }
                    return true
                }
                prepared = try await prepare(records, until: shouldStop)
                guard prepared != nil else { return false }
            }
            let current = prepared!
            prepared = nil
            let started = ContinuousClock.now
            let finished: Bool
            lookForWaitingReplay()
            if mayLookAhead, !shouldStop() {
                let lookahead = Lookahead(run: self)
                let inFlight = current.plannedEmails
                let delivered = DeliveryFinished(events: events)
                let writeAhead = delivery.writeAhead(mayWrite: owned.mayWriteNow)
                async let next = lookahead.prepare(inFlight: inFlight, until: delivered, writingAhead: writeAhead)
                do {
                    defer { delivered.set() }
                    finished = try await retrying("processing a batch of \(current.records.count) events", until: shouldStop) { run in
                        try await run.deliverAndCommit(current, beside: writeAhead)
                    }
                }
                let ahead = await next
                // A stop in the middle leaves what was written ahead to the read-back of the next start, or of the
                // next owner: they must all have landed (or failed) before a release says so.
                if !finished, ahead.wroteAhead { await delivery.settleForReadBack() }
                config = ahead.config
                // A failed poll took nothing: it fails the same way it would have without the lookahead.
                if finished, ahead.records.isEmpty, let error = ahead.error {
                    if ahead.wroteAhead { try await readBackWrittenAhead() }
                    throw error
                }
                if finished, !ahead.records.isEmpty {
                    prepared = try await settle(ahead, after: current, until: shouldStop)
                    guard prepared != nil else { return false }
                }
            } else {
                finished = try await retrying("processing a batch of \(current.records.count) events", until: shouldStop) { run in
                    try await run.deliverAndCommit(current)
                }
            }
            guard finished else { return false }
            metrics.batchDuration.record(duration: ContinuousClock.now - started)
            metrics.batchSize.record(current.records.count)
            let writtenAhead = prepared?.aheadWrites.isEmpty == false
            guard try await retrying("housekeeping", until: shouldStop, { run in try await run.houseKeep(writtenAhead: writtenAhead) })
            else { return false }
            // Replays recorded in the state go between event batches, never between a batch planned ahead
            // and its delivery: this process is their one writer.
            if prepared == nil {
                guard try await retrying("replaying", until: shouldStop, { run in try await run.replayStep() }) else { return false }
            }
            if !health.pipelineReady { health.setReady(true, "processing") }
        }
        return true
    }

    /// Planning ahead needs nothing else to write processed emails between the plan and its delivery: no
    /// replay running, none waiting to be noticed (`replayStep` looks once a second, between batches), and
    /// no unfinished batch being recovered.
    private var mayLookAhead: Bool {
        recovery.isSettled && replays.active == nil && ContinuousClock.now - replays.lastCheck <= .seconds(1)
    }

    /// The once-a-second look for a replay request, done here while events keep coming, so that the lookahead
    /// pauses only when a request waits (`replayStep` starts it after this batch), not every second. A failed
    /// read leaves the look to `replayStep`, which retries.
    private mutating func lookForWaitingReplay() {
        guard replays.active == nil, recovery.eventsSettled, ContinuousClock.now - replays.lastCheck > .seconds(1),
            (try? store.pendingReplays())?.isEmpty == true
        else { return }
        replays.lastCheck = .now
        if !recovery.isSettled { recovery.forgetReplays() }
    }

    /// Config catch-up, plan and first round for `records`, retried while Kafka fails; nil when stopping.
    private mutating func prepare(_ records: [KafkaRecord], until shouldStop: @Sendable () -> Bool) async throws -> BatchPlan? {
        var plan: BatchPlan?
        let prepared = try await retrying("preparing a batch of \(records.count) events", until: shouldStop) { run in
            plan = try await Lookahead(run: run).plan(records, inFlight: [], config: &run.config)
        }
        return prepared ? plan : nil
    }

    /// What a lookahead got, once the batch before it is committed: its plan, or the same records planned
    /// again when the lookahead failed, or when it took an email for a duplicate of one the batch before
    /// meant to process but could not render (that email is not processed after all).
    private mutating func settle(
        _ ahead: Lookahead.Result, after current: BatchPlan, until shouldStop: @Sendable () -> Bool
    ) async throws -> BatchPlan? {
        if let plan = ahead.plan, plan.countedAsInFlight.isDisjoint(with: current.unprocessedPlannedEmails) {
            return plan
        }
        if let error = ahead.error {
            logger.notice("preparing the next batch ahead failed; preparing it again", metadata: ["error": "\(error)"])
        }
        // Planned again, its outputs are made again: those already written must be known not to write them twice.
        if ahead.wroteAhead { try await readBackWrittenAhead() }
        return try await prepare(ahead.records, until: shouldStop)
    }

    /// One planned batch: its rounds rendered and delivered, then one commit of offsets, dedupe entries and marks.
    ///
    /// `nextBatch` lets the batch prepared meanwhile write its outputs ahead, once this one's are all enqueued.
    mutating func deliverAndCommit(_ planned: BatchPlan, beside nextBatch: WriteAhead? = nil) async throws {
        var plan = planned
        let aheadWrites = plan.aheadWrites
        let records = plan.records
        let clock = ContinuousClock()
        var marks: [TopicPartition: Int64] = [:]
        var written = WrittenOutputs()
        var outputCount = 0
        var deliverTime = Duration.zero
        var deadLettered = Set<SourceRef>()
        // In a fleet every output is written under the lease of its partition (docs/exactly-once.md, "A fleet").
        let batchPartitions = Set(records.map(\.partition))
        delivery.writeGate = owned.writeGate(batchPartitions)
        delivery.nextBatch = nextBatch
        delivery.retriedBesideWritesAhead = false
        defer {
            delivery.writeGate = nil
            delivery.nextBatch = nil
        }
        var firstRound = true
        let offsets = records.reduce(into: [TopicPartition: Int64]()) { offsets, record in
            offsets[record.topicPartition] = max(offsets[record.topicPartition] ?? 0, record.offset + 1)
        }
        let fleet = owned.fleet
        let previous = committed
        let processedAtMs = plan.nowMs
        var fleetRecords: BatchStateRecords?
        // Rendered and delivered round by round: one owner with 100,000 devices holds two rounds in memory,
        // not 100,000 jobs. Marks and offsets still commit once, after the last round (docs/exactly-once.md).
        try await processor.renderAndEmit(&plan, roundDevices: Self.roundDevices(processor)) { outputs, finished in
            let isLast = finished != nil
            let deliverStarted = clock.now
            // A fleet's records of this batch are made and encoded while its last round's acknowledgements are
            // awaited: only their marks (the output marks after the commit, which it reads) are made inside the
            // commit, which the next batch waits for.
            async let preparing = finished.flatMap { batch in
                fleet?.batchStateRecords(previous: previous, offsets: offsets, batch: batch, processedAtMs: processedAtMs)
            }
            defer { firstRound = false }
            outputCount += outputs.count
            // An email spread over rounds gets one dead letter at most, whichever round found the problem.
            let outputs = outputs.filter { output in
                guard case .deadLetter = output.kind else { return true }
                return deadLettered.insert(output.source).inserted
            }
            try await owned.checkLeases(batchPartitions)
            let pending = recovery.notYetWritten(outputs)
            if pending.count < outputs.count {
                metrics.recoveredOutputs.increment(by: outputs.count - pending.count)
                logger.notice("skipped outputs already written before a restart", metadata: ["count": "\(outputs.count - pending.count)"])
            }
            let delivered = try await deliverOrDeadLetter(
                pending, records: records, deadLettered: &deadLettered, writtenAhead: firstRound ? aheadWrites : [],
                enqueued: isLast ? nextBatch.map { ahead in { ahead.open() } } : nil)
            marks.merge(delivered.marks) { max($0, $1) }
            written.add(delivered.written(outputs))
            health.beat()
            deliverTime += clock.now - deliverStarted
            if isLast { fleetRecords = await preparing }
        }
        nextBatch?.open()
        let batch = plan.batch
        let deliveredAt = clock.now
        // A retry after a failure lands behind outputs the next batch wrote ahead meanwhile: marks moved past it
        // would pass those too, so this commit leaves the marks where they are.
        let marksMayMove = recovery.isSettled && !delivery.retriedBesideWritesAhead

        let stateRecords =
            fleetRecords
            ?? fleet?.batchStateRecords(previous: previous, offsets: offsets, batch: batch, processedAtMs: processedAtMs)
        var stateMarksJSON: [UInt8]?
        let stateBatch: Int64?
        do {
            // The mark rule: while outputs of an unfinished batch are still pending recovery, marks stay put —
            // this batch may have re-read only part of that batch, and a mark moved past the rest would hide
            // them from the next read-back.
            stateBatch = try store.commitEventBatch(
                offsets: offsets, processedEmails: batch.processedEmails, processedAtMs: plan.nowMs,
                outputMarks: marksMayMove ? marks : [:],
                stateRecords: stateRecords.map { stateRecords in
                    { marks in
                        let json = PartitionStateRecord.encodeMarksJSON(sortedByName: marks)
                        stateMarksJSON = json
                        return UnwrittenStateRecord.Batch(marks: json, records: stateRecords.values)
                    }
                })
        } catch {
            throw PipelineError.state(error)
        }
        committed.merge(offsets) { _, new in new }
        if let stateRecords, let stateMarksJSON {
            owned.publishBatchState(stateRecords.records, marksJSON: stateMarksJSON, stored: stateBatch)
        }
        if recovery.forget(behind: committed) {
            logger.info("recovery complete: every unfinished batch is committed")
        }

        metrics.eventsReceived.increment(by: records.count)
        metrics.duplicateEvents.increment(by: batch.duplicates)
        metrics.notificationsFiltered.increment(by: batch.filteredNotifications)
        metrics.webhookWithoutEndpoint.increment(by: batch.webhookWithoutEndpoint)
        if batch.webhookWithoutEndpoint > 0 {
            // A line per batch would be several a second under a steady load.
            pipeline.recordLog.log(
                .warning, "sponsor webhook devices got no job: no --sponsor-webhook-url configured",
                countedIn: "mailpush_webhook_devices_without_endpoint_total counts every device",
                metadata: ["devices": "\(batch.webhookWithoutEndpoint)"])
        }
        for (platform, count) in written.jobsByPlatform {
            metrics.jobsProduced(platform: platform).increment(by: count)
        }
        for output in written.deadLetters {
            guard case .deadLetter(let reason, let detail) = output.kind else { continue }
            metrics.deadLetter(reason).increment()
            pipeline.recordLog.log(
                .notice, "event dead-lettered", of: ("reason", reason.rawValue),
                countedIn: "every one is on the dead-letter topic with its reason, and in mailpush_dead_letters_total",
                metadata: [
                    "source": "\(output.source.headerValue)", "reason": "\(reason.rawValue)", "detail": "\(detail)",
                ])
        }
        logger.debug(
            "batch committed",
            metadata: [
                "events": "\(records.count)", "outputs": "\(outputCount)", "duplicates": "\(batch.duplicates)",
                "configMs": "\(batch.configTime.millisecondsToATenth)",
                "prepareMs": "\(batch.prepareTime.millisecondsToATenth)", "renderAndSealMs": "\(batch.renderTime.millisecondsToATenth)",
                "deliverMs": "\(deliverTime.millisecondsToATenth)", "commitMs": "\((clock.now - deliveredAt).millisecondsToATenth)",
                "writtenAhead": "\(aheadWrites.reduce(0) { $0 + $1.outputs.count })",
            ])
    }

    static func roundDevices(_ processor: BatchProcessor) -> Int {
        max(4096, processor.parallelism * BatchProcessor.devicesPerSlice)
    }
}

/// Prepares a batch — config catch-up, plan, first round rendered — from values only, so that it can run
/// beside the delivery of the batch before it (which mutates the run's other state).
struct Lookahead: Sendable {
    let events: KafkaConsumer
    let config: ConfigFollower
    let processor: BatchProcessor
    let store: StateStore
    let configuration: PipelineConfiguration
    let metrics: PipelineMetrics

    init(run: PipelineRun) {
        events = run.events
        config = run.config
        processor = run.processor
        store = run.store
        configuration = run.pipeline.configuration
        metrics = run.metrics
    }

    struct Result: Sendable {
        /// The follower after its catch-up: the run takes it back whatever happened.
        var config: ConfigFollower
        /// What the poll took from the events consumer: these must be processed, whatever else failed.
        var records: [KafkaRecord]
        var plan: BatchPlan?
        var error: (any Error)?
        /// Outputs were written ahead: a plan not used as it is must read them back before planning again.
        var wroteAhead = false
    }

    /// Polls the next batch and prepares it; `inFlight` are the emails of the batch being delivered.
    ///
    /// Then, until that batch is committed, it keeps taking the records that arrive and plans and renders
    /// them into the same next batch (while everything so far rendered without failures, up to `--batch-size`
    /// events and `gatheredDevices`): an event that arrives during a delivery goes out right after it, not one
    /// delivery later.
    /// Each chunk is planned as a batch of its own would be — its own config catch-up, the emails planned
    /// before it counted as in flight — so the joined plan decides what one batch of all those records would.
    ///
    /// Through `ahead`, each chunk's outputs are written as soon as it is rendered, while every chunk before it
    /// was (a partition's outputs stay in event order).
    func prepare(inFlight: Set<String>, until delivered: DeliveryFinished, writingAhead ahead: WriteAhead) async -> Result {
        var result = await gather(inFlight: inFlight, until: delivered, writingAhead: ahead)
        result.wroteAhead = ahead.close()
        return result
    }

    private func gather(inFlight: Set<String>, until delivered: DeliveryFinished, writingAhead ahead: WriteAhead) async -> Result {
        var config = self.config
        var records: [KafkaRecord]
        do {
            records = try await events.poll(
                maxRecords: configuration.pollRecords, maxBytes: configuration.maxBatchBytes, timeout: .milliseconds(100))
        } catch {
            return Result(config: config, records: [], plan: nil, error: error)
        }
        guard !records.isEmpty else { return Result(config: config, records: [], plan: nil, error: nil) }
        var lastPollEnded = ContinuousClock.now
        var plan: BatchPlan
        var chunkAhead = ChunkWriteAhead(ahead)
        do {
            plan = try await self.plan(records, inFlight: inFlight, config: &config, writingAhead: chunkAhead)
        } catch {
            return Result(config: config, records: records, plan: nil, error: error)
        }
        var writingAhead = write(&plan, chunk: plan, through: chunkAhead)
        let gatheredDevices = Self.gatheredDevices(processor)
        var gatheredBytes = Self.size(of: records)
        var finished = false
        while !finished, !Task.isCancelled, records.count < configuration.maxBatchSize, gatheredBytes < configuration.maxBatchBytes,
            plan.isRenderedWithoutFailures, plan.deviceCount < gatheredDevices
        {
            // A chunk gathers for a few milliseconds (or 64 records) from its first record: each one costs a
            // config catch-up (a broker round trip) and a plan of its own, and single records at a steady
            // trickle cost more CPU than their earlier start saves in latency. Records a poll finds already
            // waiting arrived while the chunk before was planned and rendered, after the last poll: they have
            // gathered since then, and do not wait again.
            var more: [KafkaRecord] = []
            var firstArrival: ContinuousClock.Instant?
            var moreBytes = 0
            while more.count < Self.chunkRecords, records.count + more.count < configuration.maxBatchSize,
                gatheredBytes + moreBytes < configuration.maxBatchBytes
            {
                let wait = firstArrival.map { max(.zero, Self.chunkGathering - (ContinuousClock.now - $0)) } ?? .milliseconds(10)
                let pollStarted = ContinuousClock.now
                guard
                    let polled = await delivered.pollUnlessSet(
                        maxRecords: min(configuration.pollRecords, configuration.maxBatchSize - records.count - more.count),
                        maxBytes: configuration.maxBatchBytes - gatheredBytes - moreBytes, timeout: wait)
                else {
                    finished = true
                    break
                }
                let pollEnded = ContinuousClock.now
                if firstArrival == nil, !polled.isEmpty {
                    firstArrival = pollEnded - pollStarted < Self.alreadyWaiting ? lastPollEnded : pollEnded
                }
                lastPollEnded = pollEnded
                more += polled
                moreBytes += Self.size(of: polled)
                if let firstArrival, ContinuousClock.now - firstArrival >= Self.chunkGathering { break }
            }
            guard !more.isEmpty else { continue }
            records += more
            gatheredBytes += moreBytes
            chunkAhead = ChunkWriteAhead(ahead)
            do {
                let extra = try await self.plan(
                    more, inFlight: inFlight, plannedBefore: plan.plannedEmails, config: &config,
                    writingAhead: writingAhead ? chunkAhead : nil)
                plan.extend(with: extra)
                if writingAhead { writingAhead = write(&plan, chunk: extra, through: chunkAhead) }
            } catch {
                return Result(config: config, records: records, plan: nil, error: error)
            }
        }
        return Result(config: config, records: records, plan: plan, error: nil)
    }

    /// Writes what is left of `chunk`'s outputs ahead (the last part of `plan`) if its first round is all of it and
    /// `ahead` lets them, after the pieces written while it rendered; false if they were not all written.
    private func write(_ plan: inout BatchPlan, chunk: BatchPlan, through ahead: ChunkWriteAhead) -> Bool {
        let finished = ahead.finish(processor.outputsOfWholeFirstRound(chunk), partitions: Set(chunk.records.map(\.partition)))
        plan.aheadWrites += ahead.writes
        return finished
    }

    static let chunkRecords = 64
    static let chunkGathering = Duration.milliseconds(3)
    /// A poll that returns records sooner than this found them waiting.
    static let alreadyWaiting = Duration.microseconds(300)

    /// The bytes of `records`' keys and values: what a gathered batch holds until it is committed.
    static func size(of records: [KafkaRecord]) -> Int {
        records.reduce(0) { $0 + ($1.key?.count ?? 0) + ($1.value?.count ?? 0) }
    }

    /// Most devices a batch gathers while the one before it is delivered: four rounds (16,384 jobs, about 25 MB of
    /// rendered jobs, on up to 8 cores), all of it its first round, held until its delivery. With one round, every
    /// event that arrived once about 1,400 had gathered (three devices each) waited for the commit of the batch
    /// before, when the development broker took 250–380 ms to acknowledge it (docs/performance.md, session 27).
    static func gatheredDevices(_ processor: BatchProcessor) -> Int { 4 * PipelineRun.roundDevices(processor) }

    /// - Parameter ahead: writes the chunk's outputs ahead in pieces while it renders, once its config is confirmed.
    func plan(
        _ records: [KafkaRecord], inFlight: Set<String>, plannedBefore: Set<String> = [], config: inout ConfigFollower,
        writingAhead ahead: ChunkWriteAhead? = nil
    ) async throws -> BatchPlan {
        let clock = ContinuousClock()
        let started = clock.now
        let nowMs = Int64(Date().timeIntervalSince1970 * 1000)
        for record in records {
            if let timestampMs = record.timestampMs { metrics.eventAgeAtPlanning.recordMilliseconds(max(0, nowMs - timestampMs)) }
        }
        // Config acknowledged before these events were published must apply to them (CONTRACT §8): it lies below
        // the config partitions' ends asked for after the events were polled. While config is quiet the batch is
        // planned and its first round rendered during that round trip, and kept if the ends show nothing new
        // (a steady load's chunk no longer waits a broker round trip before its sealing starts).
        if config.isQuiet {
            // Asked before the render takes every cooperative thread: a child task would send the request
            // only once one is free, and the chunk's pieces wait for the answer (`ChunkWriteAhead`).
            let confirmed = ahead?.configConfirmed
            let isCaughtUp = config.caughtUpTest
            let asked = config.startCurrentEnds { ends in if isCaughtUp(ends) { confirmed?.set() } }
            var plan = try await planWithCurrentConfig(
                records, inFlight: inFlight, plannedBefore: plannedBefore, config: config, writingAhead: ahead)
            let waitStarted = clock.now
            let ends = try await asked.value()
            if config.isCaughtUp(to: ends) {
                plan.batch.configTime = clock.now - waitStarted
                return plan
            }
            try await config.catchUp(to: ends)
        } else {
            try await config.catchUp()
        }
        let configTime = clock.now - started
        ahead?.configConfirmed.set()
        var plan = try await planWithCurrentConfig(
            records, inFlight: inFlight, plannedBefore: plannedBefore, config: config, writingAhead: ahead)
        plan.batch.configTime = configTime
        return plan
    }

    /// Plans `records` with the config applied so far and renders the plan's first round.
    private func planWithCurrentConfig(
        _ records: [KafkaRecord], inFlight: Set<String>, plannedBefore: Set<String>, config: ConfigFollower,
        writingAhead ahead: ChunkWriteAhead?
    ) async throws -> BatchPlan {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let store = self.store
        let windowMs = configuration.dedupeWindowSeconds * 1000
        let directory = config.directory
        var plan = try processor.plan(
            records, nowMs: now,
            config: { owners, addresses throws(StateError) in try directory.view(owners: owners, addresses: addresses) },
            alreadyProcessed: { keys throws(StateError) in try store.processedEmails(among: keys, nowMs: now, windowMs: windowMs) },
            inFlight: inFlight, plannedBefore: plannedBefore)
        await processor.renderFirstRound(
            &plan, roundDevices: PipelineRun.roundDevices(processor), offer: ahead.map { ahead in ahead.offer })
        return plan
    }
}

/// Tells a lookahead that the batch in flight is committed (or given up on), so that it stops taking more
/// records and hands over what it has. A poll in progress is woken; one about to start is not begun: the
/// lookahead marks that it polls before it looks at the flag, `set` sets the flag before it looks for a
/// poll, so at least one of them sees the other.
final class DeliveryFinished: Sendable {
    private let events: KafkaConsumer
    private let finished = Atomic<Bool>(false)
    private let polling = Atomic<Bool>(false)

    init(events: KafkaConsumer) { self.events = events }

    func set() {
        finished.store(true, ordering: .sequentiallyConsistent)
        if polling.load(ordering: .sequentiallyConsistent) { events.wake() }
    }

    /// Records that arrived (waiting up to `timeout` for one), [] if none did; nil once set, or when the
    /// consumer has a failure for the batch loop's own poll to throw.
    func pollUnlessSet(maxRecords: Int, maxBytes: Int, timeout: Duration) async -> [KafkaRecord]? {
        polling.store(true, ordering: .sequentiallyConsistent)
        defer { polling.store(false, ordering: .sequentiallyConsistent) }
        guard !finished.load(ordering: .sequentiallyConsistent) else { return nil }
        return await events.pollKeepingFailures(maxRecords: maxRecords, maxBytes: maxBytes, timeout: timeout)
    }
}

/// What a batch wrote, for the metrics and dead-letter log lines after its commit: counts of jobs, and the
/// dead letters themselves (one per event at most, small).
private struct WrittenOutputs {
    var jobsByPlatform: [String: Int] = [:]
    var deadLetters: [Output] = []

    mutating func add(_ outputs: [Output]) {
        for output in outputs {
            switch output.kind {
            case .job(_, let platform): jobsByPlatform[platform, default: 0] += 1
            case .deadLetter: deadLetters.append(output)
            }
        }
    }
}
