import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// One takeover of some event partitions, from their restore to processing: what each step leaves for the next.
struct Takeover {
    /// The partitions still being taken over (a rival's claim, or a resume that finds another owner, removes some).
    var partitions: Set<Int32>
    let started: ContinuousClock.Instant
    /// Per partition, its restored state: this state directory's, then the state topic's records beyond it.
    var folds: [Int32: PartitionRestore] = [:]
    /// Per partition, the state-topic range the restore read.
    var ranges: [Int32: (from: Int64, to: Int64)] = [:]
    /// The epochs this state directory recorded (a claim must be newer than both these and the state topic's).
    var localOwners: [TopicPartition: PartitionOwnerRecord] = [:]
    /// Per partition, the newest of the records a newer mailpush wrote there (`NewerStateRecord`), which the restore
    /// could not follow.
    var newer: [Int32: NewerStateRecord] = [:]
    var restoredBytes = 0
    var restoredAt: ContinuousClock.Instant
    var claimedAt: ContinuousClock.Instant
    /// Some previous owner did not release: its outputs may still be on their way.
    var mustWait = false
    var waited = Duration.zero

    init(_ partitions: Set<Int32>, at started: ContinuousClock.Instant) {
        self.partitions = partitions
        self.started = started
        restoredAt = started
        claimedAt = started
    }
}

extension OwnedPartitions {
    /// An assignment: restores `partitions` from the state topic, claims them, gives up any a rival claimed first,
    /// waits out a replaced owner's lease if it did not release them, reads back what earlier owners left
    /// unfinished, and starts processing them.
    ///
    /// `resuming`: at start-up, before the group has assigned anything, only the partitions whose last owner in
    /// the state topic is this instance (a restart: nobody claimed them since) are taken; the others are left to
    /// the group. The group's assignment later confirms them (nothing to do) or gives them to another member,
    /// whose newer claim fences this one (docs/exactly-once.md, "A fleet").
    ///
    /// `positions`: requests of `mailpush offsets --set` this instance saw in lease renewals, past where its
    /// restore starts (`giveUpToMove`); a restore takes up those it reads itself.
    mutating func takeOver(
        _ requested: Set<Int32>, resuming: Bool = false, positions: [Int32: PartitionStateRecord] = [:],
        committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays, delivery: OutputDelivery
    ) async throws {
        guard let fleet else { return }
        var takeover = try await restore(requested, positions: positions)
        if resuming {
            takeover.partitions = takeover.partitions.filter { takeover.folds[$0]?.owner == fleet.instanceId }
            fleet.inbox.phases.remove(requested.subtracting(takeover.partitions))
            guard !takeover.partitions.isEmpty else { return }
        }
        try await claim(&takeover, committed: &committed, replays: &replays, delivery: delivery)
        try await yieldToRivals(&takeover, committed: &committed, recovery: &recovery, replays: &replays)
        guard !takeover.partitions.isEmpty else { return }
        try await waitForPreviousOwners(&takeover)
        let readBack = try await readBack(takeover, committed: committed, recovery: &recovery, delivery: delivery)
        startProcessing(takeover, readBack: readBack)
    }

    /// Step 1, restore: what the state topic holds beyond what this state directory already reflects, once the
    /// batch records this directory left unwritten are in it.
    func restore(_ partitions: Set<Int32>, positions: [Int32: PartitionStateRecord] = [:]) async throws -> Takeover {
        guard let fleet else { return Takeover([], at: .now) }
        let clock = ContinuousClock()
        var takeover = Takeover(partitions, at: clock.now)
        fleet.inbox.phases.set(.restoring, partitions)
        try await writeUnwrittenStateRecords()
        let writer = fleet.writer
        takeover.localOwners = try store.partitionOwners()
        let localOffsets = try store.offsets()
        let localMarks = try store.outputMarks()
        let ends = try await cluster.endOffsets(partitions.map { writer.statePartition($0) }, timeout: timeout)
        for partition in partitions {
            let eventPartition = TopicPartition(topic: eventsTopic, partition: partition)
            let end = ends[writer.statePartition(partition)] ?? 0
            if let local = takeover.localOwners[eventPartition], local.stateNextOffset > 0, let offset = localOffsets[eventPartition] {
                takeover.folds[partition] = PartitionRestore(
                    epoch: local.epoch, owner: fleet.instanceId, offset: offset, marks: local.marks ?? localMarks)
                takeover.ranges[partition] = (local.stateNextOffset, end)
            } else {
                takeover.folds[partition] = PartitionRestore()
                takeover.ranges[partition] = (0, end)
            }
        }
        let read = try await writer.leases.reader.read(takeover.ranges)
        takeover.restoredBytes = read.bytes
        for (partition, list) in read.records {
            for entry in list { takeover.folds[partition]?.apply(entry.record, at: entry.offset) }
        }
        for partition in read.newer.keys {
            // The claim must be newer than the newer version's owner too, or that owner would take it for a replaced
            // owner's.
            takeover.newer[partition] = read.newerOwner(of: partition)
        }
        for partition in partitions {
            // A request this instance saw in a renewal, when nobody claimed the partition since: a newer owner's
            // claim came after the request too, and that owner takes it up (from its restore or its renewal).
            let seen = takeover.folds[partition]?.owner == fleet.instanceId ? positions[partition] : nil
            takeover.folds[partition]?.takeUpPosition(seen)
        }
        takeover.restoredAt = clock.now
        return takeover
    }

