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
    public let health = HealthState()
    let store: StateStore
    let logger: Logger
    let metrics = PipelineMetrics()

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
        var run = try await PipelineRun.start(pipeline: self, cluster: cluster)
        defer { run.close() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.checkpointContinually() }
            let writer = run.fleet?.writer
            group.addTask { await self.expireDedupeContinually(stateWriter: writer) }
            if let fleet = run.fleet {
                let logger = self.logger
                let events = run.events
                group.addTask {
                    await fleet.writer.renewContinually(
                        onFenced: { partitions in
                            logger.warning(
                                "a newer owner claimed event partitions; writing nothing more for them",
                                metadata: ["partitions": "\(partitions.sorted())"])
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

    /// Expires the dedupe window 5 s after start and then every minute, beside the batch loop rather than in
    /// it: a busy service may never have an idle moment, and a minute of entries at 1,000 events/s is about
    /// 2 s of deletes (each row a random page of the key's B-tree). Chunks of 250 rows take SQLite's writer
    /// for about 4 ms each, 5 ms apart, so commits slip in between. Only entries below the new horizon go: a
    /// dedupe lookup that races a chunk answers, for each email, what it would have answered just before or
    /// just after the expiry, both at the window's edge. A failure is logged and tried again next minute.
    private func expireDedupeContinually(stateWriter: StateWriter?) async {
        let windowMs = configuration.dedupeWindowSeconds * 1000
        var delay = Duration.seconds(5)
        while true {
            do { try await Task.sleep(for: delay) } catch { return }
            delay = .seconds(60)
            do {
                // Letting the horizon advance 120 s per minute keeps up with real time while a wall-clock jump
                // cannot drop the window at once (StateStore.advanceDedupeHorizon).
                let cutoff = try store.advanceDedupeHorizon(
                    towardMs: Int64(Date().timeIntervalSince1970 * 1000) - windowMs, windowMs: windowMs,
                    maxAdvanceMs: 120_000)
                var expired = 0
                while !Task.isCancelled {
                    let chunk = try store.expireProcessedEmails(beforeMs: cutoff, limit: 250)
                    expired += chunk
                    if chunk == 0 { break }
                    try await Task.sleep(for: .milliseconds(5))
                }
                if let stateWriter {
                    try await deleteExpiredStateRecords(stateWriter, beforeMs: cutoff)
                }
                if expired > 0 {
                    metrics.expiredDedupeEntries.increment(by: expired)
                    logger.info("expired dedupe entries", metadata: ["count": "\(expired)"])
                }
                // Counting scans the whole table: on a reader, without holding a thread.
                metrics.dedupeEntries.record(try await store.processedEmailCount())
            } catch is CancellationError {
                return
            } catch {
                logger.warning("dedupe expiry failed; trying again in a minute", metadata: ["error": "\(error)"])
            }
        }
    }

    /// In a fleet: the owned partitions' batch records whose dedupe entries all expired are deleted from the
    /// state topic (tombstones), so that compaction keeps about one dedupe window of them.
    private func deleteExpiredStateRecords(_ writer: StateWriter, beforeMs cutoff: Int64) async throws {
        let events = configuration.topics.events
        var deleted = 0
        while !Task.isCancelled {
            let owned = writer.owned.sorted().map { TopicPartition(topic: events, partition: $0) }
            let expired = try store.expiredPublishedBatches(partitions: owned, beforeMs: cutoff, limit: 500)
            if expired.isEmpty { break }
            try await writer.publishTombstones(expired.map { ($0.partition.partition, $0.key) })
            try store.forgetPublishedBatches(expired)
            deleted += expired.count
        }
        if deleted > 0 { logger.info("deleted expired records from the state topic", metadata: ["records": "\(deleted)"]) }
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
}
