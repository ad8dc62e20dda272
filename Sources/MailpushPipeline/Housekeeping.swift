import Foundation
import MailpushPartition

/// When the idle chores last ran.
struct Housekeeping {
    var lastRun = ContinuousClock.now
}

extension PipelineRun {
    /// What an idle poll does: apply config that arrived, and the chores when they are due.
    mutating func idle() async throws {
        try await config.applyFetched()
        try await houseKeep()
    }

    /// Every few seconds record lag and move the output marks up. Runs after idle polls and between batches
    /// alike: a busy mail system may never leave the service an idle poll. Between batches no output of an
    /// uncommitted batch is in the output topics unless the batch planned ahead wrote some ahead
    /// (`writtenAhead`): otherwise their ends are valid marks. The dedupe window expires beside the loop
    /// (`Pipeline.expireDedupeContinually`).
    mutating func houseKeep(writtenAhead: Bool = false) async throws {
        guard ContinuousClock.now - housekeeping.lastRun > .seconds(5) else { return }
        housekeeping.lastRun = .now
        let ends = try await cluster.endOffsets(owned.partitions, timeout: timeout)
        for (partition, end) in ends {
            metrics.lag(topic: partition.topic, partition: partition.partition)
                .record(max(0, end - (committed[partition] ?? end)))
        }
        if recovery.isSettled, !writtenAhead {
            // Idle and nothing unsettled: move the marks up so a future recovery reads little.
            try store.setOutputMarks(try await cluster.endOffsets(delivery.partitions, timeout: timeout))
        }
        if !health.pipelineReady { health.setReady(true, "idle, config caught up") }
    }
}
