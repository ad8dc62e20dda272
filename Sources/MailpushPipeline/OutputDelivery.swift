import MailpushKafka
import MailpushPartition
import MailpushState

/// Writes outputs to the output topics and reads those topics back: owns the producer and the scanner.
struct OutputDelivery {
    let pipeline: Pipeline
    /// Every partition of the jobs and dead-letter topics.
    let partitions: [TopicPartition]
    private let scanner: OutputScanner
    private var producer: KafkaProducer
    private let producerKafka: KafkaConfiguration
    /// Until when outputs may be enqueued (a fleet's partition leases, `PartitionLeases.leaseGate`); nil: always.
    var writeGate: EnqueueGate?
    /// The next batch's writes ahead, beside the batch being delivered: closed before a read-back.
    var nextBatch: WriteAhead?
    /// This batch retried a delivery after the next batch wrote ahead (its marks must then stay put).
    var retriedBesideWritesAhead = false

    init(pipeline: Pipeline, cluster: KafkaCluster, partitions: [TopicPartition], producerKafka: KafkaConfiguration) throws {
        let configuration = pipeline.configuration
        self.pipeline = pipeline
        self.partitions = partitions
        self.producerKafka = producerKafka
        var scanner = OutputScanner(kafka: configuration.kafka, cluster: cluster, requestTimeout: configuration.kafkaRequestTimeout)
        scanner.progress = ProgressReporter("recovering: reading back the output topics", logger: pipeline.logger, health: pipeline.health)
        self.scanner = scanner
        producer = try PipelineError.creatingClient { () throws(KafkaError) in
            try KafkaProducer(configuration: producerKafka)
        }
    }

    /// Learns the output topics' leaders before the first batch, so that its outputs leave at once.
    func prepare() async {
        await producer.prepare(topics: Array(Set(partitions.map(\.topic))).sorted())
    }

    /// What the output topics hold, from the stored marks to their current ends, of owned events at or
    /// after `committed` and of events pending replays have not committed yet.
    func scan(
        committed: [TopicPartition: Int64], owned: @escaping (Int32) -> Bool, floors: [Int32: [TopicPartition: Int64]] = [:]
    ) async throws -> OutputScanner.Scan {
        let marks = try pipeline.store.outputMarks()
        let store = pipeline.store
        let replays = ReplayProgressTracker.unsettledSources(of: try store.pendingReplays()) { store.replayTag(localId: $0.id) }
        return try await scanner.scan(
            from: marks, outputPartitions: partitions, eventsTopic: pipeline.configuration.topics.events,
            committed: committed, owned: owned, replays: replays, floors: floors)
    }

    /// The same, for the event partitions `committed` names.
    func scan(committed: [TopicPartition: Int64]) async throws -> OutputScanner.Scan {
        let owned = Set(committed.keys.filter { $0.topic == pipeline.configuration.topics.events }.map(\.partition))
        return try await scan(committed: committed, owned: { owned.contains($0) })
    }

    /// Makes sure nothing of ours can still land in the output topics: records still queued are purged and
    /// every record sent has its delivery report. A read-back is only meaningful after this. The next batch
    /// writes nothing more ahead from here on.
    private mutating func settle() async -> Bool {
        closeWritesAhead()
        return await producer.settle(timeout: pipeline.configuration.deliveryTimeout)
    }

    /// Stops the next batch writing ahead before a retry: a retry lands behind what it wrote, so its commit then leaves
    /// the marks in place.
    private mutating func closeWritesAhead() {
        if nextBatch?.close() == true { retriedBesideWritesAhead = true }
    }

    /// `settle`, tried until every delivery report is in (nothing is in flight then, so nothing can land after a
    /// read-back that follows).
    mutating func settleForReadBack() async {
        var attempt = 0
        while !(await settle()) {
            try? await pipeline.backoff(
                &attempt, "waiting for the delivery reports of \(producer.outstanding) records before reading back", nil)
        }
    }

    /// A `WriteAhead` through this delivery's producer.
    func writeAhead(mayWrite: @escaping @Sendable (Set<Int32>) -> Bool) -> WriteAhead {
        WriteAhead(producer: producer, mayWrite: mayWrite)
    }

