import Foundation
import MailpushKafka
import MailpushPartition
import Synchronization

/// The leases on the partitions this instance claimed, and the fence: what `StateWriter` writes is told here, and
/// renewals look at the state topic through `reader` (the `StateTopicReader` a takeover's restore uses too).
///
/// The lease: this instance writes outputs for a partition only while `leaseValid` says so. A lease is
/// renewed when a look at the partition's state-topic partition, begun at time t, finds no record of a newer
/// owner (every record there is ours, or an older owner's); it then runs until t + `leaseDuration`. Outputs
/// are enqueued only under a valid lease, and the producer drops what it has not sent within
/// `message.timeout.ms`; so nothing of ours reaches Kafka later than `leaseDuration + message.timeout.ms`
/// after the newer owner's claim was written, and the new owner waits that long before reading back
/// (`takeoverWait`). docs/exactly-once.md ("A fleet") has the argument and its timing assumptions.
final class PartitionLeases: Sendable {
    let instanceId: String
    let leaseDuration: Duration
    let renewInterval: Duration
    /// How long after a claim is acknowledged a replaced owner's outputs may still land.
    let takeoverWait: Duration
    /// What renewals (and a takeover's restore) read the state topic with.
    let reader: StateTopicReader
    /// The consumer renewals read with, kept from one read to the next.
    let renewalConsumer: KeptStateConsumer
    /// Told how long writing waited for a renewal that came late (`mailpush_lease_wait_seconds`): a lease that ran
    /// out without a newer owner pauses a batch's outputs, a wait that only a fleet's events have.
    let leaseWaited: @Sendable (Duration) -> Void
    private let state = Mutex(State())

    /// One partition this instance has claimed, as far as the state topic goes.
    private struct Held {
        var epoch: Int64
        /// Where our claim lies: a record of the same epoch by another owner before it means that owner claimed
        /// first (two instances that claimed at once), and it wins.
        var claimOffset: Int64
        /// Offset after the last record of the partition's state partition we know (ours, or read).
        var knownEnd: Int64
        var lease: Lease
        /// When the last look that renewed the lease began; nil before the first since the claim.
        var renewedAt: ContinuousClock.Instant?

        enum Lease {
            /// Outputs may be enqueued until then.
            case until(ContinuousClock.Instant)
            /// A newer owner claimed the partition: nothing more is written for it, however long we hold it.
            /// `by` names that owner and its host, for the log: a person must be able to tell a successor of
            /// this fleet from another deployment sharing the state topic.
            case fenced(by: String)
        }

        var isFenced: Bool { if case .fenced = lease { true } else { false } }

        func valid(at now: ContinuousClock.Instant) -> Bool {
            if case .until(let end) = lease { now < end } else { false }
        }
    }

    private struct State {
        var held: [Int32: Held] = [:]
        /// Our writes in flight per partition, and how many were begun: a renewal reads records it did not write
        /// only in a round with none of ours in flight, unless the lease is half gone. Kept apart from `held`: a
        /// write can outlive a partition's drop.
        var inFlight: [Int32: Int] = [:]
        var generation: [Int32: Int] = [:]
        /// Replay requests (`mailpush replay`) seen while renewing, with their offsets in the state partition, until
        /// the loop has recorded them.
        var replayRecords: [(offset: Int64, record: PartitionStateRecord)] = []
        /// Position requests (`mailpush offsets --set`) seen while renewing, the last per partition, for the loop
        /// to take up (`OwnedPartitions.act`).
        var positionRecords: [Int32: PartitionStateRecord] = [:]

        /// Our own record at `offset` extends what we know only when nothing unread lies before it: a record
        /// of another writer in between (a newer owner's claim) must be read by the renewal, not skipped.
        mutating func advanceKnownEnd(_ partition: Int32, pastOurRecordAt offset: Int64) {
            guard let known = held[partition]?.knownEnd, offset == known else { return }
            held[partition]?.knownEnd = offset + 1
        }

        mutating func began(writing partitions: some Sequence<Int32>) {
            for partition in partitions {
                inFlight[partition, default: 0] += 1
                generation[partition, default: 0] += 1
            }
        }

        mutating func ended(writing partitions: some Sequence<Int32>) {
            for partition in partitions { inFlight[partition, default: 1] -= 1 }
        }
    }

