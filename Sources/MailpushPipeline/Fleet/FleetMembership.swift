import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// A partition of this batch may belong to another instance by now (its lease ended, or a newer owner claimed
/// it): nothing more of the batch is written, and the partitions are given up.
struct OwnershipLost: Error, CustomStringConvertible {
    var partitions: Set<Int32>
    var description: String { "ownership of event partitions \(partitions.sorted()) lost" }
}

/// What a run in a fleet keeps beside the batch loop: the group membership, the inbox of its news, the
/// state writer with the leases.
struct Fleet {
    let settings: GroupSettings
    let inbox: GroupInbox
    let writer: StateWriter
    let statePublisher: BatchStatePublisher
    let instanceId: String
    var member: KafkaGroupMember?
}

extension PipelineRun {
    /// Whether this run processes event partition `partition` now.
    func owns(_ partition: Int32) -> Bool {
        if fleet != nil { return ownedEventPartitions.contains { $0.partition == partition } }
        guard case .fixed(let ownership) = pipeline.configuration.ownership else { return false }
        return ownership.owns(partition: partition)
    }

    /// Joins the group: from here on, rebalances reach the inbox.
    mutating func joinGroup() throws {
        guard let fleet else { return }
        let inbox = fleet.inbox
        let member = try PipelineError.creatingClient { () throws(KafkaError) in
            try KafkaGroupMember(
                configuration: pipeline.configuration.groupMemberKafka, groupId: fleet.settings.id,
                topic: pipeline.configuration.topics.events,
                onAssign: { inbox.assigned($0) }, onRevoke: { inbox.revoked($0, lost: $1) })
        }
        self.fleet?.member = member
        logger.info(
            "joining the consumer group", metadata: ["group": "\(fleet.settings.id)", "instanceId": "\(fleet.instanceId)"])
    }

    /// Acts on the group's news between batches: releases revoked partitions, gives up lost or fenced ones,
    /// takes assigned ones over. A batch planned ahead is dropped (its records are read again).
    mutating func applyGroupChanges(prepared: inout BatchPlan?) async throws {
        guard let fleet else { return }
        await settleStatePublish()
        let changes = fleet.inbox.take()
        let fenced = fleet.writer.fenced.intersection(ownedEventPartitions.map(\.partition))
        guard !changes.isEmpty || !fenced.isEmpty else { return }
        if prepared != nil { prepared = nil }
        let owned = Set(ownedEventPartitions.map(\.partition))
        let lost = changes.lost.union(fenced).intersection(owned)
        let released = changes.revoked.subtracting(lost).intersection(owned)
        if !released.isEmpty {
            try await release(released)
        }
        if !lost.isEmpty {
            try give(up: lost)
            metrics.partitionsLost.increment(by: lost.count)
            logger.warning(
                "event partitions lost: this instance was dropped from the group or another owner claimed them; nothing more is written for them",
                metadata: ["partitions": "\(lost.sorted())"])
        }
        fleet.inbox.released(changes.revoked)
        let assigned = changes.assigned.subtracting(owned.subtracting(lost).subtracting(released))
        if !assigned.isEmpty {
            do {
                try await takeOver(assigned)
            } catch {
                // Taken from the inbox but not over: back in, so that the retry takes them over (a partition
                // claimed meanwhile is claimed again with a newer epoch, which changes nothing for its state).
                fleet.inbox.assigned(Array(assigned))
                throw error
            }
        }
        try reassignEvents()
        metrics.ownedPartitions.record(ownedEventPartitions.count)
        metrics.rebalances.increment()
    }

