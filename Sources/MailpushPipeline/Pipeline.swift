import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// The service: reads `email.received` and the two config topics, writes push jobs and dead letters,
/// and keeps every input offset in the state store in the same transaction as what it produced.
///
/// Exactly once rests on three things (docs/exactly-once.md has the argument):
/// 1. a batch's offsets, dedupe entries and output marks commit together, after all its outputs are acknowledged;
/// 2. on start-up and after a failed delivery, the output topics are read back from the marks, and an output
///    already there (same source record, same jobId) is not produced again;
/// 3. marks only move past outputs whose batch has committed.
///
/// docs/architecture.md maps the files: one run is a `PipelineRun` (PipelineRun.swift), started in
/// Startup.swift, turning in BatchLoop.swift.
public final class Pipeline: Sendable {
    public let configuration: PipelineConfiguration
    public let health: HealthState
    let store: StateStore
    let logger: Logger
    /// Lines about single records, a few of each kind at a time.
    let recordLog: RecordLog
    let metrics = PipelineMetrics()

    /// `health` is passed in when /readyz must answer before the pipeline exists (the HTTP port is bound first).
    public init(configuration: PipelineConfiguration, store: StateStore, logger: Logger, health: HealthState = HealthState()) {
        self.configuration = configuration
        self.health = health
        self.store = store
        self.logger = logger
        recordLog = RecordLog(logger: logger)
        metrics.announce(topics: [configuration.topics.devices, configuration.topics.addressKeys])
    }

