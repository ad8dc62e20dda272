import Dispatch
import MailpushPartition
import Synchronization

/// An assign-based consumer: no group membership, never commits offsets (progress is stored elsewhere).
///
/// Defaults: `enable.auto.commit=false`, `enable.auto.offset.store=false`, `enable.partition.eof=false`,
/// `auto.offset.reset=error`, `fetch.max.bytes` 8 MiB (librdkafka: 50 MB), and a fixed `group.id` that
/// librdkafka 2.0.2 needs for `assign` but that is never joined or committed to.
public final class KafkaConsumer: Sendable {
    private let consumer: RdConsumer
    /// Runs the blocking `consume` (and `close`, so it never overlaps one) off Swift's cooperative pool.
    private let worker = DispatchQueue(label: "mailpush.kafka.consumer")
    private let errorHandler: KafkaErrorHandler?
    private let state = Mutex(State())

    private struct State {
        var closed = false
        /// A failure seen while records were already collected: those are returned first, this is thrown next.
        var pendingFailure: KafkaError?
        /// When an assignment last replaced one with partitions (whose fetchers it stopped), and whether the
        /// current assignment has partitions.
        var lastStopping: ContinuousClock.Instant?
        var assigned = false
    }

    public init(configuration: KafkaConfiguration) throws(KafkaError) {
        consumer = try RdConsumer(configuration: configuration)
        errorHandler = configuration.errorHandler
    }

    deinit { close() }

    /// Replaces the whole assignment. Fetching starts in the background right away.
    public func assign(_ assignments: [TopicPartition: StartOffset]) throws(KafkaError) {
        if state.withLock({ $0.closed }) { throw Self.closedError }
        state.withLock { state in
            if state.assigned { state.lastStopping = .now }
            state.assigned = !assignments.isEmpty
        }
        try consumer.assign(assignments)
    }

    /// `assign`, after waiting until the last one that stopped fetchers is at least `assignSpacing` old, if this
    /// one stops fetchers too (the current assignment has partitions).
    ///
    /// A whole-assignment change stops the fetcher of every partition assigned before and starts the new ones
    /// once every stop is confirmed. In librdkafka up to 2.15, a second change that comes while a stop is still
    /// unconfirmed stops the same partition twice, and the second confirmation aborts the process
    /// (`rd_kafka_assignment_partition_stopped: Assertion rktp->rktp_started failed`, librdkafka issue 5573,
    /// fixed in 2.16). A fleet member can change its events consumer's assignment twice in a row (a lost
    /// partition, then the group's news of it); spacing the changes leaves the stops time to be confirmed. A change
    /// from no partitions stops nothing (librdkafka's `rd_kafka_assignment_clear` has nothing to clear), so it
    /// need not wait: a consumer kept between reads (`PartitionReader`) starts each read at once.
    public func reassign(_ assignments: [TopicPartition: StartOffset]) async throws(KafkaError) {
        let wait = state.withLock { state in
            state.assigned ? state.lastStopping.map { Self.assignSpacing - (ContinuousClock.now - $0) } : nil
        }
        if let wait, wait > .zero {
            do { try await Task.sleep(for: wait) } catch {
                throw KafkaError(rdCode: KafkaError.Code.interrupted, message: "reassign cancelled")
            }
        }
        try assign(assignments)
    }

    public static let assignSpacing = Duration.milliseconds(250)

    /// Up to `maxRecords` already-fetched records, waiting at most `timeout` for the first one; [] on timeout.
    /// A poll stops taking records once their keys and values reach `maxBytes` (a few records past it); the first
    /// record is taken whatever its size. Records of one partition come in offset order.
    ///
    /// Partition EOF and transient errors are not thrown (they go to `KafkaConfiguration.errorHandler`).
    /// Throws fatal errors, and `_AUTO_OFFSET_RESET` when an assigned start offset is outside the log
    /// (librdkafka then stops fetching that partition until it is assigned again).
    public func poll(maxRecords: Int, maxBytes: Int = .max, timeout: Duration) async throws(KafkaError) -> [KafkaRecord] {
        try await poll(maxRecords: maxRecords, maxBytes: maxBytes, timeout: timeout, keepingFailures: false)
    }

    /// Like `poll`, but never throws: a failure is kept for the next `poll`, which throws it. For a caller
    /// that takes records opportunistically and must not be the one to swallow a failure. nil, at once,
    /// while a failure waits for that `poll` or once the consumer is closed.
    public func pollKeepingFailures(maxRecords: Int, maxBytes: Int = .max, timeout: Duration) async -> [KafkaRecord]? {
        try? await poll(maxRecords: maxRecords, maxBytes: maxBytes, timeout: timeout, keepingFailures: true)
    }

    private func poll(maxRecords: Int, maxBytes: Int, timeout: Duration, keepingFailures: Bool) async throws(KafkaError) -> [KafkaRecord] {
        precondition(maxRecords > 0, "maxRecords must be positive")
        let refusal: KafkaError? = state.withLock { state in
            if state.closed { return Self.closedError }
            // Kept for a `poll` that throws it: a caller keeping failures is refused without taking it.
            if keepingFailures { return state.pendingFailure.map { _ in Self.closedError } }
            defer { state.pendingFailure = nil }
            return state.pendingFailure
        }
        if let refusal { throw refusal }

        let consumer = self.consumer
        let timeoutMs = timeout.clampedMilliseconds
        let batch = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                worker.async {
                    continuation.resume(returning: consumer.consume(maxRecords: maxRecords, maxBytes: maxBytes, timeoutMs: timeoutMs))
                }
            }
        } onCancel: {
            consumer.wake()
        }

        if let errorHandler { batch.reported.forEach(errorHandler) }
        if let failure = batch.failure {
            if batch.records.isEmpty && !keepingFailures { throw failure }
            state.withLock { $0.pendingFailure = failure }
        }
        return batch.records
    }

    /// The offset after the last record `poll` returned, per partition; partitions nothing was returned
    /// from yet are left out. librdkafka moves it past control records (transaction markers) too.
    public func positions(_ partitions: [TopicPartition]) -> [TopicPartition: Int64] {
        if state.withLock({ $0.closed }) { return [:] }
        return consumer.positions(partitions)
    }

    /// Makes a `poll` in progress return now (with what it has).
    public func wake() { consumer.wake() }

    /// Stops fetching. Later `poll`/`assign` calls throw `_DESTROY`. Idempotent. Blocks briefly: it wakes a
    /// `poll` in progress and waits for it to return before closing the librdkafka consumer.
    public func close() {
        let wasClosed = state.withLock { state in
            defer { state.closed = true }
            return state.closed
        }
        if wasClosed { return }
        consumer.wake() // let a poll in progress return now instead of at its timeout
        let consumer = self.consumer
        worker.sync { consumer.close() }
    }

    private static let closedError = KafkaError(rdCode: KafkaError.Code.destroyed, message: "consumer is closed")
}
