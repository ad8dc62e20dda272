import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// The mutable state of one run, owned by the single task that runs the loop.
struct PipelineRun {
    let pipeline: Pipeline
    let cluster: KafkaCluster
    let processor: BatchProcessor
    let events: KafkaConsumer
    var config: ConfigFollower
    var delivery: OutputDelivery
    var recovery = Recovery()
    var housekeeping = Housekeeping()
    var replays = ServiceReplays()
    /// The event partitions processed now, and what takes them over and hands them over in a fleet.
    var owned: OwnedPartitions
    /// Next offset to commit per event partition (what the state store holds).
    var committed: [TopicPartition: Int64]

    var logger: Logger { pipeline.logger }
    var store: StateStore { pipeline.store }
    var metrics: PipelineMetrics { pipeline.metrics }
    var health: HealthState { pipeline.health }
    var timeout: Duration { pipeline.configuration.kafkaRequestTimeout }

    func close() {
        owned.fleet?.inbox.close()
        events.close()
        config.close()
        replays.active?.consumer.close()
    }

    /// Retries `body` with capped exponential backoff while Kafka or the network fails, reporting unready meanwhile.
    /// Returns false if `shouldStop` turned true before it succeeded (the work is left to recovery).
    @discardableResult
    mutating func retrying(
        _ what: String, until shouldStop: @Sendable () -> Bool = { false },
        _ body: (inout PipelineRun) async throws -> Void
    ) async throws -> Bool {
        var attempt = 0
        while true {
            do {
                try await body(&self)
                return true
            } catch let error as PipelineError {
                throw error
            } catch let error as OwnershipLost {
                throw error
            } catch let error as StateError {
                throw PipelineError.state(error)
            } catch let error as KafkaError where error.isAccessDenied {
                throw PipelineError.accessDenied(what: what, error)
            } catch let error as KafkaError where error.isFatal {
                throw PipelineError.kafka(what: what, error)
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                if shouldStop() { return false }
                try await pipeline.backoff(&attempt, what, error)
                if shouldStop() { return false }
            }
        }
    }
}

/// The batch loop's calls into `OwnedPartitions`: what changes ownership also changes the loop's own state for the
/// partitions (offsets, outputs read back, replays), and the events consumer follows.
extension PipelineRun {
    /// Acts on the group's news between batches (`OwnedPartitions.act`). A batch planned ahead is dropped (its
    /// records are read again, and what it wrote ahead is read back first).
    mutating func applyGroupChanges(prepared: inout BatchPlan?) async throws {
        await owned.settleStatePublish()
        guard let news = owned.takeGroupNews() else { return }
        if let dropped = prepared {
            prepared = nil
            if !dropped.aheadWrites.isEmpty { try await readBackWrittenAhead() }
        }
        try await owned.act(on: news, committed: &committed, recovery: &recovery, replays: &replays, delivery: delivery)
        try await reassignEvents()
        metrics.ownedPartitions.record(owned.partitions.count)
        metrics.rebalances.increment()
    }

    /// After a batch stopped because a partition was lost: gives the lost ones up (`OwnedPartitions.abandon`) and
    /// reads back what the batch wrote for the others, so that they are not written twice when their events are
    /// read again.
    mutating func abandonBatch(_ lost: OwnershipLost) async throws {
        await owned.settleStatePublish()
        try owned.abandon(lost, committed: &committed, recovery: &recovery, replays: &replays)
        try await readBack("reading back after a lost partition")
        try await reassignEvents()
        metrics.ownedPartitions.record(owned.partitions.count)
    }

    /// Before the records of a batch that wrote outputs ahead are planned again: what it wrote is read back, so
    /// that recovery does not write it twice.
    mutating func readBackWrittenAhead() async throws {
        logger.info("reading back the outputs a dropped batch wrote ahead")
        try await readBack("reading back outputs written ahead")
    }

    /// Reads back what the output topics hold for the owned event partitions' uncommitted events, once nothing of
    /// this producer can land any more (the batch loop's own writes and any written ahead), into `recovery`.
    private mutating func readBack(_ what: String) async throws {
        await delivery.settleForReadBack()
        try await retrying(what) { run in
            let scan = try await run.delivery.scan(
                committed: run.committed.filter { $0.key.topic == run.pipeline.configuration.topics.events })
            run.recovery.merge(scan)
        }
    }

    /// At start-up, in a fleet: takes over again what this instance held when it stopped, unless claimed since.
    mutating func resumeHeldPartitions(existing: [TopicPartition]) async throws {
        try await owned.resumeHeldPartitions(
            existing: existing, committed: &committed, recovery: &recovery, replays: &replays, delivery: delivery)
        if !owned.partitions.isEmpty { try await reassignEvents() }
    }

    /// At a graceful stop, in a fleet: releases every owned partition and leaves the group.
    mutating func leaveGroup() async throws {
        try await owned.leaveGroup(committed: &committed, recovery: &recovery, replays: &replays)
    }

    /// Records the fleet replays the lease renewal found for owned partitions as local replay requests.
    mutating func recordFoundFleetReplays() throws {
        let found = owned.foundFleetReplays()
        if !found.replays.isEmpty {
            try replays.recordFleetReplays(
                found.replays, replacing: false, eventsTopic: pipeline.configuration.topics.events, store: store, logger: logger)
        }
        owned.forgetFoundFleetReplays(found.count)
    }

    /// Points the events consumer at the owned partitions, each at its committed offset.
    func reassignEvents() async throws {
        try await events.reassign(owned.startOffsets(committed: committed))
    }
}
