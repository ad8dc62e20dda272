import Dispatch
import Synchronization

/// Until when a `send` may enqueue its records (a fleet's partition leases).
///
/// `send` asks `until` before its first record, and again only once the instant it gave has passed: between the
/// two, a record costs a clock read rather than a call into the gate (asked before every record, the gate's call,
/// lock and task hop cost about 1% of a job's CPU in a drain). `until` may wait (for a renewal that is due); nil,
/// or an instant already past, ends the enqueueing.
public struct EnqueueGate: Sendable {
    public let until: @Sendable () async -> ContinuousClock.Instant?

    public init(until: @escaping @Sendable () async -> ContinuousClock.Instant?) { self.until = until }
}

/// An idempotent producer (`enable.idempotence=true`, `acks=all`, `linger.ms=5`, batches of up to
/// 10000 records / 1 MB, Java-compatible `murmur2_random` partitioner; any of these can be overridden
/// through `KafkaConfiguration.properties`).
///
/// A dedicated thread serves librdkafka's delivery reports, so `send` only awaits.
public final class KafkaProducer: Sendable {
    private let producer: RdProducer

    public init(configuration: KafkaConfiguration) throws(KafkaError) {
        producer = try RdProducer(configuration: configuration)
    }

    /// Enqueues all records (waiting while librdkafka's local queue is full), then waits until every one
    /// has a delivery report. Results are in input order; a record that failed carries its `error`.
    ///
    /// `timeout` counts from the last enqueue: a full queue that keeps draining is progress, however long
    /// the whole batch takes; only `timeout` without any record enqueued, or without the last reports after
    /// the last enqueue, is a failure.
    ///
    /// Throws if the producer has hit a fatal error, if the task is cancelled, or if `timeout` passes first.
    /// After a throw, records already enqueued may still be delivered later (librdkafka keeps retrying them
    /// until `message.timeout.ms`): call `settle` before reading the topics back, so that nothing of this
    /// producer can still land after the read-back.
    ///
    /// `gate` says until when records may be enqueued (`EnqueueGate`); once it says no more, nothing more is enqueued
    /// and `send` throws `KafkaError.Code.leaseExpired` (what was enqueued before may still be delivered).
    ///
    /// `enqueued` is called once every record is enqueued (before the reports are awaited).
    public func send(
        _ records: [OutgoingRecord], timeout: Duration, gate: EnqueueGate? = nil, enqueued: (() -> Void)? = nil
    ) async throws(KafkaError) -> [DeliveryResult] {
        if records.isEmpty {
            enqueued?()
            return []
        }
        if let fatal = producer.client.fatalError() { throw fatal }
        var deadline = ContinuousClock.now + timeout
        let batch = DeliveryBatch(count: records.count)
        var enqueueUntil: ContinuousClock.Instant?

        // By index, not `enumerated()`: that copies each record (a retain per field) only to pass it on.
        for index in records.indices {
            enqueueing: while true {
                // Before every attempt, a wait for room included: a record let through before the wait and enqueued
                // after the gate's instant could leave later than what the gate promises (the fence's timing).
                if let gate, enqueueUntil.map({ ContinuousClock.now >= $0 }) ?? true {
                    enqueueUntil = await gate.until()
                    guard let until = enqueueUntil, ContinuousClock.now < until else {
                        throw KafkaError(
                            rdCode: KafkaError.Code.leaseExpired,
                            message: "not allowed to write any more after enqueueing \(index) of \(records.count) records")
                    }
                }
                switch producer.enqueue(records[index], ticket: DeliveryTicket(batch: batch, index: index)) {
                case .enqueued:
                    deadline = ContinuousClock.now + timeout
                    break enqueueing
                case .failed(let error):
                    batch.report(index, .refusedWhenEnqueued(error))
                    break enqueueing
                case .queueFull:
                    // The poll thread frees room as reports arrive; wait without holding a thread.
                    guard ContinuousClock.now < deadline else {
                        throw .timedOut(
                            "producer queue full for \(timeout) without room for another record: "
                                + "enqueued \(index) of \(records.count) records, which may still be delivered")
                    }
                    do { try await Task.sleep(for: .milliseconds(2)) } catch {
                        throw KafkaError(
                            rdCode: KafkaError.Code.interrupted,
                            message: "send cancelled after enqueueing \(index) of \(records.count) records")
                    }
                }
            }
        }
        enqueued?()
        return try await batch.results(deadline: deadline, timeout: timeout)
    }

    /// Enqueues `records` now, without waiting for room or for reports: `send` in two halves, for records
    /// written ahead while other work goes on. A record librdkafka refuses at once (a full local queue
    /// included) fails with that error in its result; nothing is retried here.
    public func enqueueNow(_ records: [OutgoingRecord]) -> PendingDelivery {
        let batch = DeliveryBatch(count: records.count)
        let fatal = producer.client.fatalError()
        for index in records.indices {
            if let fatal {
                batch.report(index, .refusedWhenEnqueued(fatal))
                continue
            }
            switch producer.enqueue(records[index], ticket: DeliveryTicket(batch: batch, index: index)) {
            case .enqueued: break
            case .failed(let error): batch.report(index, .refusedWhenEnqueued(error))
            case .queueFull:
                let full = KafkaError(
                    code: KafkaError.Code.queueFull, name: "_QUEUE_FULL", message: "Local: Queue full", isRetriable: true)
                batch.report(index, .refusedWhenEnqueued(full))
            }
        }
        return PendingDelivery(batch: batch, count: records.count, enqueuedAt: .now)
    }

