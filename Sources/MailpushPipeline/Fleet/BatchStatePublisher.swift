import Foundation
import Logging
import MailpushPartition
import MailpushState
import Synchronization

/// Writes committed batches' records to the state topic beside the batch loop, so that the next batch is
/// delivered meanwhile.
///
/// One write is in flight at a time, and a partition's records are written at most once per `interval`. Batches
/// committed meanwhile wait, and a partition's records of consecutive batches are joined into one (`from` of the
/// first, `offset`, marks and time of the last, the dedupe entries of all): a restore that follows the joined record
/// reaches the state the separate ones would have. So under load the state topic gets a record per partition per
/// interval, not per batch: a batch's record would cost a produce request per partition, as many as its outputs,
/// and records that are mostly marks.
///
/// The partitions take turns by `slices`: a write every `interval / slices` takes the records of one slice of the
/// partitions (partition modulo `slices`), so each partition's still go once per interval. Written all at once,
/// the records of every owned partition were a burst of a produce request per partition, and of the state
/// directory's bookkeeping after it, once a second; the jobs of the events that came meanwhile waited for it (the
/// slowest jobs of a light steady load came in a cluster at every write: docs/performance.md, session 52). Someone
/// waiting for the writes (`settle`, a checkpoint) gets every slice at once.
///
/// What a successor reads back grows by at most one interval of outputs, and what waits is safe in the state
/// directory meanwhile (docs/exactly-once.md, "Unwritten state records"). A batch's records, stored with its commit
/// as one row, leave the state directory (`stateBatchesResolved`) once each is written or set aside; a written
/// record's key is then remembered for its deletion, so only keys that exist in the topic are remembered. A record
/// set aside (its lease ended, its write given up) stays there as a record of its own, written before this instance
/// takes its partition again or releases it.
///
/// It also writes each owned partition's checkpoint (`checkpoint()`): the state of the partition's last batch
/// record written, after it in the same ordered path, so a checkpoint never lands before a batch record it
/// covers. A checkpoint stands for the batch records before it when a restore finds them removed by
/// compaction, and bounds how far back a successor reads (docs/exactly-once.md, "A fleet").
final class BatchStatePublisher: Sendable {
    private let writer: StateWriter
    private let store: StateStore?
    private let interval: Duration
    private let logger: Logger
    private let state = Mutex(State())
    /// How many records of each stored batch are neither written nor set aside: the batch leaves the state directory
    /// at none.
    private let unresolved = Mutex<[Int64: Int]>([:])
    /// Held by one `resolve` at a time (the drain's and `forget`'s), for as long as the state directory takes to
    /// record it; not `unresolved`, which `submit` takes on the batch loop's path.
    private let resolving = Mutex(())

    /// A record to write, with the stored batches (`commitEventBatch`) it is the record of, it and the records
    /// joined into it; none for a checkpoint.
    struct Queued {
        var record: PartitionStateRecord
        var batches: [Int64] = []
        /// The record's marks as the state topic gets them (`encodeMarksJSON`), when its batch's commit encoded them
        /// already: a batch's records share them, and the write does not encode them again (nil: it does).
        var marksJSON: [UInt8]? = nil
    }

    private struct State {
        /// Records submitted since the drain last took them, not joined yet: the drain joins them, off the batch
        /// loop's path (a batch's submit was a tenth of a millisecond of its commit when it joined them itself).
        var submitted: [Queued] = []
        /// Records joined already: those of `submitted` when it grows past `joinedOnSubmit` (the drain is held up).
        var waiting: [Queued] = []
        /// Records of a write that failed (some may have landed: never joined with later ones), written first by
        /// the next drain (the next batch's commit, or the next checkpoint).
        var retry: [Queued] = []
        var running: Task<Void, Never>?
        /// Callers of `checkpoint()` waiting for the next checkpoint to be written.
        var checkpointWaiters: [CheckedContinuation<Void, Never>] = []
        /// The partitions this owner writes for, each with what its checkpoints need.
        var owned: [Int32: Owned] = [:]
        /// When the last write of batch records started: the next waits until `interval / slices` after it.
        var lastWrite: ContinuousClock.Instant?
        /// The slice of the partitions whose records the next write takes.
        var slice = 0
        /// Someone waits for everything submitted to be written (`settle`): no pause until the drain ends.
        var hurry = false
        /// The drain's pause between writes, and which pause it is (a late timer must not end the next one).
        var pause: (id: Int, continuation: CheckedContinuation<Void, Never>)?
        var pauses = 0
    }