    /// Step 2, claim: each partition with a new epoch, from the restored offset (or, for a partition nobody ever
    /// processed, the initial position); the lease runs from the claim. The restored state is applied locally.
    func claim(
        _ takeover: inout Takeover, committed: inout [TopicPartition: Int64], replays: inout ServiceReplays, delivery: OutputDelivery
    ) async throws {
        guard let fleet else { return }
        let clock = ContinuousClock()
        let events = eventsTopic
        let writer = fleet.writer
        let fresh = takeover.partitions.filter { takeover.folds[$0]?.offset == nil }.map {
            TopicPartition(topic: events, partition: $0)
        }
        var pinned: [TopicPartition: Int64] = [:]
        if !fresh.isEmpty {
            pinned =
                switch pipeline.configuration.initialPosition {
                case .earliest: try await cluster.beginningOffsets(fresh, timeout: timeout)
                case .latest: try await cluster.endOffsets(fresh, timeout: timeout)
                }
        }

        // A fresh partition's outputs can only come after its claim: the output topics' ends now bound them for
        // a successor that restores the claim alone (its owner died before any batch record landed). Without
        // them the successor's read-back would start at its own marks, which may lie past those outputs.
        let outputEnds = fresh.isEmpty ? [:] : try await cluster.endOffsets(delivery.partitions, timeout: timeout)

        let partitions = takeover.partitions.sorted()
        let claims = partitions.map { partition in
            let fold = takeover.folds[partition]!
            let eventPartition = TopicPartition(topic: events, partition: partition)
            return PartitionStateRecord.claim(
                topic: events, partition: partition,
                epoch: max(fold.epoch, takeover.localOwners[eventPartition]?.epoch ?? -1, takeover.newer[partition]?.epoch ?? -1) + 1,
                owner: fleet.instanceId, host: ProcessInfo.processInfo.hostName,
                offset: fold.offset ?? pinned[eventPartition] ?? 0, marks: fold.offset == nil ? outputEnds : fold.marks,
                restoredTo: takeover.ranges[partition]!.to)
        }
        // Every claim in one send, and the restored state applied in one transaction: partition by partition, a
        // restart that resumed 128 partitions spent 0.45 s here (a produce round trip and a transaction each), now
        // 0.17 s. Every lease runs from before the send, as each did from its own claim's.
        let leaseFrom = clock.now
        let claimOffsets = try await writer.publishClaims(claims)
        takeover.claimedAt = clock.now
        var restored: [RestoredPartition] = []
        for (claim, claimOffset) in zip(claims, claimOffsets) {
            let fold = takeover.folds[claim.partition]!
            writer.leases.adopt(
                claim.partition, epoch: claim.epoch, claimOffset: claimOffset, knownEnd: takeover.ranges[claim.partition]!.to,
                leaseFrom: leaseFrom)
            if let owner = fold.owner, owner != fleet.instanceId, !fold.released { takeover.mustWait = true }
            // Whether the newer version's owner released cannot be read: its outputs may still be on their way.
            if takeover.newer[claim.partition] != nil { takeover.mustWait = true }
            restored.append(
                RestoredPartition(
                    partition: TopicPartition(topic: events, partition: claim.partition), offset: claim.offset,
                    outputMarks: fold.offset == nil ? [:] : fold.marks, processedEmails: fold.emails,
                    // From where the restore stopped reading, not past the claim: a request that landed between
                    // the two (a position or replay request) is read again by a restart before its first renewal.
                    owner: PartitionOwnerRecord(epoch: claim.epoch, stateNextOffset: takeover.ranges[claim.partition]!.to)))
        }
        try store.applyRestored(restored)
        for claim in claims {
            let partition = claim.partition
            let fold = takeover.folds[partition]!
            let eventPartition = TopicPartition(topic: events, partition: partition)
            committed[eventPartition] = claim.offset
            // Before the read-back: it also collects outputs of a replay batch the previous owner left unfinished.
            try replays.recordFleetReplays(
                [partition: Array(fold.replays.values)], replacing: true, eventsTopic: events, store: store, logger: logger)
            try store.recordDeletableStateRecords(
                fold.deletableRecords.map {
                    DeletableStateRecord(partition: eventPartition, key: $0.key, deleteAfterMs: $0.atMs, coveredAt: $0.coveredAt)
                })
            fleet.statePublisher.began(claim)
            if let newer = takeover.newer[partition] {
                // A rollback, or a rolling upgrade handing a partition back: the read-back still finds what the newer
                // version wrote past the restored offset, but not its dedupe entries.
                logger.warning(
                    "event partition taken over from a newer mailpush: its state records are of a format this version cannot read",
                    metadata: [
                        "partition": "\(partition)", "format": "\(newer.v)", "newerOwner": "\(newer.owner ?? "unnamed")",
                        "host": "\(newer.host ?? "unnamed")",
                        "consequence": .string(
                            "continues from this version's own records; an email the newer version processed is sent again "
                                + "if its event is published again"),
                    ])
            }
            logger.info(
                "event partition taken over",
                metadata: [
                    "partition": "\(partition)", "epoch": "\(claim.epoch)", "offset": "\(claim.offset)",
                    "previousOwner": "\(fold.owner ?? "none")", "released": "\(fold.released)",
                    "stateRecords": "\(fold.records)", "dedupeEntries": "\(fold.emails.count)",
                    "restoredFrom": "\(takeover.ranges[partition]!.from)",
                    "offsetSetBy": "\(fold.position.map { $0.host ?? $0.owner } ?? "none")",
                ])
        }
    }

