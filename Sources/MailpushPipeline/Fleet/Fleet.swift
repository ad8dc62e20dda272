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
    var member: KafkaGroupMember?

    /// This instance in the state topic (the state directory's id): what its records name as their owner.
    var instanceId: String { writer.instanceId }
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

    /// Points the events consumer at the owned partitions, each at its committed offset.
    func reassignEvents() throws {
        try events.assign(
            Dictionary(uniqueKeysWithValues: ownedEventPartitions.map { ($0, StartOffset.offset(committed[$0] ?? 0)) }))
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
}
