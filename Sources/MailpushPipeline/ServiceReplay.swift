import Foundation
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

/// The replay the service is executing, if any: requests recorded by `mailpush replay` in the state are
/// executed here, one replay batch between two event batches, so that one process writes
/// (docs/exactly-once.md, "Replays").
struct ServiceReplays {
    var active: ActiveReplay?
    /// In a fleet: finished replay parts whose last progress record is still to be written.
    var finishedToPublish: [ReplayRequest] = []
    var lastCheck = ContinuousClock.now - .seconds(60)
}

struct ActiveReplay {
    var tracker: ReplayProgressTracker
    let consumer: KafkaConsumer
    var idlePolls = 0
}

extension PipelineRun {
    /// One step of the oldest pending replay: a batch of its events, delivered and committed with its cursor.
    /// Replays wait while the outputs of an unfinished event batch are pending recovery.
    mutating func replayStep() async throws {
        if !replays.finishedToPublish.isEmpty {
            for request in replays.finishedToPublish { await owned.publishReplayProgress(request, emails: [], processedAtMs: nil) }
            replays.finishedToPublish = []
        }
        guard recovery.eventsSettled else { return }
        if replays.active == nil {
            guard ContinuousClock.now - replays.lastCheck > .seconds(1) else { return }
            replays.lastCheck = .now
            guard let request = try store.pendingReplays().first else {
                if !recovery.isSettled { recovery.forgetReplays() }
                return
            }
            try await startReplay(request)
            return
        }
        var replay = replays.active!
        let polled = try await replay.consumer.poll(
            maxRecords: pipeline.configuration.pollRecords, maxBytes: pipeline.configuration.maxBatchBytes, timeout: .milliseconds(20))
        let records = replay.tracker.inRange(polled)
        if records.isEmpty {
            replay.idlePolls += 1
            if replay.idlePolls % 50 == 0 {
                // Nothing more arrives: the rest of a range may be gone (retention) or hold no records.
                let partitions = replay.tracker.starts.keys.map { TopicPartition(topic: replay.tracker.request.eventsTopic, partition: $0) }
                let ends = try await cluster.endOffsets(partitions, timeout: timeout)
                let positions = replay.consumer.positions(partitions)
                let exhausted = partitions.filter { partition in
                    (positions[partition] ?? -1) >= (ends[partition] ?? 0)
                        || (ends[partition] ?? 0) <= (replay.tracker.starts[partition.partition] ?? 0)
                }.map(\.partition)
                if !exhausted.isEmpty {
                    logger.warning(
                        "replay found no more records before the end of its range (deleted by retention?)",
                        metadata: [
                            "request": "\(replay.tracker.request.id)", "partitions": "\(exhausted.sorted())",
                        ])
                    replay.tracker.abandon(partitions: exhausted)
                }
            }
            replays.active = replay
            if replay.tracker.isFinished { try finishReplay() }
            return
        }
        replay.idlePolls = 0

        try await config.catchUp()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let store = self.store
        let force = replay.tracker.request.force
        let windowMs = pipeline.configuration.dedupeWindowSeconds * 1000
        let directory = config.directory
        let batch = try await processor.process(
            records, nowMs: now,
            config: { owners, addresses throws(StateError) in try directory.view(owners: owners, addresses: addresses) }
        ) { keys throws(StateError) in
            force ? [] : try store.processedEmails(among: keys, nowMs: now, windowMs: windowMs)
        }
        let outputs = batch.outputs.taggedAsReplay(store.replayTag(localId: replay.tracker.request.id))
        let pending = recovery.notYetWritten(outputs)
        if pending.count < batch.outputs.count {
            metrics.recoveredOutputs.increment(by: batch.outputs.count - pending.count)
            logger.notice(
                "skipped replay outputs already written before a restart", metadata: ["count": "\(batch.outputs.count - pending.count)"])
        }
        // In a fleet a replay batch, like an event batch, is written under its partitions' leases.
        let replayPartitions = Set(records.map(\.partition))
        try await owned.checkLeases(replayPartitions)
        delivery.writeGate = owned.writeGate(replayPartitions)
        defer { delivery.writeGate = nil }
        let marks = try await delivery.deliver(pending, committed: committed)
        let cursors = replay.tracker.cursors(after: records)
        let counts = ReplayRequest.Counts(batch, events: records.count)
        try store.commitReplayBatch(
            id: replay.tracker.request.id, cursors: cursors, counts: counts, processedEmails: batch.processedEmails,
            processedAtMs: now, outputMarks: recovery.isSettled ? marks : [:])
        replay.tracker.advance(to: cursors, counts: counts)
        replays.active = replay
        await owned.publishReplayProgress(replay.tracker.request, emails: batch.processedEmails, processedAtMs: now)
        logger.debug(
            "replay batch committed",
            metadata: [
                "request": "\(replay.tracker.request.id)", "events": "\(records.count)", "outputs": "\(pending.count)",
                "duplicates": "\(batch.duplicates)",
            ])
        if replay.tracker.isFinished { try finishReplay() }
    }