    /// What a checkpoint of one owned partition needs.
    private struct Owned {
        /// This owner's last batch record written (or its claim): what a checkpoint holds.
        var written: PartitionStateRecord
        /// `written`'s marks as its batch's commit encoded them (a batch record carries them only so); nil: its own.
        var writtenMarksJSON: [UInt8]? = nil
        /// A batch record of it was dropped (the lease was gone, or too many waited for a retry): a checkpoint
        /// would skip its dedupe entries, so none is written while this owner holds the partition (its successor
        /// starts before the missing record).
        var gapped = false
        /// The offset of its last acknowledged checkpoint.
        var checkpointed: Int64?
        let claimedAt: ContinuousClock.Instant
    }

    /// `store`: where the batches' records wait until written or set aside, and written records' keys are remembered
    /// for deletion (nil: neither).
    /// `interval`: the least time between two writes of a partition's batch records
    /// (`GroupSettings.stateWriteInterval`).
    /// The batches `store` keeps already are an earlier run's, which a crash (or writes failing at its stop) left:
    /// they become records of their own, which the first takeover writes.
    init(writer: StateWriter, store: StateStore?, interval: Duration, logger: Logger) throws(StateError) {
        try store?.splitUnwrittenBatches()
        self.writer = writer
        self.store = store
        self.interval = interval
        self.logger = logger
    }

    /// Queues a committed batch's records and starts writing them unless a write is under way.
    /// `marksJSON`: their marks (the same in each) as `PartitionStateRecord.encodeMarksJSON` writes them, if known
    /// (the batch loop's records carry theirs only so: its commit encodes them once, and builds no `marks` of each);
    /// `batch`: the id the commit stored them under (nil: not stored).
    func submit(_ records: [PartitionStateRecord], marksJSON: [UInt8]? = nil, stored batch: Int64? = nil) {
        guard !records.isEmpty else { return }
        if let batch { unresolved.withLock { $0[batch] = records.count } }
        state.withLock { state in
            for record in records {
                state.submitted.append(Queued(record: record, batches: batch.map { [$0] } ?? [], marksJSON: marksJSON))
            }
            if state.submitted.count >= Self.joinedOnSubmit {
                for queued in state.submitted { Self.queue(queued, into: &state.waiting) }
                state.submitted = []
            }
            if state.running == nil {
                state.running = Task { await self.drain() }
            }
        }
    }

    /// A partition taken over: its claim is the state a first checkpoint holds until a batch record is written.
    func began(_ claim: PartitionStateRecord) {
        state.withLock { state in
            state.owned[claim.partition] = Owned(written: claim, claimedAt: .now)
        }
    }

    /// Partitions given up (or about to be released): nothing more is written for them. Their records waiting for
    /// a retry are set aside, for a release (or the next takeover) to write.
    func forget(_ partitions: some Sequence<Int32>) {
        let partitions = Set(partitions)
        let dropped = state.withLock { state in
            let dropped = state.retry.filter { partitions.contains($0.record.partition) }
            state.retry.removeAll { partitions.contains($0.record.partition) }
            for partition in partitions { state.owned[partition] = nil }
            return dropped
        }
        setAside(dropped)
    }

    /// Writes a checkpoint of every owned partition that changed since its last one, after the batch records
    /// submitted before, and returns each partition's last acknowledged checkpoint offset.
    /// Waits for its own checkpoint only, not for the publisher to fall idle: under a steady load it never does.
    func checkpoint() async -> [Int32: Int64] {
        await withCheckedContinuation { continuation in
            state.withLock { state in
                state.checkpointWaiters.append(continuation)
                if state.running == nil { state.running = Task { await self.drain() } }
            }
            endPause()
        }
        return state.withLock { $0.owned.compactMapValues(\.checkpointed) }
    }

    /// Returns once every record submitted before has been written (or given up on): before anything that must
    /// follow them in the state topic (a release, a claim, leaving the group, giving a partition up).
    func settle() async {
        while let running = state.withLock({ state -> Task<Void, Never>? in
            state.hurry = state.running != nil
            return state.running
        }) {
            endPause()
            await running.value
        }
    }

