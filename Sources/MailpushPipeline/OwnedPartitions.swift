import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// The event partitions this run processes, and everything that changes which ones: the one place the batch loop
/// asks and the one type that takes partitions over and hands them over.
///
/// With static ownership (`--instance`/`--instances`) the partitions are fixed at start-up: nothing here
/// changes, nothing goes to the state topic, and every lease check passes. In a fleet (the default) the
/// group assigns and revokes them; between batches the loop hands this type the group's news and it acts on them:
/// an assignment is taken over (Fleet/Takeover.swift), a revocation released, a loss given up
/// (Fleet/HandingOver.swift). A batch's outputs are written under the leases of its partitions and its state
/// records follow its commit (Fleet/FleetBatches.swift).
///
/// What the batch loop itself keeps per partition (its committed offsets, the outputs a read-back found, the
/// replays it executes) changes with ownership: the functions that change ownership take those as `inout`.
struct OwnedPartitions {
    enum Mode {
        case fixed(Ownership)
        case group(Fleet)
    }

    let mode: Mode
    let pipeline: Pipeline
    let cluster: KafkaCluster
    /// The event partitions processed now, sorted: fixed with static ownership, moving with a fleet's rebalances.
    private(set) var partitions: [TopicPartition]
    /// The group membership, once joined (a fleet only).
    private(set) var member: KafkaGroupMember?

    /// Static ownership: `partitions` are the existing event partitions `ownership` names.
    init(fixed ownership: Ownership, partitions: [TopicPartition], pipeline: Pipeline, cluster: KafkaCluster) {
        mode = .fixed(ownership)
        self.partitions = partitions
        self.pipeline = pipeline
        self.cluster = cluster
    }

    /// A fleet member owns nothing until the group assigns it partitions (and their state is restored).
    init(group fleet: Fleet, pipeline: Pipeline, cluster: KafkaCluster) {
        mode = .group(fleet)
        partitions = []
        self.pipeline = pipeline
        self.cluster = cluster
    }

    /// The group membership, state writer and leases; nil with static ownership.
    var fleet: Fleet? {
        if case .group(let fleet) = mode { fleet } else { nil }
    }

    /// Whether this run processes event partition `partition` now (with static ownership: whether it is this
    /// instance's, existing yet or not).
    func owns(_ partition: Int32) -> Bool {
        switch mode {
        case .fixed(let ownership): ownership.owns(partition: partition)
        case .group: partitions.contains { $0.partition == partition }
        }
    }

    /// This run's share of the events topic, for log lines.
    var summary: String {
        switch mode {
        case .fixed: "\(pipeline.configuration.ownership)"
        case .group: "partitions \(partitions.map(\.partition))"
        }
    }

    /// The group has news for the loop, a newer owner fenced a partition processed now, or `mailpush offsets --set`
    /// asked to move one.
    var hasNews: Bool {
        guard let fleet else { return false }
        return fleet.inbox.hasChanges || fleet.leases.isAnyFenced(partitions.lazy.map(\.partition))
            || fleet.leases.hasPositionRecords
    }

    /// Until when outputs of `partitions` may be enqueued: their leases (`PartitionLeases.leaseGate`); nil, always,
    /// with static ownership.
    func writeGate(_ partitions: Set<Int32>) -> EnqueueGate? {
        fleet?.leases.leaseGate(partitions)
    }

    /// Whether outputs of events of some partitions may be written at this moment (`WriteAhead`): always for
    /// fixed ownership; in a fleet, while their leases hold.
    var mayWriteNow: @Sendable (Set<Int32>) -> Bool {
        guard let leases = fleet?.leases else { return { _ in true } }
        return { partitions in leases.leaseValid(partitions) }
    }

    /// Before a round is written: every partition of the batch still has its lease (waiting briefly for a renewal
    /// that is due), or the batch stops with `OwnershipLost`.
    func checkLeases(_ partitions: Set<Int32>) async throws {
        guard let fleet else { return }
        if let lost = try await fleet.leases.awaitLease(partitions) { throw OwnershipLost(partitions: lost) }
    }

    /// Where the events consumer reads: each partition processed now at its committed offset.
    func startOffsets(committed: [TopicPartition: Int64]) -> [TopicPartition: StartOffset] {
        Dictionary(uniqueKeysWithValues: partitions.map { ($0, StartOffset.offset(committed[$0] ?? 0)) })
    }

    var logger: Logger { pipeline.logger }
    var store: StateStore { pipeline.store }
    var metrics: PipelineMetrics { pipeline.metrics }
    var eventsTopic: String { pipeline.configuration.topics.events }
    var timeout: Duration { pipeline.configuration.kafkaRequestTimeout }

    /// Starts processing `added` (a takeover's last step).
    mutating func add(_ added: some Sequence<Int32>) {
        partitions.append(contentsOf: added.map { TopicPartition(topic: eventsTopic, partition: $0) })
        partitions.sort()
    }

    /// Stops processing `removed`.
    mutating func remove(_ removed: Set<Int32>) {
        partitions.removeAll { removed.contains($0.partition) }
    }

    mutating func joined(_ member: KafkaGroupMember) {
        self.member = member
    }
}
