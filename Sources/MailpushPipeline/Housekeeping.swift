import Foundation
import MailpushPartition

/// When the idle chores last ran.
struct Housekeeping {
    var lastRun = ContinuousClock.now
    var lastExpiry = ContinuousClock.now - .seconds(3600)
}

extension PipelineRun {
    /// What an idle poll does: apply config that arrived, and the chores when they are due.
    mutating func idle() async throws {
        try await config.applyFetched()
        try await houseKeep()
    }

    /// Every few seconds record lag and move the output marks up, and every minute expire the dedupe window.
    /// Runs after idle polls and between batches alike: a busy mail system may never leave the service an idle
    /// poll, and its dedupe table must not grow without end. Between batches no output of an uncommitted
    /// batch is in the output topics (a batch planned ahead has produced nothing yet), so their ends are
    /// valid marks.
    mutating func houseKeep() async throws {
        guard ContinuousClock.now - housekeeping.lastRun > .seconds(5) else { return }
        housekeeping.lastRun = .now
        let ends = try await cluster.endOffsets(ownedEventPartitions, timeout: timeout)
        for (partition, end) in ends {
            metrics.lag(topic: partition.topic, partition: partition.partition)
                .record(max(0, end - (committed[partition] ?? end)))
        }
        if recovery.isSettled {
            // Idle and nothing unsettled: move the marks up so a future recovery reads little.
            try store.setOutputMarks(try await cluster.endOffsets(delivery.partitions, timeout: timeout))
        }
        if ContinuousClock.now - housekeeping.lastExpiry > .seconds(60) {
            housekeeping.lastExpiry = .now
            try await expireDedupeEntries()
        }
        if !health.isReady { health.setReady(true, "idle, config caught up") }
    }

    private func expireDedupeEntries() async throws {
        let windowMs = pipeline.configuration.dedupeWindowSeconds * 1000
        // Expiry runs every 60 s; letting the horizon advance 120 s per run keeps up with real time while a
        // wall-clock jump cannot drop the window at once (StateStore.advanceDedupeHorizon).
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
    }
}
