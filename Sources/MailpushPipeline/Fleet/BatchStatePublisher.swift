import Logging
import Synchronization

/// Writes committed batches' records to the state topic beside the batch loop, so that the next batch is
/// delivered meanwhile.
///
/// One write is in flight at a time. Batches committed while it is under way wait, and a partition's records of
/// consecutive batches are joined into one (`from` of the first, `offset`, marks and time of the last, the
/// dedupe entries of all): a restore that follows the joined record reaches the state the separate ones would
/// have, and under load a batch does not add a produce round trip per partition of its own.
final class BatchStatePublisher: Sendable {
    private let writer: StateWriter
    private let logger: Logger
    private let state = Mutex(State())

    private struct State {
        var waiting: [PartitionStateRecord] = []
        var running: Task<Void, Never>?
    }

    init(writer: StateWriter, logger: Logger) {
        self.writer = writer
        self.logger = logger
    }

    /// Queues a committed batch's records and starts writing them unless a write is under way.
    func submit(_ records: [PartitionStateRecord]) {
        guard !records.isEmpty else { return }
        state.withLock { state in
            for record in records { Self.queue(record, into: &state.waiting) }
            if state.running == nil {
                state.running = Task { await self.drain() }
            }
        }
    }

    /// Returns once every record submitted before has been written (or given up on): before anything that must
    /// follow them in the state topic (a release, a claim, leaving the group, giving a partition up).
    func settle() async {
        while let running = state.withLock({ $0.running }) {
            await running.value
        }
    }

    private func drain() async {
        while true {
            let records = state.withLock { state in
                defer { state.waiting = [] }
                if state.waiting.isEmpty { state.running = nil }
                return state.waiting
            }
            if records.isEmpty { return }
            await publishOrWarn(records)
        }
    }

    /// Joins `record` to the waiting record of its partition when it continues it, or queues it behind.
    static func queue(_ record: PartitionStateRecord, into waiting: inout [PartitionStateRecord]) {
        if let index = waiting.lastIndex(where: { $0.partition == record.partition }),
            let joined = waiting[index].joined(with: record)
        {
            waiting[index] = joined
        } else {
            waiting.append(record)
        }
    }

    /// Retries a few times. A batch whose records never land only makes the next owner start from an older
    /// state, whose outputs since it finds by reading back.
    private func publishOrWarn(_ records: [PartitionStateRecord]) async {
        let partitions = Set(records.map(\.partition))
        var attempt = 0
        while true {
            // An owner that has been replaced writes nothing more (its records would be ignored anyway).
            guard writer.leaseValid(partitions) else { return }
            do {
                try await writer.publish(records)
                return
            } catch {
                attempt += 1
                if attempt >= 5 || Task.isCancelled {
                    logger.warning(
                        "writing a batch's state records failed; a new owner of its partitions would start before it",
                        metadata: ["error": "\(error)", "partitions": "\(partitions.sorted())"])
                    return
                }
                try? await Task.sleep(for: .milliseconds(100 << attempt))
            }
        }
    }
}

extension PartitionStateRecord {
    /// This batch record followed by `next`, the same owner's next batch of the partition, as one record; nil
    /// when `next` does not continue it. The joined record has `next`'s key, whose deletion is planned only when
    /// `next` has dedupe entries (`batchRecordsWithEntries`): so entries of this one never move to a key that
    /// would not be deleted when they expire.
    func joined(with next: PartitionStateRecord) -> PartitionStateRecord? {
        guard kind == .batch, next.kind == .batch, next.topic == topic, next.partition == partition, next.epoch == epoch,
            next.owner == owner, next.from == offset, (emails ?? []).isEmpty || !(next.emails ?? []).isEmpty
        else { return nil }
        var joined = next
        joined.from = from
        joined.emails = (emails ?? []) + (next.emails ?? [])
        return joined
    }
}