    /// Stops processing `partitions` without writing anything more for them.
    mutating func give(up partitions: Set<Int32>) throws {
        // Today's marks are valid for what these partitions left unfinished here (the mark rule held while they
        // were owned); kept per partition, since the instance-wide marks move on without them. Should one come
        // back with no other owner in between, its read-back starts there.
        let marks = try store.outputMarks()
        let events = pipeline.configuration.topics.events
        for partition in partitions {
            guard let epoch = fleet?.writer.epoch(of: partition) else { continue }
            try store.setPartitionOwner(
                TopicPartition(topic: events, partition: partition),
                PartitionOwnerRecord(epoch: epoch, stateNextOffset: fleet?.writer.knownEnd(of: partition) ?? 0, marks: marks))
        }
        // A replay of these partitions stops here; their owner continues it from the progress written.
        if let active = replays.active, !Set(active.tracker.starts.keys).isDisjoint(with: partitions) {
            active.consumer.close()
            replays.active = nil
            replays.lastCheck = .now - .seconds(60)
        }
        ownedEventPartitions.removeAll { partitions.contains($0.partition) }
        for partition in partitions { committed[TopicPartition(topic: pipeline.configuration.topics.events, partition: partition)] = nil }
        recovery.drop(eventPartitions: partitions)
        fleet?.statePublisher.forget(partitions)
        fleet?.writer.drop(partitions)
        fleet?.inbox.phases.remove(partitions)
    }

    /// Hands `partitions` over: their last batch is committed, so a release record tells the next owner where
    /// to continue and that nothing of ours is in flight.
    mutating func release(_ partitions: Set<Int32>) async throws {
        guard let fleet else { return }
        let marks = PartitionStateRecord.encodeMarks(try store.outputMarks())
        let events = pipeline.configuration.topics.events
        var records: [PartitionStateRecord] = []
        for partition in partitions.sorted() {
            guard let epoch = fleet.writer.epoch(of: partition),
                let offset = committed[TopicPartition(topic: events, partition: partition)]
            else { continue }
            records.append(
                PartitionStateRecord(
                    kind: .release, topic: events, partition: partition, epoch: epoch, owner: fleet.instanceId, offset: offset,
                    marks: marks))
        }
        // Nothing of ours may follow the release: no checkpoint (it would undo the release in a restore), no retry.
        fleet.statePublisher.forget(partitions)
        await settleStatePublish()
        if fleet.writer.leaseValid(partitions) {
            // A release that does not land only makes the next owner wait for our lease to end.
            do {
                try await fleet.writer.publish(records)
            } catch {
                logger.warning("writing release records failed; the next owner waits out the lease", metadata: ["error": "\(error)"])
            }
        }
        try give(up: partitions)
        metrics.partitionsReleased.increment(by: partitions.count)
        logger.info(
            "event partitions released",
            metadata: ["partitions": "\(partitions.sorted())", "committed": "\(records.map { "\($0.partition)=\($0.offset)" })"])
    }

