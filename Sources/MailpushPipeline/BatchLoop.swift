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
                continue
            }
            let started = ContinuousClock.now
            let finished = try await retrying("processing a batch of \(records.count) events", until: shouldStop) { run in
                try await run.process(records)
            }
            guard finished else { break }
            metrics.batchDuration.record(duration: ContinuousClock.now - started)
            metrics.batchSize.record(records.count)
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
        let windowStart = now - pipeline.configuration.dedupeWindowSeconds * 1000
        let store = self.store
        let batch = try await processor.process(records, directory: config.directory, nowMs: now) { keys throws(StateError) in
            try store.processedEmails(among: keys, sinceMs: windowStart)
        }

        let processed = clock.now
        let pending = recovery.notYetWritten(batch.outputs)
        if pending.count < batch.outputs.count {
            metrics.recoveredOutputs.increment(by: batch.outputs.count - pending.count)
            logger.notice("skipped outputs already written before a restart", metadata: ["count": "\(batch.outputs.count - pending.count)"])
        }
        let delivered = try await deliverOrDeadLetter(pending, records: records)
        let marks = delivered.marks
        let deliveredAt = clock.now

        var offsets: [TopicPartition: Int64] = [:]
        for record in records {
            offsets[record.topicPartition] = max(offsets[record.topicPartition] ?? 0, record.offset + 1)
        }
        do {
            try store.commitEventBatch(offsets: offsets, processedEmails: batch.processedEmails, processedAtMs: now, outputMarks: marks)
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
        for output in delivered.written(batch.outputs) {
            switch output.kind {
            case .job(_, let platform):
                metrics.jobsProduced(platform: platform).increment()
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
            "deliverMs": "\((deliveredAt - processed).milliseconds)", "commitMs": "\((clock.now - deliveredAt).milliseconds)",
        ])
    }
}
