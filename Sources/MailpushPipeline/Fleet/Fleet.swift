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

/// What ownership keeps in a fleet: the group's settings, the inbox of its news, the state writer and its leases,
/// and the publisher of batch records.
struct Fleet {
    let settings: GroupSettings
    let inbox: GroupInbox
    let writer: StateWriter
    let statePublisher: BatchStatePublisher

    /// This instance in the state topic (the state directory's id): what its records name as their owner.
    var instanceId: String { writer.instanceId }
    /// The leases on the partitions this instance claimed, and the fence.
    var leases: PartitionLeases { writer.leases }
}

/// What the group and the fence told the loop since it last looked, taken at once: it acts on all of it together.
struct GroupNews {
    var changes: GroupInbox.Changes
    /// Owned partitions a newer owner claimed (`PartitionLeases.renew`).
    var fenced: Set<Int32>
    /// Partitions `mailpush offsets --set` asked to move, with the request, as lease renewals (and a takeover's
    /// look for rivals) saw them: owned ones are claimed again, assigned ones taken over from the request.
    var positions: [Int32: PartitionStateRecord] = [:]
}

extension OwnedPartitions {
    /// Joins the group: from here on, rebalances reach the inbox.
    mutating func joinGroup() throws {
        guard let fleet else { return }
        let inbox = fleet.inbox
        let configuration = pipeline.configuration
        let member = try PipelineError.creatingClient { () throws(KafkaError) in
            try KafkaGroupMember(
                configuration: configuration.groupMemberKafka, groupId: fleet.settings.id, topic: configuration.topics.events,
                onAssign: { inbox.assigned($0) }, onRevoke: { inbox.revoked($0, lost: $1) })
        }
        joined(member)
        logger.info(
            "joining the consumer group", metadata: ["group": "\(fleet.settings.id)", "instanceId": "\(fleet.instanceId)"])
    }

    /// The group's news and the fenced partitions, taken from the inbox; nil when there is nothing to act on.
    func takeGroupNews() -> GroupNews? {
        guard let fleet else { return nil }
        let changes = fleet.inbox.take()
        let fenced = fleet.leases.fenced.intersection(partitions.map(\.partition))
        let positions = fleet.leases.takePositionRecords()
        guard !changes.isEmpty || !fenced.isEmpty || !positions.isEmpty else { return nil }
        return GroupNews(changes: changes, fenced: fenced, positions: positions)
    }

    /// Acts on the group's news between batches: releases revoked partitions, gives up lost or fenced ones, takes
    /// assigned ones over.
    mutating func act(
        on news: GroupNews, committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays,
        delivery: OutputDelivery
    ) async throws {
        guard let fleet else { return }
        let owned = Set(partitions.map(\.partition))
        let lost = news.changes.lost.union(news.fenced).intersection(owned)
        let released = news.changes.revoked.subtracting(lost).intersection(owned)
        if !released.isEmpty {
            try await release(released, committed: &committed, recovery: &recovery, replays: &replays)
        }
        if !lost.isEmpty {
            try lose(lost, committed: &committed, recovery: &recovery, replays: &replays)
        }
        fleet.inbox.released(news.changes.revoked)
        let kept = owned.subtracting(lost).subtracting(released)
        // A request for a partition given up here stays in the state topic for its next owner's restore.
        let moved = Set(news.positions.keys).intersection(kept)
        if !moved.isEmpty { try giveUpToMove(moved, news.positions, committed: &committed, recovery: &recovery, replays: &replays) }
        let assigned = news.changes.assigned.union(moved).subtracting(kept.subtracting(moved))
        if !assigned.isEmpty {
            let positions = news.positions.filter { assigned.contains($0.key) }
            do {
                try await takeOver(
                    assigned, positions: positions, committed: &committed, recovery: &recovery, replays: &replays, delivery: delivery)
            } catch {
                // Taken from the inbox (or given up to move) but not over: back in, with their position requests,
                // so that the retry takes them over from those (a partition claimed meanwhile is claimed again with
                // a newer epoch, which changes nothing for its state).
                fleet.inbox.assigned(Array(assigned))
                fleet.leases.returnPositionRecords(positions)
                throw error
            }
        }
    }

    /// `mailpush offsets --set` asked owned partitions to move: each is given up, to be taken over again at once
    /// (`act`), its restore taking up the request (`PartitionRestore.takeUpPosition`). Between batches nothing of
    /// ours is in flight for them, so the new claim waits for nobody.
    mutating func giveUpToMove(
        _ moved: Set<Int32>, _ positions: [Int32: PartitionStateRecord], committed: inout [TopicPartition: Int64],
        recovery: inout Recovery, replays: inout ServiceReplays
    ) throws {
        logger.notice(
            "moving event partitions as `mailpush offsets --set` asked: claiming them again from the offsets set",
            metadata: [
                "partitions": "\(moved.sorted().map { "\($0)=\(positions[$0]!.offset)" })",
                "requestedBy": "\(Set(moved.compactMap { positions[$0]?.host }).sorted())",
            ])
        try giveUp(moved, committed: &committed, recovery: &recovery, replays: &replays)
    }

    /// At a graceful stop: release every owned partition, then leave the group at once.
    mutating func leaveGroup(
        committed: inout [TopicPartition: Int64], recovery: inout Recovery, replays: inout ServiceReplays
    ) async throws {
        guard let fleet else { return }
        await settleStatePublish()
        let owned = Set(partitions.map(\.partition))
        if !owned.isEmpty { try await release(owned, committed: &committed, recovery: &recovery, replays: &replays) }
        fleet.inbox.close()
        await member?.close()
        logger.info("left the consumer group", metadata: ["group": "\(fleet.settings.id)"])
    }
}