    /// Restores `partitions` from the state topic, claims them, waits out a replaced owner's lease if it did not
    /// release them, reads back what earlier owners left unfinished, and starts processing them.
    ///
    /// `resuming`: at start-up, before the group has assigned anything, only the partitions whose last owner in
    /// the state topic is this instance (a restart: nobody claimed them since) are taken; the others are left to
    /// the group. The group's assignment later confirms them (nothing to do) or gives them to another member,
    /// whose newer claim fences this one (docs/exactly-once.md, "A fleet").
    mutating func takeOver(_ requested: Set<Int32>, resuming: Bool = false) async throws {
        guard let fleet else { return }
        var partitions = requested
        let clock = ContinuousClock()
        let started = clock.now
        let phases = fleet.inbox.phases
        phases.set(.restoring, partitions)
        let events = pipeline.configuration.topics.events
        let writer = fleet.writer
        let localOwners = try store.partitionOwners()
        let localOffsets = try store.offsets()
        let localMarks = try store.outputMarks()

        // 1. Restore: what the state topic holds beyond what this state directory already reflects.
        var folds: [Int32: PartitionRestore] = [:]
        var ranges: [Int32: (from: Int64, to: Int64)] = [:]
        let ends = try await cluster.endOffsets(partitions.map { writer.statePartition($0) }, timeout: timeout)
        for partition in partitions {
            let eventPartition = TopicPartition(topic: events, partition: partition)
            if let local = localOwners[eventPartition], local.stateNextOffset > 0, let offset = localOffsets[eventPartition] {
                folds[partition] = PartitionRestore(
                    epoch: local.epoch, owner: fleet.instanceId, offset: offset, marks: local.marks ?? localMarks)
                ranges[partition] = (local.stateNextOffset, ends[writer.statePartition(partition)] ?? 0)
            } else {
                folds[partition] = PartitionRestore()
                ranges[partition] = (0, ends[writer.statePartition(partition)] ?? 0)
            }
        }
        var bytes = 0
        let records = try await writer.readRecords(ranges, bytes: &bytes)
        for (partition, list) in records {
            for entry in list { folds[partition]?.apply(entry.record) }
        }
        let restoredAt = clock.now
        if resuming {
            partitions = partitions.filter { folds[$0]?.owner == fleet.instanceId }
            phases.remove(requested.subtracting(partitions))
            guard !partitions.isEmpty else { return }
        }

        // 2. Start offsets for partitions nobody ever processed.
        let fresh = partitions.filter { folds[$0]?.offset == nil }.map { TopicPartition(topic: events, partition: $0) }
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

        // 3. Claim each with a new epoch; the lease runs from the claim.
        var mustWait = false
        var claimedAt = clock.now
        for partition in partitions.sorted() {
            let fold = folds[partition]!
            let eventPartition = TopicPartition(topic: events, partition: partition)
            let offset = fold.offset ?? pinned[eventPartition] ?? 0
            let marks = fold.offset == nil ? [:] : fold.marks
            let epoch = max(fold.epoch, localOwners[eventPartition]?.epoch ?? -1) + 1
            let claim = PartitionStateRecord(
                kind: .claim, topic: events, partition: partition, epoch: epoch, owner: fleet.instanceId,
                host: ProcessInfo.processInfo.hostName, offset: offset,
                marks: PartitionStateRecord.encodeMarks(fold.offset == nil ? outputEnds : marks))
            let leaseFrom = clock.now
            let claimOffset = try await writer.publishClaim(claim)
            claimedAt = clock.now
            writer.adopt(
                partition, epoch: epoch, claimOffset: claimOffset, knownEnd: ranges[partition]!.to, leaseFrom: leaseFrom)
            if let owner = fold.owner, owner != fleet.instanceId, !fold.released { mustWait = true }
            try store.applyRestored(
                RestoredPartition(
                    partition: eventPartition, offset: offset, outputMarks: marks, processedEmails: fold.emails,
                    owner: PartitionOwnerRecord(epoch: epoch, stateNextOffset: claimOffset + 1)))
            committed[eventPartition] = offset
            // Before the read-back: it also collects outputs of a replay batch the previous owner left unfinished.
            try recordFleetReplays([partition: Array(fold.replays.values)], replacing: true)
            try store.recordDeletableStateRecords(
                fold.deletableRecords.map {
                    DeletableStateRecord(partition: eventPartition, key: $0.key, deleteAfterMs: $0.atMs, coveredAt: $0.coveredAt)
                })
            fleet.statePublisher.began(claim)
            logger.info(
                "event partition taken over",
                metadata: [
                    "partition": "\(partition)", "epoch": "\(epoch)", "offset": "\(offset)",
                    "previousOwner": "\(fold.owner ?? "none")", "released": "\(fold.released)",
                    "stateRecords": "\(fold.records)", "dedupeEntries": "\(fold.emails.count)",
                    "restoredFrom": "\(ranges[partition]!.from)",
                ])
        }

        // 3b. A rival's claim that landed between the restore's read and ours (another member restoring at the same
        // time) is read before anything is written: the first claim of an epoch wins, a newer epoch always does.
        let rivals = try await writer.renew().union(writer.fenced).intersection(partitions)
        if !rivals.isEmpty {
            logger.warning(
                "another owner claimed event partitions while they were being taken over; leaving them to it",
                metadata: ["partitions": "\(rivals.sorted())"])
            try give(up: rivals)
            partitions.subtract(rivals)
            guard !partitions.isEmpty else { return }
        }

        // 4. A previous owner that did not release may still have outputs on their way: wait until none can land.
        var waited = Duration.zero
        if mustWait {
            phases.set(.waitingForLease, partitions)
            let until = claimedAt + writer.takeoverWait
            waited = until - clock.now
            if waited > .zero {
                logger.notice(
                    "waiting for the previous owner's lease to end before reading back",
                    metadata: ["partitions": "\(partitions.sorted())", "waitMs": "\(waited.milliseconds)"])
                try await Task.sleep(until: until, clock: clock)
            }
        }

        // 5. Read back what earlier owners (or this instance before a crash) wrote for unfinished batches.
        phases.set(.readingBack, partitions)
        let scanCommitted = committed.filter { $0.key.topic == events && partitions.contains($0.key.partition) }
        let scan = try await delivery.scan(committed: scanCommitted, owned: { partitions.contains($0) })
        recovery.merge(scan)
        if !scan.found.isEmpty {
            logger.notice(
                "found outputs of an unfinished batch of a previous owner; they will not be produced again",
                metadata: ["outputs": "\(scan.found.count)", "partitions": "\(scan.horizon.keys.sorted().map(\.description))"])
        }
        ownedEventPartitions.append(contentsOf: partitions.sorted().map { TopicPartition(topic: events, partition: $0) })
        ownedEventPartitions.sort()
        metrics.partitionsTakenOver.increment(by: partitions.count)
        metrics.restoreBytes.increment(by: bytes)
        metrics.takeoverReadback.increment(by: Int(scan.recordsRead))
        metrics.restoreDuration.record(duration: restoredAt - started)
        metrics.takeoverDuration.record(duration: clock.now - started)
        logger.info(
            "processing taken-over event partitions",
            metadata: [
                "partitions": "\(partitions.sorted())", "restoreMs": "\((restoredAt - started).milliseconds)",
                "restoreBytes": "\(bytes)", "waitedMs": "\(max(.zero, waited).milliseconds)", "readBack": "\(scan.recordsRead)",
                "takeoverMs": "\((clock.now - started).milliseconds)",
            ])
        phases.set(.processing, partitions)
    }

