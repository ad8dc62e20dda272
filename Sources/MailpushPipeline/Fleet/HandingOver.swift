import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

extension PipelineRun {
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
                PartitionStateRecord.release(
                    topic: events, partition: partition, epoch: epoch, owner: fleet.instanceId, offset: offset, marks: marks))
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
