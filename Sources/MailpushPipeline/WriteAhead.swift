import MailpushKafka
import Synchronization

/// Lets the batch being prepared ahead write its outputs while the batch before it waits for its acknowledgements
/// and commits, so that an event arriving meanwhile goes out within milliseconds instead of after that batch
/// (docs/exactly-once.md, "Writing ahead").
///
/// - Opened once every output of the batch in flight is enqueued: in each output partition, that batch's
///   outputs then come before anything written ahead, so its marks never pass an output of the next batch.
/// - Closed when that batch's delivery fails, before its read-back (a retry lands after what was written ahead,
///   so that batch then commits without moving its marks), and when the next batch stops gathering.
/// - A write and a close never interleave: after `close` returns, nothing more is enqueued through it.
final class WriteAhead: Sendable {
    private enum Phase { case waiting, open, closed }
    private struct State {
        var phase = Phase.waiting
        var wrote = false
    }
    private let state = Mutex(State())
    private let producer: KafkaProducer
    /// Whether outputs of events of these partitions may be written now (a fleet's leases).
    private let mayWrite: @Sendable (Set<Int32>) -> Bool

    init(producer: KafkaProducer, mayWrite: @escaping @Sendable (Set<Int32>) -> Bool) {
        self.producer = producer
        self.mayWrite = mayWrite
    }

    func open() {
        state.withLock { state in
            if state.phase == .waiting { state.phase = .open }
        }
    }

    /// Closes it for good; true if anything was written ahead through it.
    @discardableResult
    func close() -> Bool {
        state.withLock { state in
            state.phase = .closed
            return state.wrote
        }
    }

    /// Enqueues `outputs` (of events of `partitions`) if it is open and they may be written; nil otherwise.
    func write(_ outputs: [Output], partitions: Set<Int32>) -> PendingDelivery? {
        state.withLock { state in
            guard state.phase == .open, mayWrite(partitions) else { return nil }
            state.wrote = true
            return producer.enqueueNow(outputs.map(\.record))
        }
    }
}

/// Outputs of a planned batch already written ahead (`WriteAhead`): the first ones of its first round, in order.
struct AheadWrite: Sendable {
    let outputs: [Output]
    let pending: PendingDelivery

    /// Whether `delivered` (what the delivery assembled, in order) starts with exactly these outputs.
    static func areAPrefix(_ writes: [AheadWrite], of delivered: [Output]) -> Bool {
        var index = 0
        for write in writes {
            for output in write.outputs {
                guard index < delivered.count else { return false }
                let other = delivered[index]
                guard output === other || (output.source == other.source && output.kind == other.kind) else { return false }
                index += 1
            }
        }
        return true
    }
}