    /// At start-up, before the group's first assignment: takes over again the event partitions this instance held
    /// when it stopped, if nobody has claimed them since. A restart then processes them at once instead of after
    /// the group's rounds (on the development broker: session timeout, then a round, after a kill); on a real
    /// cluster static membership gives them back without a rebalance anyway. Safe beside the group: a member the
    /// group gives them to meanwhile claims them with a newer epoch (or the same epoch later, which loses) and
    /// this instance's claim waits for nothing, since its previous process is gone (the state directory's lock).
    mutating func resumeHeldPartitions(existing: [TopicPartition]) async throws {
        let held = Set(try store.partitionOwners().keys).intersection(existing)
        guard !held.isEmpty else { return }
        logger.info(
            "resuming the event partitions this instance held, unless another owner claimed them since",
            metadata: ["partitions": "\(held.map(\.partition).sorted())"])
        try await takeOver(Set(held.map(\.partition)), resuming: true)
        if !ownedEventPartitions.isEmpty { try reassignEvents() }
    }

    /// Points the events consumer at the owned partitions, each at its committed offset.
    func reassignEvents() throws {
        try events.assign(
            Dictionary(uniqueKeysWithValues: ownedEventPartitions.map { ($0, StartOffset.offset(committed[$0] ?? 0)) }))
    }

    /// After a batch is committed: the batch records of its partitions (offsets, marks, dedupe entries). Made at
    /// the commit, whenever they are written: the marks must be this batch's (a later batch's marks may lie past
    /// outputs that a new owner, restoring only this record, must read back).
    func batchStateRecords(
        previous: [TopicPartition: Int64], offsets: [TopicPartition: Int64], batch: ProcessedBatch, processedAtMs: Int64
    ) throws(StateError) -> [PartitionStateRecord] {
        guard let fleet else { return [] }
        var emails: [Int32: [String]] = [:]
        for (email, partition) in zip(batch.processedEmails, batch.processedEmailPartitions) {
            emails[partition, default: []].append(email)
        }
        let marks = PartitionStateRecord.encodeMarks(try store.outputMarks())
        var records: [PartitionStateRecord] = []
        for (eventPartition, offset) in offsets.sorted(by: { $0.key < $1.key }) {
            guard let epoch = fleet.writer.epoch(of: eventPartition.partition), let from = previous[eventPartition] else { continue }
            records.append(
                PartitionStateRecord(
                    kind: .batch, topic: eventPartition.topic, partition: eventPartition.partition, epoch: epoch, owner: fleet.instanceId,
                    from: from, offset: offset, marks: marks, processedAtMs: processedAtMs, emails: emails[eventPartition.partition] ?? []))
        }
        return records
    }