    /// Learns the partitions and leaders of `topics` now (they must exist), so that the first records sent to
    /// them leave at once instead of waiting for librdkafka's once-a-second topic scan (up to 1 s, measured).
    /// Best effort, at most `timeout` per topic; a topic not learned in time is learned by that scan.
    public func prepare(topics: [String], timeout: Duration = .seconds(1)) async {
        let producer = self.producer
        let timeoutMs = timeout.clampedMilliseconds
        await DispatchQueue.global().run { producer.learnTopics(topics, timeoutMs: timeoutMs) }
    }

    /// Records enqueued whose delivery report has not been served yet.
    public var outstanding: Int { producer.outstanding }

    /// Makes sure nothing of this producer can still reach the broker: drops what is still queued (never
    /// sent) and waits until every record sent has its delivery report. Returns false if some report is
    /// still missing after `timeout` (records of a request in flight may then still be written).
    public func settle(timeout: Duration) async -> Bool {
        _ = producer.purgeQueued()
        let deadline = ContinuousClock.now + timeout
        while producer.outstanding > 0 {
            guard ContinuousClock.now < deadline else { return false }
            do { try await Task.sleep(for: .milliseconds(5)) } catch { return false }
        }
        return true
    }

    /// Waits until every enqueued record has been delivered or has failed, or until `timeout`.
    public func flush(timeout: Duration) async {
        let deadline = ContinuousClock.now + timeout
        while producer.outstanding > 0, ContinuousClock.now < deadline {
            do { try await Task.sleep(for: .milliseconds(2)) } catch { return }
        }
    }
}

/// Records `enqueueNow` enqueued: their delivery reports, in input order, when they are all in.
public struct PendingDelivery: Sendable {
    fileprivate let batch: DeliveryBatch
    public let count: Int
    fileprivate let enqueuedAt: ContinuousClock.Instant

    /// Waits until every record has its report, or until `timeout` after the enqueue (then throws, as `send`).
    public func results(timeout: Duration) async throws(KafkaError) -> [DeliveryResult] {
        if count == 0 { return [] }
        return try await batch.results(deadline: enqueuedAt + timeout, timeout: timeout)
    }
}

/// One record's place in a `send` call; librdkafka carries it as the message opaque.
final class DeliveryTicket: Sendable {
    let batch: DeliveryBatch
    let index: Int
    init(batch: DeliveryBatch, index: Int) {
        self.batch = batch
        self.index = index
    }
    func report(_ result: DeliveryResult) { batch.report(index, result) }
}

/// Collects the delivery reports of one `send` call and wakes it when the last one arrives (or on
/// timeout/cancellation, whichever comes first).
final class DeliveryBatch: Sendable {
    private struct State {
        var results: [DeliveryResult?]
        var missing: Int
        var outcome: Result<[DeliveryResult], KafkaError>?
        var waiter: CheckedContinuation<Result<[DeliveryResult], KafkaError>, Never>?
    }
    private let state: Mutex<State>

    init(count: Int) {
        state = Mutex(State(results: Array(repeating: nil, count: count), missing: count))
    }

    func report(_ index: Int, _ result: DeliveryResult) {
        finish { state in
            guard state.results[index] == nil else { return nil }
            state.results[index] = result
            state.missing -= 1
            return state.missing == 0 ? .success(state.results.map { $0! }) : nil
        }
    }

    func fail(_ error: KafkaError) {
        finish { state in
            .failure(
                KafkaError(
                    code: error.code, name: error.name,
                    message: "\(error.message) (\(state.missing) of \(state.results.count) records "
                        + "without delivery report; they may still be delivered)",
                    isFatal: error.isFatal, isRetriable: error.isRetriable))
        }
    }

    /// Records the first outcome `decide` returns and resumes the waiter, outside the lock.
    private func finish(_ decide: (inout State) -> Result<[DeliveryResult], KafkaError>?) {
        let waiter: CheckedContinuation<Result<[DeliveryResult], KafkaError>, Never>?
        let outcome: Result<[DeliveryResult], KafkaError>?
        (waiter, outcome) = state.withLock { state in
            guard state.outcome == nil, let outcome = decide(&state) else { return (nil, nil) }
            state.outcome = outcome
            defer { state.waiter = nil }
            return (state.waiter, outcome)
        }
        if let waiter, let outcome { waiter.resume(returning: outcome) }
    }

    func results(deadline: ContinuousClock.Instant, timeout: Duration) async throws(KafkaError) -> [DeliveryResult] {
        let timer = Task { [self] in
            try await Task.sleep(until: deadline)
            fail(.timedOut("no delivery report within \(timeout)"))
        }
        defer { timer.cancel() }
        let outcome = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let done: Result<[DeliveryResult], KafkaError>? = state.withLock { state in
                    if state.outcome == nil { state.waiter = continuation }
                    return state.outcome
                }
                if let done { continuation.resume(returning: done) }
            }
        } onCancel: {
            fail(KafkaError(rdCode: KafkaError.Code.interrupted, message: "send cancelled"))
        }
        return try outcome.get()
    }
}
