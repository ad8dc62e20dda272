import MailpushPartition

/// Outputs an earlier run wrote for events it had not committed (found in the output topics at start-up):
/// when those events are processed again, these outputs are not produced a second time.
struct Recovery {
    private(set) var found: Set<OutputIdentity> = []
    /// Per event partition, the highest source offset among `found`.
    private var horizon: [TopicPartition: Int64] = [:]

    /// Nothing of an unfinished batch is waiting to be processed again.
    var isSettled: Bool { found.isEmpty }

    func notYetWritten(_ outputs: [Output]) -> [Output] {
        found.isEmpty ? outputs : outputs.filter { !found.contains($0.identity) }
    }

    /// Forgets the outputs once every partition has committed past them; true when that just happened.
    mutating func forget(behind committed: [TopicPartition: Int64]) -> Bool {
        guard !horizon.isEmpty else { return false }
        horizon = horizon.filter { partition, highest in (committed[partition] ?? 0) <= highest }
        guard horizon.isEmpty else { return false }
        found = []
        return true
    }

    fileprivate init(found: Set<OutputIdentity>, horizon: [TopicPartition: Int64]) {
        self.found = found
        self.horizon = horizon
    }

    init() {}
}

extension PipelineRun {
    /// Reads back what an earlier run wrote for events it had not committed.
    mutating func recover() async throws {
        let scan = try await delivery.scan(committed: committed)
        recovery = Recovery(found: scan.found, horizon: scan.horizon)
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
}