    /// The state-topic records a batch's commit will be published as (their keys are remembered in the same
    /// commit, for deletion once their dedupe entries expired and a checkpoint reaches them).
    func batchRecordDeletions(offsets: [TopicPartition: Int64], batch: ProcessedBatch, processedAtMs: Int64) -> [DeletableStateRecord] {
        guard let fleet else { return [] }
        let withEntries = Set(batch.processedEmailPartitions)
        return offsets.compactMap { partition, offset in
            guard let epoch = fleet.writer.epoch(of: partition.partition) else { return nil }
            return DeletableStateRecord(
                partition: partition, key: "\(partition.topic)/\(partition.partition)/batch/\(epoch)/\(offset)",
                deleteAfterMs: withEntries.contains(partition.partition) ? processedAtMs : 0, coveredAt: offset)
        }
    }

    /// Starts writing a committed batch's state records, while the next batch is delivered: they take a
    /// produce round trip per partition, which would otherwise stand between every two batches.
    func publishBatchState(_ records: [PartitionStateRecord]) {
        fleet?.statePublisher.submit(records)
    }

    /// Waits until the batch records submitted have been written (or given up on): before anything that must
    /// follow them in the state topic (a release, a claim, leaving the group, giving a partition up).
    func settleStatePublish() async {
        await fleet?.statePublisher.settle()
    }

    /// At a graceful stop: release every owned partition, then leave the group at once.
    mutating func leaveGroup() async throws {
        guard let fleet else { return }
        await settleStatePublish()
        let owned = Set(ownedEventPartitions.map(\.partition))
        if !owned.isEmpty { try await release(owned) }
        fleet.inbox.close()
        await fleet.member?.close()
        logger.info("left the consumer group", metadata: ["group": "\(fleet.settings.id)"])
    }

    /// Before a round is written: every partition of the batch still has its lease (waiting briefly for a
    /// renewal that is due), or the batch stops with `OwnershipLost`.
    func checkLeases(_ partitions: Set<Int32>) async throws {
        guard let fleet else { return }
        let deadline = ContinuousClock.now + fleet.writer.leaseDuration * 2
        while !fleet.writer.leaseValid(partitions) {
            let fenced = fleet.writer.fenced.intersection(partitions)
            if !fenced.isEmpty { throw OwnershipLost(partitions: fenced) }
            if ContinuousClock.now > deadline { throw OwnershipLost(partitions: partitions) }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// After a batch stopped because a partition was lost: give the lost ones up and read back what the batch
    /// wrote for the others, so that they are not written twice when their events are read again.
    mutating func abandonBatch(_ lost: OwnershipLost) async throws {
        await settleStatePublish()
        let gone = lost.partitions.isEmpty ? (fleet?.writer.fenced ?? []) : lost.partitions
        logger.warning("a batch stopped: ownership of its partitions ended", metadata: ["partitions": "\(gone.sorted())"])
        let given = gone.intersection(ownedEventPartitions.map(\.partition))
        try give(up: given)
        // A lease that merely ran out (no newer owner seen) is taken again with a new claim; a fenced partition
        // waits for the group to revoke it.
        let fenced = fleet?.writer.fenced ?? []
        let retake = given.subtracting(fenced)
        if !retake.isEmpty { fleet?.inbox.assigned(Array(retake)) }
        try await retrying("reading back after a lost partition") { run in
            let scan = try await run.delivery.scan(
                committed: run.committed.filter { $0.key.topic == run.pipeline.configuration.topics.events })
            run.recovery.merge(scan)
        }
        try reassignEvents()
        metrics.ownedPartitions.record(ownedEventPartitions.count)
    }
}
