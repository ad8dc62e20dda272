import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

extension PipelineRun {
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
        let read = try await writer.readRecords(ranges)
        let bytes = read.bytes
        for (partition, list) in read.records {
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
            let claim = PartitionStateRecord.claim(
                topic: events, partition: partition, epoch: epoch, owner: fleet.instanceId, host: ProcessInfo.processInfo.hostName,
                offset: offset, marks: fold.offset == nil ? outputEnds : marks)
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
}