    /// Step 3, the read before writing: a rival's claim that landed between the restore's read and ours (another
    /// member restoring at the same time) is read before anything is written. The first claim of an epoch wins, a
    /// newer epoch always does; a partition lost so is given up, having written nothing.
    mutating func yieldToRivals(
        _ takeover: inout Takeover, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) async throws {
        guard let fleet else { return }
        let rivals = try await fleet.leases.renew().union(fleet.leases.fenced).intersection(takeover.partitions)
        guard !rivals.isEmpty else { return }
        logger.warning(
            "another owner claimed event partitions while they were being taken over; leaving them to it",
            metadata: ["partitions": "\(rivals.sorted())"])
        try giveUp(rivals, committed: &committed, recovery: &recovery, replays: &replays)
        takeover.partitions.subtract(rivals)
    }

    /// Step 4: a previous owner that did not release may still have outputs on their way: wait until none can land
    /// (`PartitionLeases.takeoverWait` after the last claim was acknowledged).
    func waitForPreviousOwners(_ takeover: inout Takeover) async throws {
        guard let fleet, takeover.mustWait else { return }
        let clock = ContinuousClock()
        fleet.inbox.phases.set(.waitingForLease, takeover.partitions)
        let until = takeover.claimedAt + fleet.leases.takeoverWait
        takeover.waited = until - clock.now
        if takeover.waited > .zero {
            logger.notice(
                "waiting for the previous owner's lease to end before reading back",
                metadata: ["partitions": "\(takeover.partitions.sorted())", "waitMs": "\(takeover.waited.milliseconds)"])
            try await Task.sleep(until: until, clock: clock)
        }
    }

    /// Step 5, read back what earlier owners (or this instance before a crash) wrote for unfinished batches: those
    /// outputs are not produced again.
    func readBack(
        _ takeover: Takeover, committed: [TopicPartition: Int64], recovery: inout Recovery, delivery: OutputDelivery
    ) async throws -> OutputScanner.Scan {
        let partitions = takeover.partitions
        fleet?.inbox.phases.set(.readingBack, partitions)
        let events = eventsTopic
        let scanCommitted = committed.filter { $0.key.topic == events && partitions.contains($0.key.partition) }
        // A partition moved by `offsets --set` reads back only what came after the request: outputs before it name
        // offsets it has left, perhaps of an events topic deleted and created again, whose offsets start over.
        let floors = takeover.folds.compactMapValues { $0.position == nil ? nil : $0.marks }
        let scan = try await delivery.scan(committed: scanCommitted, owned: { partitions.contains($0) }, floors: floors)
        recovery.merge(scan)
        if !scan.found.isEmpty {
            logger.notice(
                "found outputs of an unfinished batch of a previous owner; they will not be produced again",
                metadata: ["outputs": "\(scan.found.count)", "partitions": "\(scan.horizon.keys.sorted().map(\.description))"])
        }
        return scan
    }

