import MailpushPartition

/// Outputs an earlier run wrote for events it had not committed (found in the output topics at start-up):
/// when those events are processed again, these outputs are not produced a second time.
///
/// While anything is pending here, the output marks stay where they are (docs/exactly-once.md, "The mark
/// rule"): a batch re-reads only part of an unfinished batch, and a mark moved past the rest would hide it
/// from the next read-back if the process crashed again.
struct Recovery {
    private(set) var found: Set<OutputIdentity> = []
    /// Per event partition, the highest source offset among `found`.
    private var horizon: [TopicPartition: Int64] = [:]
    /// Outputs of an interrupted replay batch; dropped when no replay is pending any more.
    private(set) var replayFound: Set<OutputIdentity> = []

    /// Nothing of an unfinished batch (or replay batch) is waiting to be processed again: marks may move.
    var isSettled: Bool { found.isEmpty && replayFound.isEmpty }

    /// The unfinished event batches are all committed again (replays may still be pending).
    var eventsSettled: Bool { found.isEmpty }

    func notYetWritten(_ outputs: [Output]) -> [Output] {
        isSettled ? outputs : outputs.filter { !found.contains($0.identity) && !replayFound.contains($0.identity) }
    }

    /// Forgets the outputs of interrupted replay batches once no replay is pending.
    mutating func forgetReplays() {
        replayFound = []
    }

    /// Forgets the outputs once every partition has committed past them; true when that just happened.
    mutating func forget(behind committed: [TopicPartition: Int64]) -> Bool {
        guard !horizon.isEmpty else { return false }
        horizon = horizon.filter { partition, highest in (committed[partition] ?? 0) <= highest }
        guard horizon.isEmpty else { return false }
        found = []
        return true
    }

    /// Adds what a read-back for more event partitions (taken over, or after a stopped batch) found.
    mutating func merge(_ scan: OutputScanner.Scan) {
        found.formUnion(scan.found)
        replayFound.formUnion(scan.replayFound)
        horizon.merge(scan.horizon) { max($0, $1) }
    }

    /// Forgets what was found for event partitions this run no longer processes.
    mutating func drop(eventPartitions partitions: Set<Int32>) {
        guard !horizon.isEmpty else { return }
        let dropped = horizon.keys.filter { partitions.contains($0.partition) }
        guard !dropped.isEmpty else { return }
        for partition in dropped { horizon[partition] = nil }
        found = found.filter { identity in
            guard let parsed = OutputScanner.parseSource(identity.source) else { return true }
            return !dropped.contains(TopicPartition(topic: parsed.topic, partition: parsed.partition))
        }
    }

    init(_ scan: OutputScanner.Scan) {
        found = scan.found
        horizon = scan.horizon
        replayFound = scan.replayFound
    }

    init() {}
}

extension PipelineRun {
    /// Reads back what an earlier run wrote for events it had not committed.
    mutating func recover() async throws {
        let scan = try await delivery.scan(committed: committed.filter { $0.key.topic == pipeline.configuration.topics.events })
        recovery = Recovery(scan)
        if recovery.isSettled {
            // Nothing of ours is unsettled: later scans can start at today's ends.
            try store.setOutputMarks(scan.ends)
        } else {
            logger.notice(
                "found outputs of an unfinished batch; they will not be produced again",
                metadata: [
                    "outputs": "\(scan.found.count)", "replayOutputs": "\(scan.replayFound.count)",
                    "eventPartitions": "\(scan.horizon.keys.sorted().map(\.description))",
                ])
        }
    }
}