    /// Waits until `interval / slices` after the last write started, unless someone waits for the writes (`settle`,
    /// a checkpoint): under load the records of several batches join meanwhile.
    private func pace() async {
        let pause = interval / Self.slices
        let due = state.withLock { state -> (id: Int, until: ContinuousClock.Instant)? in
            guard let last = state.lastWrite, !state.hurry, state.checkpointWaiters.isEmpty, ContinuousClock.now < last + pause
            else { return nil }
            state.pauses += 1
            return (state.pauses, last + pause)
        }
        guard let due else { return }
        await withCheckedContinuation { continuation in
            let hurried = state.withLock { state in
                guard !state.hurry, state.checkpointWaiters.isEmpty else { return true }
                state.pause = (due.id, continuation)
                return false
            }
            if hurried {
                continuation.resume()
                return
            }
            Task {
                try? await Task.sleep(until: due.until, clock: .continuous)
                self.endPause(due.id)
            }
        }
    }

    /// Ends the drain's pause now (`id`: only that pause).
    private func endPause(_ id: Int? = nil) {
        let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard let pause = state.pause, id == nil || pause.id == id else { return nil }
            state.pause = nil
            return pause.continuation
        }
        continuation?.resume()
    }

    /// Writes what waits, then the checkpoints asked for meanwhile (after those records, before the next ones:
    /// under a steady load something always waits, and checkpoints must not wait for a pause).
    private func drain() async {
        while true {
            await pace()
            // Once this drain has set `running` to nil it must end at once: a submit may start the next one, and
            // two drains at a time would let a partition's records land out of order.
            let (retry, waiting, submitted, waiters, slice, done) = state.withLock { state in
                let (retry, waiting, submitted, waiters) = (state.retry, state.waiting, state.submitted, state.checkpointWaiters)
                state.retry = []
                state.waiting = []
                state.submitted = []
                state.checkpointWaiters = []
                let noRecords = retry.isEmpty && waiting.isEmpty && submitted.isEmpty
                if noRecords && waiters.isEmpty {
                    state.running = nil
                    state.hurry = false
                }
                if !noRecords { state.lastWrite = .now }
                // Every slice at once for someone waiting: what they wait for must all be written.
                let slice: Int? = state.hurry || !waiters.isEmpty ? nil : state.slice
                state.slice = (state.slice + 1) % Self.slices
                return (retry, waiting, submitted, waiters, slice, noRecords && waiters.isEmpty)
            }
            if done { return }
            var joined = waiting
            for queued in submitted { Self.queue(queued, into: &joined) }
            if let slice {
                // The other slices' records wait for their turn, before any submitted meanwhile (a partition's records
                // are written in the order of its batches).
                let later = joined.filter { Self.slice(of: $0.record.partition) != slice }
                joined.removeAll { Self.slice(of: $0.record.partition) != slice }
                if !later.isEmpty { state.withLock { state in state.waiting = later + state.waiting } }
            }
            let records = retry + joined
            if !records.isEmpty {
                let outcome = await publishOrWarn(records)
                let (stop, dropped) = state.withLock { state -> (Bool, [Queued]) in
                    for queued in records where state.owned[queued.record.partition] != nil {
                        let partition = queued.record.partition
                        if outcome.written.contains(partition) {
                            state.owned[partition]?.written = queued.record
                            state.owned[partition]?.writtenMarksJSON = queued.marksJSON
                        } else if !outcome.failed || records.count > Self.retryLimit {
                            state.owned[partition]?.gapped = true
                        }
                    }
                    guard outcome.failed else { return (false, []) }
                    if records.count <= Self.retryLimit {
                        state.retry = records.filter { state.owned[$0.record.partition].map { !$0.gapped } ?? false }
                    }
                    state.running = nil
                    state.hurry = false
                    let retried = Set(state.retry.map(\.record.partition))
                    return (true, records.filter { !retried.contains($0.record.partition) })
                }
                setAside(dropped)
                if stop {
                    for waiter in waiters { waiter.resume() }
                    return
                }
            }
            guard !waiters.isEmpty else { continue }
            let checkpoints = state.withLock { dueCheckpoints($0) }
            if !checkpoints.isEmpty {
                let outcome = await publishOrWarn(checkpoints)
                state.withLock { state in
                    for checkpoint in checkpoints where outcome.written.contains(checkpoint.record.partition) {
                        state.owned[checkpoint.record.partition]?.checkpointed = checkpoint.record.offset
                    }
                }
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// How many turns the partitions take in an interval: a write holds the records of about an eighth of them.
    static let slices = 8

    static func slice(of partition: Int32) -> Int { Int(partition) % slices }

    /// How many records wait for a retry at most: during a longer outage they are dropped (the partitions' next
    /// owners start before them and read back; this instance writes them from its state directory before it takes
    /// a partition over again).
    static let retryLimit = 10_000

    /// How many submitted records wait unjoined at most (each batch submits one per partition it touched): more are
    /// joined as they come, so a drain held up by a slow state topic holds about a record per partition, not one per
    /// partition and batch.
    static let joinedOnSubmit = 8_192

    /// Checkpoints of the partitions whose last record written is not checkpointed yet. The checkpoint key is
    /// shared by every owner, so that compaction keeps the latest: the first one of an owner waits until no
    /// record of a replaced owner can land any more (`takeoverWait` after the claim: a late checkpoint of theirs
    /// would replace ours), and until a lease renewal read the log up to our claim (an instance that claimed the
    /// same epoch after another is fenced by it, and never writes one).
    private func dueCheckpoints(_ state: State) -> [Queued] {
        let now = ContinuousClock.now
        return state.owned.sorted { $0.key < $1.key }.compactMap { partition, owned in
            let last = owned.written
            guard !owned.gapped, owned.checkpointed != last.offset, now - owned.claimedAt >= writer.leases.takeoverWait,
                writer.leases.epoch(of: partition) == last.epoch, writer.leases.renewedSinceClaim(partition)
            else { return nil }
            let checkpoint = PartitionStateRecord.checkpoint(
                of: last, host: ProcessInfo.processInfo.hostName, atMs: Int64(Date().timeIntervalSince1970 * 1000))
            return Queued(record: checkpoint, marksJSON: owned.writtenMarksJSON)
        }
    }

    /// Joins `record` to the waiting record of its partition when it continues it, or queues it behind.
    static func queue(_ queued: Queued, into waiting: inout [Queued]) {
        if let index = waiting.lastIndex(where: { $0.record.partition == queued.record.partition }),
            waiting[index].record.join(queued.record)
        {
            // The joined record has the marks of `queued`'s batch.
            waiting[index].batches += queued.batches
            waiting[index].marksJSON = queued.marksJSON
        } else {
            waiting.append(queued)
        }
    }

    /// Writes the records of the partitions whose lease is valid, retrying a few times; `failed` when they did
    /// not all land (they are written again, before the next records). The others are set aside. A batch record
    /// that never lands only makes the next owner start from an older state, whose outputs since it finds by
    /// reading back.
    private func publishOrWarn(_ queued: [Queued]) async -> (written: Set<Int32>, failed: Bool) {
        let records = queued.map(\.record)
        var attempt = 0
        while true {
            await waitForRenewals(of: records)
            // An owner that has been replaced writes nothing more for a partition (its records would be ignored;
            // their rows stay in the state directory, written before this instance takes the partition again).
            let allowed = queued.filter { writer.leases.leaseValid([$0.record.partition]) }
            let partitions = Set(allowed.map(\.record.partition))
            if allowed.count < records.count {
                logger.warning(
                    "state records not written: the lease of their partitions ended",
                    metadata: ["partitions": "\(Set(records.map(\.partition)).subtracting(partitions).sorted())"])
            }
            guard !allowed.isEmpty else {
                setAside(queued)
                return ([], false)
            }
            do {
                try await writer.publish(allowed.map { ($0.record, $0.marksJSON) })
                try resolve(written: allowed, setAside: queued.filter { !partitions.contains($0.record.partition) })
                return (partitions, false)
            } catch {
                attempt += 1
                if attempt >= 5 || Task.isCancelled {
                    logger.warning(
                        "writing state records failed; they are written again with the next ones",
                        metadata: ["error": "\(error)", "partitions": "\(partitions.sorted())"])
                    return ([], true)
                }
                try? await Task.sleep(for: .milliseconds(100 << attempt))
            }
        }
    }
}

extension BatchStatePublisher {
    /// Records `written` (acknowledged by the state topic) and `setAside` (not written, and no longer waiting here)
    /// in the state directory: the stored batches whose records are now all one or the other leave it, the records
    /// set aside stay as records of their own, and the keys of the batch records written are remembered for their
    /// deletion once their dedupe entries expired and a checkpoint covers them. A crash before this writes the
    /// batches' records again from the state directory: a repeated record changes nothing.
    fileprivate func resolve(written: [Queued], setAside: [Queued]) throws(StateError) {
        guard let store else { return }
        try resolving.withLock { _ throws(StateError) in
            var resolved: [Int64: Int] = [:]
            for queued in written + setAside {
                for batch in queued.batches { resolved[batch, default: 0] += 1 }
            }
            let done = unresolved.withLock { counts in
                resolved.compactMap { batch, count in counts[batch].map { $0 <= count } == true ? batch : nil }.sorted()
            }
            var aside: [Int64: Set<TopicPartition>] = [:]
            for queued in setAside {
                for batch in queued.batches {
                    aside[batch, default: []].insert(TopicPartition(topic: queued.record.topic, partition: queued.record.partition))
                }
            }
            try store.stateBatchesResolved(done, setAside: aside, deletable: written.map(\.record).deletable)
            unresolved.withLock { counts in
                for (batch, count) in resolved {
                    guard let left = counts[batch] else { continue }
                    counts[batch] = left > count ? left - count : nil
                }
            }
        }
    }

    /// Records dropped here (their lease ended, their write given up, their partition forgotten) stay in the state
    /// directory as records of their own. If that fails, their batches stay whole until the next start splits them.
    fileprivate func setAside(_ dropped: [Queued]) {
        guard !dropped.isEmpty else { return }
        do {
            try resolve(written: [], setAside: dropped)
        } catch {
            logger.error(
                "keeping unwritten state records failed; the state directory keeps their batches until the next start",
                metadata: ["error": "\(error)", "partitions": "\(Set(dropped.map(\.record.partition)).sorted())"])
        }
    }

    /// A lease that lapsed for a moment (a renewal late under load) is waited for, as a batch's round waits
    /// (`checkLeases`), rather than dropping the records: a dropped batch record stops the chain there.
    fileprivate func waitForRenewals(of records: [PartitionStateRecord]) async {
        let deadline = ContinuousClock.now + writer.leases.leaseDuration * 2
        func lapsed(_ record: PartitionStateRecord) -> Bool {
            !writer.leases.leaseValid([record.partition]) && !writer.leases.isAnyFenced([record.partition])
                && writer.leases.epoch(of: record.partition) == record.epoch
        }
        while records.contains(where: lapsed), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}

extension [PartitionStateRecord] {
    /// The batch records among these, as the state directory remembers them for their deletion.
    var deletable: [DeletableStateRecord] {
        filter { $0.kind == .batch }.map { record in
            DeletableStateRecord(
                partition: TopicPartition(topic: record.topic, partition: record.partition), key: record.key,
                deleteAfterMs: (record.emails ?? []).isEmpty ? 0 : record.processedAtMs ?? 0, coveredAt: record.offset)
        }
    }
}

extension PartitionStateRecord {
    /// This batch record followed by `next`, the same owner's next batch of the partition, as one record; nil
    /// when `next` does not continue it. The joined record has `next`'s key, whose deletion is planned only when
    /// `next` has dedupe entries (`rememberForDeletion`): so entries of this one never move to a key that
    /// would not be deleted when they expire.
    ///
    /// Nor when the joined record would hold more than `maxEmails` dedupe entries: while a slow state partition holds
    /// the writes back, joining grew one record without bound, past what the producer takes, and a record refused
    /// for its size was retried forever, with every other record of the write.
    func joined(with next: PartitionStateRecord) -> PartitionStateRecord? {
        var joined = self
        return joined.join(next) ? joined : nil
    }

    /// `joined(with:)` in place: true when this record became the joined one, false (and unchanged) otherwise. The
    /// dedupe entries grow where they are, so joining a partition's records over a write interval copies each once.
    mutating func join(_ next: PartitionStateRecord) -> Bool {
        guard kind == .batch, next.kind == .batch, next.topic == topic, next.partition == partition, next.epoch == epoch,
            next.owner == owner, next.from == offset, (emails ?? []).isEmpty || !(next.emails ?? []).isEmpty,
            (emails?.count ?? 0) + (next.emails?.count ?? 0) <= Self.maxEmails
        else { return false }
        var emails = self.emails ?? []
        self.emails = nil
        emails.append(contentsOf: next.emails ?? [])
        let from = self.from
        self = next
        self.from = from
        self.emails = emails
        return true
    }
}