    /// Step 6: the partitions are processed from here on (the caller points the events consumer at them).
    mutating func startProcessing(_ takeover: Takeover, readBack scan: OutputScanner.Scan) {
        let clock = ContinuousClock()
        let partitions = takeover.partitions
        add(partitions)
        metrics.partitionsTakenOver.increment(by: partitions.count)
        metrics.restoreBytes.increment(by: takeover.restoredBytes)
        metrics.takeoverReadback.increment(by: Int(scan.recordsRead))
        metrics.restoreDuration.record(duration: takeover.restoredAt - takeover.started)
        metrics.takeoverDuration.record(duration: clock.now - takeover.started)
        logger.info(
            "processing taken-over event partitions",
            metadata: [
                "partitions": "\(partitions.sorted())", "restoreMs": "\((takeover.restoredAt - takeover.started).milliseconds)",
                "restoreBytes": "\(takeover.restoredBytes)", "waitedMs": "\(max(.zero, takeover.waited).milliseconds)",
                "readBack": "\(scan.recordsRead)", "takeoverMs": "\((clock.now - takeover.started).milliseconds)",
            ])
        fleet?.inbox.phases.set(.processing, partitions)
    }

    /// At start-up, before the group's first assignment: takes over again the event partitions this instance held
    /// when it stopped, if nobody has claimed them since. A restart then processes them at once instead of after
    /// the group's rounds (on the development broker: session timeout, then a round, after a kill); on a real
    /// cluster static membership gives them back without a rebalance anyway. Safe beside the group: a member the
    /// group gives them to meanwhile claims them with a newer epoch (or the same epoch later, which loses) and
    /// this instance's claim waits for nothing, since its previous process is gone (the state directory's lock).
    mutating func resumeHeldPartitions(
        existing: [TopicPartition], committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays,
        delivery: OutputDelivery
    ) async throws {
        guard fleet != nil else { return }
        let held = Set(try store.partitionOwners().keys).intersection(existing)
        guard !held.isEmpty else { return }
        logger.info(
            "resuming the event partitions this instance held, unless another owner claimed them since",
            metadata: ["partitions": "\(held.map(\.partition).sorted())"])
        try await takeOver(
            Set(held.map(\.partition)), resuming: true, committed: &committed, recovery: &recovery, replays: &replays, delivery: delivery)
    }
}

extension OwnedPartitions {
    /// The batch records this state directory keeps unwritten (`UnwrittenStateRecord`), oldest first: of the
    /// event partitions `only` if given, else of those this run does not process now.
    func unwrittenStateRecords(of only: Set<Int32>? = nil) throws(StateError) -> [(id: Int64, record: PartitionStateRecord)] {
        let rows = try store.unwrittenStateRecords(except: only == nil ? Set(partitions) : []).filter { row in
            row.partition.topic == eventsTopic && (only?.contains(row.partition.partition) ?? true)
        }
        return rows.compactMap { row in
            guard let record = PartitionStateRecord.decode(unwritten: row) else {
                logger.error(
                    "an unwritten state record in the state directory is not one this version reads; it is not written",
                    metadata: ["partition": "\(row.partition)", "id": "\(row.id)"])
                return nil
            }
            return (row.id, record)
        }
    }

    /// Writes the batch records a crash (or a failed write, or a lost lease) left unwritten, before a takeover
    /// reads the state topic: an owner that committed a batch and died before its record landed has that batch's
    /// dedupe entries only here. Taking the partition back from this directory would claim past them, and a later
    /// owner restoring from the state topic would process those emails again (docs/exactly-once.md, "Unwritten
    /// state records"). Written without a lease: a record of an older epoch changes no newer owner's chain, and
    /// its dedupe entries are true whoever owns the partition now (their outputs were all acknowledged).
    func writeUnwrittenStateRecords() async throws {
        let unwritten = try unwrittenStateRecords()
        guard !unwritten.isEmpty else { return }
        try await write(unwritten)
        logger.notice(
            "wrote batch records this state directory kept unwritten (a crash or a failed write came between a commit and its record)",
            metadata: [
                "records": "\(unwritten.count)", "partitions": "\(Set(unwritten.map(\.record.partition)).sorted())",
            ])
    }

    /// Writes `unwritten` (then `records`, in one ordered write) and lets the state directory forget them once the
    /// state topic acknowledged them, remembering the batch records' keys for deletion.
    func write(_ unwritten: [(id: Int64, record: PartitionStateRecord)], before records: [PartitionStateRecord] = []) async throws {
        guard let fleet else { return }
        try await fleet.writer.publish(unwritten.map(\.record) + records)
        try store.stateRecordsWritten(unwritten.map(\.id), deletable: unwritten.map(\.record).deletable)
    }
}