    init(
        instanceId: String, reader: StateTopicReader, messageTimeout: Duration, leaseDuration: Duration,
        leaseWaited: @escaping @Sendable (Duration) -> Void = { _ in }
    ) {
        self.instanceId = instanceId
        self.reader = reader
        self.leaseWaited = leaseWaited
        renewalConsumer = KeptStateConsumer(kafka: reader.kafka)
        self.leaseDuration = leaseDuration
        renewInterval = leaseDuration / 4
        takeoverWait = leaseDuration + messageTimeout + .milliseconds(500)
    }

    func statePartition(_ partition: Int32) -> TopicPartition { reader.statePartition(partition) }

    // MARK: Ownership

    func epoch(of partition: Int32) -> Int64? { state.withLock { $0.held[partition]?.epoch } }

    var owned: Set<Int32> { state.withLock { Set($0.held.keys) } }

    /// Where this member's next restore of `partition` must start reading its state partition: what the renewals
    /// have read, but not past a replay request they found that the loop has not recorded yet. A partition lost
    /// before that (a rebalance, a pause past the session) and claimed again by this member reads the request
    /// again; past it, the replay would never run.
    func restoreStart(of partition: Int32) -> Int64? {
        state.withLock { state in
            guard let known = state.held[partition]?.knownEnd else { return nil }
            let unrecorded = state.replayRecords.lazy.filter { $0.record.partition == partition }.map(\.offset).min()
            return min(known, unrecorded ?? known)
        }
    }

    /// Starts owning `partition` at `epoch`, claimed at `claimOffset`. `knownEnd` is where the restore's read
    /// ended: what lies between it and the claim is read by the first renewal (it may hold a rival claim). With
    /// nothing between them, the claim itself is known as any record of ours is (`advanceKnownEnd`): the first
    /// renewal reads only what came after it, usually nothing, where it read and decoded every claim with its ~65
    /// marks (about 0.6% of a group member's CPU in an 8 s steady run; docs/performance.md, session 54). The
    /// lease starts at `leaseFrom` (when the claim's look at the partition began).
    func adopt(_ partition: Int32, epoch: Int64, claimOffset: Int64, knownEnd: Int64, leaseFrom: ContinuousClock.Instant) {
        state.withLock { state in
            state.held[partition] = Held(
                epoch: epoch, claimOffset: claimOffset, knownEnd: min(knownEnd, claimOffset), lease: .until(leaseFrom + leaseDuration))
            state.advanceKnownEnd(partition, pastOurRecordAt: claimOffset)
        }
    }

    /// Whether a renewal has looked at the partition since our claim (and found no rival claim before it).
    func renewedSinceClaim(_ partition: Int32) -> Bool {
        state.withLock { state in state.held[partition].map { $0.renewedAt != nil && !$0.isFenced } ?? false }
    }

    func drop(_ partitions: some Sequence<Int32>) {
        state.withLock { state in
            for partition in partitions { state.held[partition] = nil }
        }
    }

    /// Partitions a newer owner has claimed.
    var fenced: Set<Int32> { state.withLock { Set($0.held.filter(\.value.isFenced).keys) } }

    /// Whether a newer owner has claimed one of `partitions`: what the batch loop asks before every batch, without
    /// making a set.
    func isAnyFenced(_ partitions: some Sequence<Int32>) -> Bool {
        state.withLock { state in partitions.contains { state.held[$0]?.isFenced ?? false } }
    }

    /// Who claimed each of these fenced partitions.
    func claimants(of partitions: Set<Int32>) -> [Int32: String] {
        state.withLock { state in
            var claimants: [Int32: String] = [:]
            for partition in partitions {
                if case .fenced(let by) = state.held[partition]?.lease { claimants[partition] = by }
            }
            return claimants
        }
    }

    /// Whether outputs of `partitions` may be enqueued now.
    func leaseValid(_ partitions: some Sequence<Int32>) -> Bool {
        let now = ContinuousClock.now
        return state.withLock { state in
            partitions.allSatisfy { state.held[$0]?.valid(at: now) ?? false }
        }
    }