    /// Runs until `shouldStop` turns true between batches (graceful shutdown: the batch in flight is finished,
    /// delivered and committed first) or the task is cancelled (nothing half-committed: recovery covers it).
    public func run(startupTimeout: Duration, until shouldStop: @escaping @Sendable () -> Bool) async throws {
        let cluster = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaCluster(configuration: configuration.kafka) }
        do {
            try await cluster.waitUntilReachable(timeout: startupTimeout, stopWaiting: shouldStop)
        } catch {
            // Stopped while waiting for the broker: nothing was started, so nothing is left to finish.
            if shouldStop() || Task.isCancelled { return }
            throw PipelineError.brokerUnreachable("\(configuration.kafka.bootstrapServers): \(error)")
        }
        defer { recordLog.flush(all: true) }
        var run = try await PipelineRun.start(pipeline: self, cluster: cluster)
        defer { run.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.checkpointContinually() }
            group.addTask { [recordLog] in
                while (try? await Task.sleep(for: .seconds(1))) != nil { recordLog.flush() }
            }
            let fleetWriters = run.owned.fleet.map { ($0.writer, $0.statePublisher) }
            group.addTask { await self.expireDedupeContinually(fleet: fleetWriters) }
            if let fleet = run.owned.fleet {
                let publisher = fleet.statePublisher
                let interval = min(Self.stateCheckpointInterval, expiryInterval)
                group.addTask {
                    while (try? await Task.sleep(for: interval)) != nil { _ = await publisher.checkpoint() }
                }
                let logger = self.logger
                let events = run.events
                group.addTask {
                    await fleet.leases.renewContinually(
                        onFenced: { claimants in
                            logger.warning(
                                "a newer owner claimed event partitions; writing nothing more for them",
                                metadata: [
                                    "partitions": "\(claimants.keys.sorted())",
                                    // Another deployment sharing the state topic shows here by its host names.
                                    "claimedBy": "\(Set(claimants.values).sorted())",
                                ])
                            events.wake()
                        }, log: { logger.warning("\($0)") })
                }
            }
            try await run.loop(until: shouldStop)
            group.cancelAll()
        }
    }

    /// Keeps the state's write-ahead log short off the batch loop's path (`StateStore.checkpoint`); a failure
    /// is logged (once a minute at most) and tried again, SQLite's own checkpoint being the fallback.
    private func checkpointContinually() async {
        var lastWarning: ContinuousClock.Instant?
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: .milliseconds(500))
                try await store.checkpoint()
            } catch is CancellationError {
                return
            } catch {
                if lastWarning.map({ ContinuousClock.now - $0 > .seconds(60) }) ?? true {
                    lastWarning = .now
                    logger.warning("state checkpoint failed; commits will checkpoint instead", metadata: ["error": "\(error)"])
                }
            }
        }
    }

    /// How often an owner writes a checkpoint of each partition that changed (also before each expiry run that
    /// deletes records): a successor's read-back starts at most this long (plus the batches since) before the
    /// end of what the owner wrote.
    static let stateCheckpointInterval = Duration.seconds(30)

    /// Every minute, or four times per dedupe window when that is shorter (a short window is a test's).
    var expiryInterval: Duration { Self.expiryInterval(windowSeconds: configuration.dedupeWindowSeconds) }

    static func expiryInterval(windowSeconds: Int64) -> Duration {
        max(.seconds(1), min(.seconds(60), .seconds(windowSeconds) / 4))
    }

    /// How many expiry runs one sweep of the dedupe window takes: a pass every seventh of the window (a day, with the
    /// default week), so that a page holds about a seventh of its entries expired when the sweep writes it, and an
    /// entry outlives its window by a seventh at most (lookups ignore it meanwhile). At least one run (a window
    /// shorter than 14 minutes is swept whole at every run), at most 4,096.
    static func dedupeSweepSlices(windowSeconds: Int64) -> Int {
        let runsPerSeventh = windowSeconds / 7 / max(1, expiryInterval(windowSeconds: windowSeconds).components.seconds)
        return Int(max(1, min(Int64(1 << 12), runsPerSeventh)))
    }

    /// Expires the dedupe window 5 s after start and then every minute, beside the batch loop rather than in it: a
    /// busy service may never have an idle moment. Each run sweeps the next slice of the keys (`dedupeSweepSlices`)
    /// in pieces of 2,000 keys (about 25 pages), each taking SQLite's writer for a few milliseconds, 5 ms apart, so
    /// that commits slip in between. The first slice comes from the wall clock, so that a service restarted often
    /// still goes round. Only entries below the new horizon go: a dedupe lookup that races a piece answers, for each
    /// email, what it would have answered just before or just after the expiry, both at the window's edge. A failure
    /// is logged and tried again next run.
    private func expireDedupeContinually(fleet: (writer: StateWriter, publisher: BatchStatePublisher)?) async {
        let windowMs = configuration.dedupeWindowSeconds * 1000
        let slices = Self.dedupeSweepSlices(windowSeconds: configuration.dedupeWindowSeconds)
        var slice = Int(Int64(Date().timeIntervalSince1970) / max(1, expiryInterval.components.seconds) % Int64(slices))
        var delay = min(.seconds(5), expiryInterval)
        while true {
            do { try await Task.sleep(for: delay) } catch { return }
            delay = expiryInterval
            do {
                // Letting the horizon advance twice the interval per run keeps up with real time while a wall-clock
                // jump cannot drop the window at once (StateStore.advanceDedupeHorizon).
                let cutoff = try store.advanceDedupeHorizon(
                    towardMs: Int64(Date().timeIntervalSince1970 * 1000) - windowMs, windowMs: windowMs,
                    maxAdvanceMs: expiryInterval.milliseconds * 2)
                let swept = try await store.expireProcessedEmails(slice: slice, of: slices, beforeMs: cutoff, pause: .milliseconds(5))
                slice = (slice + 1) % slices
                if let fleet {
                    try await deleteStateRecords(fleet.writer, fleet.publisher, beforeMs: cutoff)
                }
                if swept.expired > 0 {
                    metrics.expiredDedupeEntries.increment(by: swept.expired)
                    logger.info("expired dedupe entries", metadata: ["count": "\(swept.expired)"])
                }
                // Keys are hashes, spread evenly over the slices: the slice just swept tells the window's size without
                // counting the whole table (seconds of CPU a minute with tens of millions of entries).
                metrics.dedupeEntries.record(swept.kept * slices)
            } catch is CancellationError {
                return
            } catch {
                logger.warning("dedupe expiry failed; trying again in a minute", metadata: ["error": "\(error)"])
            }
        }
    }

    /// In a fleet: the owned partitions' records no longer needed are deleted from the state topic (tombstones),
    /// so that compaction keeps about one dedupe window of them: batch records whose dedupe entries expired, once
    /// a checkpoint at or past them is acknowledged (written first, here), and replays' superseded or finished
    /// records (requests before progress).
    private func deleteStateRecords(_ writer: StateWriter, _ publisher: BatchStatePublisher, beforeMs cutoff: Int64) async throws {
        let events = configuration.topics.events
        let acknowledged = await publisher.checkpoint()
        var deleted = 0
        for progress in [false, true] {
            while !Task.isCancelled {
                let checkpoints = Dictionary(
                    uniqueKeysWithValues: writer.leases.owned.map { (TopicPartition(topic: events, partition: $0), acknowledged[$0] ?? -1) }
                )
                let records = try store.deletableStateRecords(checkpoints: checkpoints, beforeMs: cutoff, progress: progress, limit: 500)
                if records.isEmpty { break }
                try await writer.publishTombstones(records.map { ($0.partition.partition, $0.key) })
                try store.forgetDeletableStateRecords(records)
                deleted += records.count
            }
        }
        if deleted > 0 { logger.info("deleted records no longer needed from the state topic", metadata: ["records": "\(deleted)"]) }
    }

    /// Capped exponential backoff (0.2 s … 5 s), reporting unready with the reason meanwhile.
    func backoff(_ attempt: inout Int, _ what: String, _ error: (any Error)?) async throws {
        attempt += 1
        let delay = min(5000, 100 << min(attempt, 6))
        health.setReady(false, "\(what) failed: \(error.map { "\($0)" } ?? "unknown error")")
        logger.warning(
            "retrying after a failure",
            metadata: [
                "while": "\(what)", "error": "\(error.map { "\($0)" } ?? "-")", "attempt": "\(attempt)", "retryInMs": "\(delay)",
            ])
        try await Task.sleep(for: .milliseconds(delay))
    }
}

extension Duration {
    var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }

    /// Milliseconds to a tenth, for timings that are mostly under one (a batch's stages under a steady load).
    var millisecondsToATenth: String {
        let tenths = components.seconds * 10_000 + components.attoseconds / 100_000_000_000_000
        return "\(tenths / 10).\(tenths % 10)"
    }
}
