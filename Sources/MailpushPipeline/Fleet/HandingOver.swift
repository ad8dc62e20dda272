import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

extension OwnedPartitions {
    /// A revocation: hands `partitions` over. Their last batch is committed, so a release record tells the next
    /// owner where to continue and that nothing of ours is in flight.
    mutating func release(
        _ released: Set<Int32>, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) async throws {
        guard let fleet else { return }
        let marks = PartitionStateRecord.encodeMarks(try store.outputMarks())
        let events = eventsTopic
        var records: [PartitionStateRecord] = []
        for partition in released.sorted() {
            guard let epoch = fleet.leases.epoch(of: partition),
                let offset = committed[TopicPartition(topic: events, partition: partition)]
            else { continue }
            records.append(
                PartitionStateRecord.release(
                    topic: events, partition: partition, epoch: epoch, owner: fleet.instanceId, offset: offset, marks: marks))
        }
        // Nothing of ours may follow the release: no checkpoint (it would undo the release in a restore), no retry.
        fleet.statePublisher.forget(released)
        await settleStatePublish()
        if fleet.leases.leaseValid(released) {
            // A release that does not land only makes the next owner wait for our lease to end. Batch records
            // whose write failed go first: the release would otherwise skip their dedupe entries.
            do {
                try await write(unwrittenStateRecords(of: released), before: records)
            } catch {
                logger.warning("writing release records failed; the next owner waits out the lease", metadata: ["error": "\(error)"])
            }
        }
        try giveUp(released, committed: &committed, recovery: &recovery, replays: &replays)
        metrics.partitionsReleased.increment(by: released.count)
        logger.info(
            "event partitions released",
            metadata: ["partitions": "\(released.sorted())", "committed": "\(records.map { "\($0.partition)=\($0.offset)" })"])
    }

    /// A loss: this member was dropped from the group, or a newer owner claimed `lost`. Given up without a release
    /// (the next owner waits out the lease).
    mutating func lose(
        _ lost: Set<Int32>, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) throws {
        try giveUp(lost, committed: &committed, recovery: &recovery, replays: &replays)
        metrics.partitionsLost.increment(by: lost.count)
        logger.warning(
            "event partitions lost: this instance was dropped from the group or another owner claimed them; nothing more is written for them",
            metadata: ["partitions": "\(lost.sorted())"])
    }

    /// After a batch stopped because a partition was lost (`OwnershipLost`): gives the lost ones up. A lease that
    /// merely ran out (no newer owner seen) is taken again with a new claim; a fenced partition waits for the group
    /// to revoke it. The caller reads back what the batch wrote for the others.
    mutating func abandon(
        _ lost: OwnershipLost, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) throws {
        guard let fleet else { return }
        // Which ones a newer owner claimed, asked before giving them up: the writer forgets what it gives up.
        let fenced = fleet.leases.fenced
        let gone = lost.partitions.isEmpty ? fenced : lost.partitions
        logger.warning("a batch stopped: ownership of its partitions ended", metadata: ["partitions": "\(gone.sorted())"])
        let given = gone.intersection(partitions.map(\.partition))
        try giveUp(given, committed: &committed, recovery: &recovery, replays: &replays)
        let retake = given.subtracting(fenced)
        if !retake.isEmpty { fleet.inbox.assigned(Array(retake)) }
    }

    /// Stops processing `partitions` without writing anything more for them.
    mutating func giveUp(
        _ given: Set<Int32>, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) throws {
        guard let fleet else { return }
        // Today's marks are valid for what these partitions left unfinished here (the mark rule held while they
        // were owned); kept per partition, since the instance-wide marks move on without them. Should one come
        // back with no other owner in between, its read-back starts there.
        let marks = try store.outputMarks()
        // A fleet replay of a partition not finished here is left to the partition's next owner, which learns it
        // from the state topic. Should that be this instance again, its restore reads the whole state partition:
        // the tail after what it has read holds no request, and its local one is finished as left to the owner.
        let replaysToRun = try store.partitionsWithPendingFleetReplays()
        for partition in given {
            guard let epoch = fleet.leases.epoch(of: partition) else { continue }
            let restoreStart = replaysToRun.contains(partition) ? 0 : fleet.leases.restoreStart(of: partition) ?? 0
            try store.setPartitionOwner(
                TopicPartition(topic: eventsTopic, partition: partition),
                PartitionOwnerRecord(epoch: epoch, stateNextOffset: restoreStart, marks: marks))
        }
        // A replay of these partitions stops here; their owner continues it from the progress written.
        replays.stop(touching: given)
        remove(given)
        for partition in given { committed[TopicPartition(topic: eventsTopic, partition: partition)] = nil }
        recovery.drop(eventPartitions: given)
        fleet.statePublisher.forget(given)
        fleet.leases.drop(given)
        fleet.inbox.phases.remove(given)
    }
}
