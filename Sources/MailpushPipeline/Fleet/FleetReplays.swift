import Foundation
import Logging
import MailpushPartition
import MailpushState

/// Replays across a fleet: `mailpush replay` writes one replay record per event partition to the state topic;
/// the partition's owner records it as a local replay request, executes it between its batches like any replay,
/// and writes its progress back after each replay batch. A partition that moves takes its replays with it: the
/// new owner continues each from the progress last written (docs/exactly-once.md, "A fleet").
extension ServiceReplays {
    /// Records the unfinished fleet replays of `partitions` (from a restore, or seen by the lease renewal) as
    /// local replay requests. With `replacing`, a local request already made for one is superseded (a partition
    /// that comes back continues from the progress in the state topic, which may be another owner's).
    mutating func recordFleetReplays(
        _ replays: [Int32: [PartitionRestore.FleetReplay]], replacing: Bool, eventsTopic events: String, store: StateStore,
        logger: Logger
    ) throws {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        for (partition, list) in replays {
            for replay in list.sorted(by: { $0.id < $1.id }) where !replay.isDone {
                if let existing = try store.fleetReplayLocalId(replayId: replay.id, partition: partition) {
                    guard replacing else { continue }
                    if active?.tracker.request.id == existing {
                        active?.consumer.close()
                        active = nil
                    }
                    try store.finishReplay(id: existing, status: .done, detail: "superseded by the progress in the state topic")
                }
                var done = ReplayRequest.Counts()
                done.eventsRead = replay.counts.events
                done.jobs = replay.counts.jobs
                done.deadLetters = replay.counts.deadLetters
                done.duplicates = replay.counts.duplicates
                let local = try store.submitFleetReplay(
                    replayId: replay.id, eventsTopic: events, partition: partition, next: replay.next, end: replay.end, force: replay.force,
                    nowMs: now, done: done)
                lastCheck = .now - .seconds(60)
                logger.info(
                    "fleet replay recorded for an owned partition",
                    metadata: [
                        "replay": "\(replay.id)", "partition": "\(partition)", "range": "[\(replay.next), \(replay.end))",
                        "force": "\(replay.force)", "request": "\(local)",
                    ])
            }
        }
    }

    /// A replay of `partitions` stops here (they are given up); their owner continues it from the progress written.
    mutating func stop(touching partitions: Set<Int32>) {
        if let active, !Set(active.tracker.starts.keys).isDisjoint(with: partitions) {
            active.consumer.close()
            self.active = nil
            lastCheck = .now - .seconds(60)
        }
    }
}

extension OwnedPartitions {
    /// The replay records the lease renewal found, those of owned partitions folded, and how many were found
    /// (`forgetFoundFleetReplays` once they are recorded).
    func foundFleetReplays() -> (replays: [Int32: [PartitionRestore.FleetReplay]], count: Int) {
        guard let fleet else { return ([:], 0) }
        let found = fleet.leases.replayRecords()
        var replays: [Int32: [PartitionRestore.FleetReplay]] = [:]
        for record in found where owns(record.partition) {
            var fold = PartitionRestore()
            fold.apply(record)
            replays[record.partition, default: []] += fold.replays.values
        }
        return (replays, found.count)
    }

    func forgetFoundFleetReplays(_ count: Int) { fleet?.leases.forgetReplayRecords(count) }

    /// The lease renewal found replay records to take (a fleet only).
    var hasFoundFleetReplays: Bool { fleet?.leases.hasReplayRecords ?? false }

    /// Writes how far a local request that executes a fleet replay has come (with its dedupe entries).
    func publishReplayProgress(_ request: ReplayRequest, emails: [String], processedAtMs: Int64?) async {
        guard let fleet, let mapping = try? store.fleetReplay(localId: request.id),
            let cursor = request.cursors.first(where: { $0.partition == mapping.partition }),
            let epoch = fleet.leases.epoch(of: mapping.partition)
        else { return }
        let counts = PartitionStateRecord.ReplayCounts(
            events: request.counts.eventsRead, jobs: request.counts.jobs, deadLetters: request.counts.deadLetters,
            duplicates: request.counts.duplicates)
        let nowMs = Int64(Date().timeIntervalSince1970 * 1000)
        let record = PartitionStateRecord(
            kind: .replayProgress, topic: request.eventsTopic, partition: mapping.partition, epoch: epoch, owner: fleet.instanceId,
            offset: cursor.next, marks: [:], processedAtMs: emails.isEmpty ? nowMs : processedAtMs ?? nowMs,
            emails: emails.isEmpty ? nil : emails, replayId: mapping.replayId, counts: counts)
        do {
            try await fleet.writer.publish([record])
            // Each progress record supersedes this owner's previous one (its dedupe entries still expire with their
            // time); a finished replay's request goes with its last progress, a dedupe window after it ended, which
            // leaves `mailpush replay` that long to read it.
            let eventPartition = TopicPartition(topic: request.eventsTopic, partition: mapping.partition)
            var deletable: [DeletableStateRecord] = []
            let entriesAt = emails.isEmpty ? 0 : record.processedAtMs!
            if let previous = fleet.writer.replaceLastProgress(
                partition: mapping.partition, replayId: mapping.replayId, with: (record.key, entriesAt)), previous.key != record.key
            {
                deletable.append(
                    DeletableStateRecord(partition: eventPartition, key: previous.key, deleteAfterMs: previous.entriesAtMs, coveredAt: nil))
            }
            if cursor.next >= cursor.end {
                let requestKey = PartitionStateRecord(
                    kind: .replay, topic: request.eventsTopic, partition: mapping.partition, epoch: -1, owner: "", offset: 0, marks: [:],
                    replayId: mapping.replayId
                ).key
                deletable += [
                    DeletableStateRecord(partition: eventPartition, key: requestKey, deleteAfterMs: record.processedAtMs!, coveredAt: nil),
                    DeletableStateRecord(partition: eventPartition, key: record.key, deleteAfterMs: record.processedAtMs!, coveredAt: nil),
                ]
            }
            try store.recordDeletableStateRecords(deletable)
        } catch {
            logger.warning(
                "writing replay progress failed; a new owner would replay part of it again (the dedupe window skips it)",
                metadata: ["error": "\(error)", "replay": "\(mapping.replayId)"])
        }
    }
}
