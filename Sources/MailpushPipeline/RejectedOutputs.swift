import MailpushCore
import MailpushKafka
import MailpushPartition

/// An output the broker (or the producer) refused for good: producing it again could only fail again.
struct RejectedOutput: Sendable {
    var output: Output
    var error: KafkaError
}

extension PipelineError {
    /// A record whose every possible output is refused for good, its dead letter included.
    static func undeliverable(_ rejected: RejectedOutput) -> PipelineError {
        .undeliverable(
            "the dead letter for \(rejected.output.source.headerValue) cannot be written to "
                + "\(rejected.output.record.topic): \(rejected.error.recordRejection) (\(rejected.error.name)); "
                + "the record is left uncommitted")
    }
}

extension OutputDelivery {
    /// `deliver` for callers without a dead-letter fallback: a refused output stops the caller, naming the record.
    mutating func deliver(_ outputs: [Output], committed: [TopicPartition: Int64]) async throws -> [TopicPartition: Int64] {
        var rejected: [RejectedOutput] = []
        let marks = try await deliver(outputs, committed: committed, rejected: &rejected)
        if let first = rejected.first { throw PipelineError.undeliverable(first) }
        return marks
    }
}

/// What a batch's delivery ended with, besides the marks: the jobs refused for good and the dead letters
/// written in their place.
struct DeliveryOutcome {
    var marks: [TopicPartition: Int64] = [:]
    var rejectedJobs: Set<OutputIdentity> = []
    var replacements: [Output] = []

    /// `outputs` as they ended up in Kafka: refused jobs left out, their events' dead letters added.
    func written(_ outputs: [Output]) -> [Output] {
        rejectedJobs.isEmpty ? outputs : outputs.filter { !rejectedJobs.contains($0.identity) } + replacements
    }
}

extension PipelineRun {
    static let deliveryChunk = 5000

    /// Delivers `outputs`; an event whose job is refused for good (too large, invalid, topic not authorized)
    /// becomes a dead letter naming the device and the reason, so no record is retried forever. If even that
    /// dead letter is refused, the run stops (exit 70) with the record's source, leaving it uncommitted:
    /// never a silent skip.
    ///
    /// `deadLettered` holds the events of this batch that already have their dead letter (a batch delivered
    /// in rounds can see one email's jobs refused in several rounds): they get no second one.
    ///
    /// `writtenAhead` are the first of `outputs`, already enqueued (`WriteAhead`): only their reports are awaited.
    /// `enqueued` is called once every output is enqueued.
    mutating func deliverOrDeadLetter(
        _ outputs: [Output], records: [KafkaRecord], deadLettered: inout Set<SourceRef>, writtenAhead: [AheadWrite] = [],
        enqueued: (() -> Void)? = nil
    ) async throws -> DeliveryOutcome {
        var outcome = DeliveryOutcome()
        var rejected: [RejectedOutput] = []
        var rest = outputs[...]
        var enqueued = enqueued
        if !writtenAhead.isEmpty {
            if AheadWrite.areAPrefix(writtenAhead, of: outputs) {
                rest = rest.dropFirst(writtenAhead.reduce(0) { $0 + $1.outputs.count })
                // What was written ahead is enqueued already: if that is all, the next batch may write ahead now,
                // while these reports are awaited.
                if rest.isEmpty {
                    enqueued?()
                    enqueued = nil
                }
                for write in writtenAhead {
                    let marks = try await delivery.deliver(
                        write.outputs, committed: committed, rejected: &rejected, writtenAhead: write.pending)
                    outcome.marks.merge(marks) { max($0, $1) }
                }
            } else {
                // Not what the delivery assembled (never expected): whatever of those writes landed is found by
                // a read-back before anything is produced.
                logger.error("outputs written ahead differ from the batch's; reading back before delivering it")
                for write in writtenAhead { _ = try? await write.pending.results(timeout: pipeline.configuration.deliveryTimeout) }
                let marks = try await delivery.deliver(outputs, committed: committed, rejected: &rejected, readBackFirst: true)
                outcome.marks.merge(marks) { max($0, $1) }
                rest = []
            }
        }
        if rest.isEmpty { enqueued?() }
        // A big batch (one owner with many devices) goes out in chunks: librdkafka's queue and the delivery
        // bookkeeping hold one chunk, and each acknowledged chunk is progress for the liveness probe. Marks
        // still commit only with the whole batch.
        for start in stride(from: rest.startIndex, to: rest.endIndex, by: Self.deliveryChunk) {
            let end = min(start + Self.deliveryChunk, rest.endIndex)
            let marks = try await delivery.deliver(
                Array(rest[start..<end]), committed: committed, rejected: &rejected, enqueued: end == rest.endIndex ? enqueued : nil)
            outcome.marks.merge(marks) { max($0, $1) }
            health.beat()
        }
        guard !rejected.isEmpty else { return outcome }
        if let deadLetter = rejected.first(where: { if case .deadLetter = $0.output.kind { true } else { false } }) {
            throw PipelineError.undeliverable(deadLetter)
        }

        let recordsBySource = Dictionary(
            records.map { (SourceRef(topic: $0.topic, partition: $0.partition, offset: $0.offset), $0) },
            uniquingKeysWith: { first, _ in first })
        var bySource: [SourceRef: [RejectedOutput]] = [:]
        var order: [SourceRef] = []
        for item in rejected {
            outcome.rejectedJobs.insert(item.output.identity)
            if bySource[item.output.source] == nil { order.append(item.output.source) }
            bySource[item.output.source, default: []].append(item)
        }
        for source in order where deadLettered.insert(source).inserted {
            let items = bySource[source]!
            guard let record = recordsBySource[source] else {
                throw PipelineError.inconsistentBroker("a refused output names \(source.headerValue), which is not in the batch")
            }
            let first = items[0]
            let device = first.output.record.key.map { String(decoding: $0, as: UTF8.self) } ?? "?"
            var detail = "push job for device \(device) rejected by the broker: \(first.error.recordRejection)"
            if items.count > 1 { detail += " (and \(items.count - 1) more jobs of this email)" }
            logger.warning(
                "output refused for good; the event becomes a dead letter",
                metadata: [
                    "source": "\(source.headerValue)", "error": "\(first.error)", "refusedJobs": "\(items.count)",
                ])
            outcome.replacements.append(processor.deadLetter(record, source, .rejected, detail: detail))
        }
        // A dead letter an earlier run already wrote for the same event is not written again.
        var refusedAgain: [RejectedOutput] = []
        let marks = try await delivery.deliver(
            recovery.notYetWritten(outcome.replacements), committed: committed,
            rejected: &refusedAgain)
        if let first = refusedAgain.first { throw PipelineError.undeliverable(first) }
        outcome.marks.merge(marks) { max($0, $1) }
        return outcome
    }
}
