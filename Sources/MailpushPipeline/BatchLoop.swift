import Foundation
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
        let windowStart = try store.dedupeWindowStartMs(nowMs: now, windowMs: pipeline.configuration.dedupeWindowSeconds * 1000)
        let directory = config.directory
        let batch = try await processor.process(
            records, nowMs: now, config: { owners, addresses throws(StateError) in try directory.view(owners: owners, addresses: addresses) }
        ) { keys throws(StateError) in
            try store.processedEmails(among: keys, sinceMs: windowStart)
        }

        let processed = clock.now
        let pending = recovery.notYetWritten(batch.outputs)
        if pending.count < batch.outputs.count {
            metrics.recoveredOutputs.increment(by: batch.outputs.count - pending.count)
            logger.notice("skipped outputs already written before a restart", metadata: ["count": "\(batch.outputs.count - pending.count)"])
        }
        let marks = try await delivery.deliver(pending, committed: committed)
        let delivered = clock.now

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
            logger.warning("sponsor webhook devices got no job: no --sponsor-webhook-url configured", metadata: ["devices": "\(batch.webhookWithoutEndpoint)"])
        }
        var jobsByPlatform: [String: Int] = [:]  // one counter update per platform and batch, not per job
        defer { for (platform, count) in jobsByPlatform { metrics.jobsProduced(platform: platform).increment(by: count) } }
        for output in batch.outputs {
            switch output.kind {
            case .job(_, let platform):
                jobsByPlatform[platform, default: 0] += 1
            case .deadLetter(let reason, let detail):
                metrics.deadLetter(reason).increment()
                logger.notice("event dead-lettered", metadata: [
                    "source": "\(output.source.headerValue)", "reason": "\(reason.rawValue)", "detail": "\(detail)",
                ])
            }
        }
        logger.debug("batch committed", metadata: [
            "events": "\(records.count)", "outputs": "\(batch.outputs.count)", "duplicates": "\(batch.duplicates)",
            "configMs": "\((configDone - started).milliseconds)",
            "prepareMs": "\(batch.prepareTime.milliseconds)", "renderAndSealMs": "\(batch.renderTime.milliseconds)",
            "deliverMs": "\((delivered - processed).milliseconds)", "commitMs": "\((clock.now - delivered).milliseconds)",
        ])
    }
}
