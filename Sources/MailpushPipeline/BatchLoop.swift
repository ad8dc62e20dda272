import Foundation
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

extension PipelineRun {
    /// Polls events and processes them batch by batch; idle polls do housekeeping.
    mutating func loop(until shouldStop: @Sendable () -> Bool) async throws {
        while !shouldStop() {
            health.beat()
            let records = try await events.poll(maxRecords: pipeline.configuration.maxBatchSize, timeout: .milliseconds(100))
            if records.isEmpty {
                try await retrying("idle housekeeping", until: shouldStop) { run in try await run.idle() }
                try await retrying("replaying", until: shouldStop) { run in try await run.replayStep() }
                continue
            }
            let started = ContinuousClock.now
            let finished = try await retrying("processing a batch of \(records.count) events", until: shouldStop) { run in
                try await run.process(records)
            }
            guard finished else { break }
            metrics.batchDuration.record(duration: ContinuousClock.now - started)
            metrics.batchSize.record(records.count)
            // Replays recorded in the state go between event batches: this process is their one writer.
            guard try await retrying("replaying", until: shouldStop, { run in try await run.replayStep() }) else { break }
            if !health.isReady { health.setReady(true, "processing") }
        }
        logger.info("stopping: no batch in flight, everything delivered is committed")
    }

    /// One batch: config catch-up, processing, delivery, then one commit of offsets, dedupe entries and marks.
    mutating func process(_ records: [KafkaRecord]) async throws {
        let clock = ContinuousClock()
        let started = clock.now
        // Config acknowledged before these events were published must apply to them (CONTRACT §8).
        try await config.catchUp()
        let configDone = clock.now

        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let store = self.store
        let processor = self.processor
        let windowStart = try store.dedupeWindowStartMs(nowMs: now, windowMs: pipeline.configuration.dedupeWindowSeconds * 1000)
        let directory = config.directory
        var marks: [TopicPartition: Int64] = [:]
        var written = WrittenOutputs()
        var outputCount = 0
        var deliverTime = Duration.zero
        var deadLettered = Set<SourceRef>()
        // Rendered and delivered round by round: one owner with 100,000 devices holds one round in memory,
        // not 100,000 jobs. Marks and offsets still commit once, after the last round (docs/exactly-once.md).
        let batch = try await processor.process(
            records, nowMs: now,
            config: { owners, addresses throws(StateError) in try directory.view(owners: owners, addresses: addresses) },
            alreadyProcessed: { keys throws(StateError) in try store.processedEmails(among: keys, sinceMs: windowStart) },
            roundDevices: max(4096, processor.parallelism * BatchProcessor.devicesPerSlice)
        ) { outputs in
            let deliverStarted = clock.now
            outputCount += outputs.count
            // An email spread over rounds gets one dead letter at most, whichever round found the problem.
            let outputs = outputs.filter { output in
                guard case .deadLetter = output.kind else { return true }
                return deadLettered.insert(output.source).inserted
            }
            let pending = recovery.notYetWritten(outputs)
            if pending.count < outputs.count {
                metrics.recoveredOutputs.increment(by: outputs.count - pending.count)
                logger.notice("skipped outputs already written before a restart", metadata: ["count": "\(outputs.count - pending.count)"])
            }
            let delivered = try await deliverOrDeadLetter(pending, records: records, deadLettered: &deadLettered)
            marks.merge(delivered.marks) { max($0, $1) }
            written.add(delivered.written(outputs))
            health.beat()
            deliverTime += clock.now - deliverStarted
        }
        let deliveredAt = clock.now

        var offsets: [TopicPartition: Int64] = [:]
        for record in records {
            offsets[record.topicPartition] = max(offsets[record.topicPartition] ?? 0, record.offset + 1)
        }
        do {
            // The mark rule: while outputs of an unfinished batch are still pending recovery, marks stay put —
            // this batch may have re-read only part of that batch, and a mark moved past the rest would hide
            // them from the next read-back.
            try store.commitEventBatch(
                offsets: offsets, processedEmails: batch.processedEmails, processedAtMs: now,
                outputMarks: recovery.isSettled ? marks : [:])
        } catch {
            throw PipelineError.state(error.description)
        }
        committed.merge(offsets) { _, new in new }
        if recovery.forget(behind: committed) {
            logger.info("recovery complete: every unfinished batch is committed")
        }

        metrics.eventsReceived.increment(by: records.count)
        metrics.duplicateEvents.increment(by: batch.duplicates)
        metrics.notificationsFiltered.increment(by: batch.filteredNotifications)
        metrics.webhookWithoutEndpoint.increment(by: batch.webhookWithoutEndpoint)
        if batch.webhookWithoutEndpoint > 0 {
            logger.warning(
                "sponsor webhook devices got no job: no --sponsor-webhook-url configured",
                metadata: ["devices": "\(batch.webhookWithoutEndpoint)"])
        }
        for (platform, count) in written.jobsByPlatform {
            metrics.jobsProduced(platform: platform).increment(by: count)
        }
        for output in written.deadLetters {
            guard case .deadLetter(let reason, let detail) = output.kind else { continue }
            metrics.deadLetter(reason).increment()
            logger.notice(
                "event dead-lettered",
                metadata: [
                    "source": "\(output.source.headerValue)", "reason": "\(reason.rawValue)", "detail": "\(detail)",
                ])
        }
        logger.debug(
            "batch committed",
            metadata: [
                "events": "\(records.count)", "outputs": "\(outputCount)", "duplicates": "\(batch.duplicates)",
                "configMs": "\((configDone - started).milliseconds)",
                "prepareMs": "\(batch.prepareTime.milliseconds)", "renderAndSealMs": "\(batch.renderTime.milliseconds)",
                "deliverMs": "\(deliverTime.milliseconds)", "commitMs": "\((clock.now - deliveredAt).milliseconds)",
            ])
    }
}

/// What a batch wrote, for the metrics and dead-letter log lines after its commit: counts of jobs, and the
/// dead letters themselves (one per event at most, small).
private struct WrittenOutputs {
    var jobsByPlatform: [String: Int] = [:]
    var deadLetters: [Output] = []

    mutating func add(_ outputs: [Output]) {
        for output in outputs {
            switch output.kind {
            case .job(_, let platform): jobsByPlatform[platform, default: 0] += 1
            case .deadLetter: deadLetters.append(output)
            }
        }
    }
}