    private mutating func startReplay(_ request: ReplayRequest) async throws {
        var tracker = ReplayProgressTracker(request)
        // Another instance owns the other partitions, with its own dedupe window: replaying them here could
        // send what that instance already sent. (In a fleet their owner executes them: it learns the replay from
        // the state topic, with the progress made here.)
        let foreign = tracker.starts.keys.filter { !owned.owns($0) }.sorted()
        if !foreign.isEmpty, owned.fleet != nil {
            logger.info(
                "replay partitions this instance no longer owns are left to their owner",
                metadata: ["request": "\(request.id)", "partitions": "\(foreign)"])
            tracker.abandon(partitions: foreign)
        } else if !foreign.isEmpty {
            logger.warning(
                "replay partitions owned by other instances are skipped; run the replay against their state directories",
                metadata: [
                    "request": "\(request.id)", "partitions": "\(foreign)", "ownership": "\(owned.summary)",
                ])
            tracker.abandon(partitions: foreign)
        }
        let partitions = tracker.starts.filter { owned.owns($0.key) }
            .map { (TopicPartition(topic: request.eventsTopic, partition: $0.key), $0.value) }
        // What retention removed cannot be read: start at the log start rather than fail the consumer.
        let logStarts = try await cluster.beginningOffsets(partitions.map(\.0), timeout: timeout)
        let consumer = try KafkaConsumer(configuration: pipeline.configuration.kafka)
        do {
            try consumer.assign(
                Dictionary(
                    uniqueKeysWithValues: partitions.map { partition, next in
                        (partition, StartOffset.offset(max(next, logStarts[partition] ?? 0)))
                    }))
        } catch {
            consumer.close()
            throw error
        }
        replays.active = ActiveReplay(tracker: tracker, consumer: consumer)
        logger.info(
            "executing a replay recorded in the state",
            metadata: [
                "request": "\(request.id)", "events": "\(request.eventsTotal - request.counts.eventsRead)", "force": "\(request.force)",
                "ranges": "\(request.remaining.map { "\($0.partition):[\($0.next), \($0.end))" })",
            ])
        if tracker.isFinished { try finishReplay() }
    }

    private mutating func finishReplay() throws {
        guard let replay = replays.active else { return }
        replay.consumer.close()
        replays.active = nil
        replays.lastCheck = .now - .seconds(60) // the next request, if any, starts at once
        try store.finishReplay(id: replay.tracker.request.id, status: .done)
        if owned.fleet != nil, let request = try store.replay(id: replay.tracker.request.id) {
            // A finished part is published as replayed to its end (a range whose rest retention removed, too).
            var finished = request
            for index in finished.cursors.indices where owned.owns(finished.cursors[index].partition) {
                finished.cursors[index].next = max(finished.cursors[index].next, finished.cursors[index].end)
            }
            replays.finishedToPublish.append(finished)
        }
        let counts = replay.tracker.request.counts
        logger.info(
            "replay done",
            metadata: [
                "request": "\(replay.tracker.request.id)", "events": "\(counts.eventsRead)", "jobs": "\(counts.jobs)",
                "deadLetters": "\(counts.deadLetters)", "skipped": "\(counts.duplicates)",
            ])
        if try store.pendingReplays().isEmpty { recovery.forgetReplays() }
    }
}