    /// Produces `outputs` until every one is acknowledged, or refused for good (`KafkaError.isPermanentForRecord`):
    /// those are added to `rejected`, never produced again. After a failure it reads the output topics back
    /// before producing again, so an output that did reach Kafka is never written twice.
    /// Returns the new output marks (one past the last offset written per output partition).
    ///
    /// `writtenAhead`: `outputs` were enqueued already, their reports are awaited instead of a first produce.
    /// `readBackFirst`: some of `outputs` may have been written already. `enqueued` is called once every
    /// output is enqueued the first time.
    mutating func deliver(
        _ outputs: [Output], committed: [TopicPartition: Int64], rejected: inout [RejectedOutput],
        writtenAhead: PendingDelivery? = nil, readBackFirst: Bool = false, enqueued: (() -> Void)? = nil
    ) async throws -> [TopicPartition: Int64] {
        let logger = pipeline.logger
        var pending = outputs
        var marks: [TopicPartition: Int64] = [:]
        var mustScan = readBackFirst
        var attempt = 0
        var resentUnwritten = false
        var writtenAhead = writtenAhead
        var enqueued = enqueued
        while true {
            if mustScan {
                guard await settle() else {
                    try await pipeline.backoff(
                        &attempt, "waiting for the delivery reports of \(producer.outstanding) records before reading back",
                        nil)
                    continue
                }
                do {
                    let scan = try await scan(committed: committed)
                    let before = pending.count
                    pending.removeAll { scan.found.contains($0.identity) || scan.replayFound.contains($0.identity) }
                    if before > pending.count {
                        logger.notice(
                            "outputs of a failed delivery had reached Kafka; not producing them again",
                            metadata: ["count": "\(before - pending.count)"])
                    }
                    // Nothing of ours is in flight now: everything up to these ends is settled.
                    marks.merge(scan.ends) { max($0, $1) }
                    mustScan = false
                } catch let error as StateError {
                    throw PipelineError.state(error)
                } catch {
                    try await pipeline.backoff(&attempt, "reading back the output topics", error)
                    continue
                }
            }
            if pending.isEmpty {
                enqueued?()
                return marks
            }

            var failed: [Output] = []
            var lastError: (any Error)?
            // Every failed output is certainly not in Kafka (`DeliveryResult.notWritten`): a read-back would find none.
            var failedNotWritten = true
            do {
                let results: [DeliveryResult]
                if let ahead = writtenAhead {
                    writtenAhead = nil
                    results = try await ahead.results(timeout: pipeline.configuration.deliveryTimeout)
                } else {
                    results = try await producer.send(
                        pending.map(\.record), timeout: pipeline.configuration.deliveryTimeout, gate: writeGate,
                        enqueued: enqueued)
                }
                enqueued = nil
                for (output, result) in zip(pending, results) {
                    if let error = result.error, error.isPermanentForRecord {
                        rejected.append(RejectedOutput(output: output, error: error))
                    } else if let error = result.error {
                        failed.append(output)
                        lastError = error
                        failedNotWritten = failedNotWritten && result.notWritten
                    } else {
                        let key = TopicPartition(topic: output.record.topic, partition: result.partition)
                        marks[key] = max(marks[key] ?? 0, result.offset + 1)
                    }
                }
            } catch  where error.code == KafkaError.Code.leaseExpired {
                // A partition of this batch may be owned elsewhere by now: nothing more of it may leave here.
                _ = await settle()
                throw OwnershipLost(partitions: [])
            } catch {
                failed = pending
                lastError = error
                failedNotWritten = false
            }
            if failed.isEmpty { return marks }
            pipeline.metrics.deliveryRetries.increment()
            pending = failed
            if let error = lastError as? KafkaError, error.isFatal {
                // A fatal idempotence error poisons the producer: start a fresh one (its sequence numbers restart).
                logger.error("producer failed fatally; replacing it", metadata: ["error": "\(error)"])
                // The old one must not write anything after the read-back: drain it before letting it go.
                _ = await settle()
                producer = try KafkaProducer(configuration: producerKafka)
                mustScan = true
            } else if failedNotWritten {
                // Outputs that never left the producer (timed out or purged in its own queue, behind a slow delivery)
                // are not in Kafka: produced again without the read-back a possibly landed output needs, and the first
                // time without a pause. A pause and a read-back per round kept a saturated member's next outputs timing
                // out in the queue in turn, round after round (docs/performance.md, session 50).
                closeWritesAhead()
                if !resentUnwritten {
                    resentUnwritten = true
                    logger.notice(
                        "producing again outputs that never left the producer",
                        metadata: ["count": "\(failed.count)", "error": "\(lastError.map { "\($0)" } ?? "-")"])
                    continue
                }
            } else {
                mustScan = true
            }
            try await pipeline.backoff(&attempt, "delivering \(failed.count) outputs", lastError)
        }
    }
}

extension Topics {
    /// Every partition of the output topics (jobs and dead letters); none of a topic that does not exist.
    func outputPartitions(in cluster: KafkaCluster, timeout: Duration) async throws -> [TopicPartition] {
        var partitions: [TopicPartition] = []
        for topic in [jobs, deadLetters] {
            let count = try await cluster.partitionCount(topic: topic, timeout: timeout) ?? 0
            partitions += (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
        }
        return partitions
    }
}