    /// Waits up to two lease periods for `partitions`' leases to be valid (a renewal late behind a slow broker or a
    /// starved CPU). nil once they are; otherwise the partitions lost: those a newer owner claimed, at once, or all
    /// of them when no renewal came in time.
    func awaitLease(_ partitions: Set<Int32>) async throws -> Set<Int32>? {
        guard !leaseValid(partitions) else { return nil }
        let started = ContinuousClock.now
        defer { leaseWaited(ContinuousClock.now - started) }
        let deadline = started + leaseDuration * 2
        while !leaseValid(partitions) {
            let fenced = fenced.intersection(partitions)
            if !fenced.isEmpty { return fenced }
            if ContinuousClock.now > deadline { return partitions }
            try await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }

    /// The gate of a delivery of `partitions`' outputs (`OutputDelivery.writeGate`): records may be enqueued until
    /// the earliest lease end among them, which the delivery keeps and asks for again only once it has passed. As
    /// safe as asking the leases before every record: a lease end is always that of a look at the state topic which
    /// saw no newer owner, which is all the fence needs (a fence found meanwhile only ends writing sooner).
    /// A lease that has run out without a newer owner (a renewal late behind a slow broker, a starved CPU) pauses
    /// the writing for up to two lease periods while a renewal comes (`awaitLease`); only then, or at once when
    /// fenced, the gate says no more.
    func leaseGate(_ partitions: Set<Int32>) -> EnqueueGate {
        EnqueueGate { [self] in
            // A lease renewed by the wait may have run out again before its end is read: look again, a few times.
            for _ in 0..<3 {
                if let end = leaseEnd(partitions), ContinuousClock.now < end { return end }
                do {
                    if try await awaitLease(partitions) != nil { return nil }
                } catch {
                    return nil
                }
            }
            return nil
        }
    }

    /// The earliest lease end among `partitions` (nil if one is not held).
    func leaseEnd(_ partitions: some Sequence<Int32>) -> ContinuousClock.Instant? {
        state.withLock { state in
            var end: ContinuousClock.Instant?
            for partition in partitions {
                guard case .until(let until) = state.held[partition]?.lease else { return nil }
                end = end.map { min($0, until) } ?? until
            }
            return end
        }
    }

    /// The replay requests the renewals found, oldest first. They stay here until `forgetReplayRecords` says how
    /// many of them the loop has recorded: one that recording them failed for is recorded by the next try.
    func replayRecords() -> [PartitionStateRecord] { state.withLock { $0.replayRecords.map(\.record) } }

    /// The first `count` of `replayRecords()` are recorded (or their partitions are no longer owned). Renewals
    /// only append, so they are still the first.
    func forgetReplayRecords(_ count: Int) {
        state.withLock { $0.replayRecords.removeFirst(min(count, $0.replayRecords.count)) }
    }

    var hasReplayRecords: Bool { state.withLock { !$0.replayRecords.isEmpty } }

    func takePositionRecords() -> [Int32: PartitionStateRecord] {
        state.withLock { state in
            defer { state.positionRecords = [:] }
            return state.positionRecords
        }
    }

    var hasPositionRecords: Bool { state.withLock { !$0.positionRecords.isEmpty } }

    /// Position requests taken but not taken up (their takeover failed), back for the retry; a request seen since
    /// stays (it is the later one).
    func returnPositionRecords(_ positions: [Int32: PartitionStateRecord]) {
        state.withLock { state in state.positionRecords.merge(positions) { newer, _ in newer } }
    }

    // MARK: What the writer tells

    /// Our records of `partitions` are being written.
    func beganWriting(_ partitions: some Sequence<Int32>) { state.withLock { $0.began(writing: partitions) } }

    /// The writes begun with `beganWriting` ended (acknowledged or not).
    func endedWriting(_ partitions: some Sequence<Int32>) { state.withLock { $0.ended(writing: partitions) } }

    /// Our records landed at these offsets.
    func wrote(_ landed: [(partition: Int32, offset: Int64)]) {
        state.withLock { state in
            for (partition, offset) in landed { state.advanceKnownEnd(partition, pastOurRecordAt: offset) }
        }
    }

    // MARK: Leases

    /// Renews leases every `renewInterval` until cancelled, then closes the renewals' consumer.
    /// `onFenced` gets the partitions a look found fenced, each with the owner that claimed it.
    func renewContinually(
        onFenced: @escaping @Sendable ([Int32: String]) -> Void, log: @escaping @Sendable (String) -> Void
    ) async {
        defer { renewalConsumer.close() }
        var lastFailure: ContinuousClock.Instant?
        var lastStart = ContinuousClock.now
        while !Task.isCancelled {
            do {
                // Paced by the looks' starts, not their ends: a look that takes a slow broker's round trip still
                // renews in time (its lease counts from its start).
                try await Task.sleep(until: lastStart + renewInterval, clock: .continuous)
                lastStart = .now
                let newlyFenced = try await renew()
                if !newlyFenced.isEmpty { onFenced(claimants(of: newlyFenced)) }
            } catch is CancellationError {
                return
            } catch {
                if lastFailure.map({ ContinuousClock.now - $0 > .seconds(10) }) ?? true {
                    lastFailure = .now
                    log("renewing partition leases failed: \(error)")
                }
            }
        }
    }

    /// One look at the owned partitions' state partitions. Returns the partitions found fenced by it.
    ///
    /// A partition whose state partition ends where we know it (every record ours, acknowledged in order) is
    /// renewed at once. Otherwise the unknown records are read: a newer epoch, or the same epoch claimed by
    /// another owner before our claim, fences it; anything else (our records in flight, an older owner's late
    /// record, a replay request) renews it. While our own records are in flight the read waits for a round
    /// without them, unless the lease is half gone.
    func renew() async throws -> Set<Int32> {
        let started = ContinuousClock.now
        let snapshot = state.withLock { state in
            state.held.filter { !$0.value.isFenced }.keys.map { ($0, state.generation[$0] ?? 0) }
        }
        guard !snapshot.isEmpty else { return [] }
        let ends = try await reader.cluster.endOffsets(snapshot.map { statePartition($0.0) }, timeout: reader.requestTimeout)
        var unknown: [Int32: (from: Int64, to: Int64)] = [:]
        // Whose claim each read is for: one claimed again meanwhile (a position request taken up) is not judged by
        // a read of before its claim, which would find the request it has taken up and ask for it again.
        var claims: [Int32: Int64] = [:]
        state.withLock { state in
            for (partition, generation) in snapshot {
                guard let held = state.held[partition], !held.isFenced, let end = ends[statePartition(partition)] else { continue }
                if end <= held.knownEnd {
                    state.held[partition]?.lease = .until(started + leaseDuration)
                    state.held[partition]?.renewedAt = started
                    continue
                }
                let quiet = (state.inFlight[partition] ?? 0) == 0 && state.generation[partition] ?? 0 == generation
                let overdue = held.renewedAt.map { started - $0 > leaseDuration / 2 } ?? true
                if quiet || overdue {
                    unknown[partition] = (held.knownEnd, end)
                    claims[partition] = held.claimOffset
                }
            }
        }
        guard !unknown.isEmpty else { return [] }
        var newlyFenced: Set<Int32> = []
        let found = try await reader.read(unknown, through: renewalConsumer)
        let records = found.records
        state.withLock { state in
            for (partition, range) in unknown {
                guard var held = state.held[partition], !held.isFenced, held.claimOffset == claims[partition] else { continue }
                let seen = records[partition] ?? []
                state.replayRecords += seen.filter { $0.record.kind == .replay }.map { ($0.offset, $0.record) }
                let position = seen.last { $0.record.isPositionRequest }
                if let position { state.positionRecords[partition] = position.record }
                func isRival(offset: Int64, epoch: Int64, owner: String?) -> Bool {
                    epoch > held.epoch || (epoch == held.epoch && owner != instanceId && offset < held.claimOffset)
                }
                func claimant(_ owner: String?, _ host: String?) -> String {
                    "instance \(owner ?? "(unnamed)") on \(host ?? "an unnamed host")"
                }
                if let rival = seen.first(where: { isRival(offset: $0.offset, epoch: $0.record.epoch, owner: $0.record.owner) })?.record {
                    held.lease = .fenced(by: claimant(rival.owner, rival.host))
                    newlyFenced.insert(partition)
                } else if let rival = found.newer[partition]?.first(where: {
                    // A newer version's record without an epoch this version can read is taken for a newer owner's.
                    isRival(offset: $0.offset, epoch: $0.record.epoch ?? .max, owner: $0.record.owner)
                })?.record {
                    held.lease = .fenced(
                        by: claimant(rival.owner, rival.host) + ", a newer mailpush (state record format \(rival.v); this version "
                            + "writes \(PartitionStateRecord.currentVersion))")
                    newlyFenced.insert(partition)
                } else {
                    // Not past a position request until it is taken up: the partition's state directory keeps where
                    // its restore starts from `knownEnd`, and one that restarts before taking it up must read it.
                    held.knownEnd = max(held.knownEnd, position?.offset ?? range.to)
                    held.lease = .until(started + leaseDuration)
                    held.renewedAt = started
                }
                state.held[partition] = held
            }
        }
        return newlyFenced
    }
}
