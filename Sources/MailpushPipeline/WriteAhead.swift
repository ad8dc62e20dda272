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

    enum Outcome {
        case written(PendingDelivery)
        /// The batch in flight has not enqueued all its outputs yet: asking again later may succeed.
        case notYet
        /// Closed, or a partition's lease is not valid: nothing more of this batch may be written ahead.
        case refused
    }

    /// Enqueues `outputs` (of events of `partitions`) if it is open and they may be written.
    func write(_ outputs: [Output], partitions: Set<Int32>) -> Outcome {
        state.withLock { state in
            switch state.phase {
            case .waiting: return .notYet
            case .closed: return .refused
            case .open:
                guard mayWrite(partitions) else { return .refused }
                state.wrote = true
                return .written(producer.enqueueNow(outputs.map(\.record)))
            }
        }
    }
}

/// Writes one chunk's outputs ahead (`WriteAhead`), in pieces while it renders and the rest once it is rendered,
/// so that the first events of a large chunk go out while its last are sealed. Nothing is written before the
/// config catch-up of the chunk's plan confirmed the config it was planned with (`confirmConfig`). Once a write
/// is refused, nothing more of the chunk, or of the batch, is written ahead: what was is a prefix of its outputs.
final class ChunkWriteAhead {
    private let ahead: WriteAhead
    let configConfirmed = ConfigConfirmation()
    private(set) var writes: [AheadWrite] = []
    private var writtenOutputs = 0
    private var refused = false

    init(_ ahead: WriteAhead) { self.ahead = ahead }

    /// A piece rendered (`BatchProcessor.renderFirstRound`'s `offer`): whether it was written.
    func offer(_ outputs: [Output], partitions: Set<Int32>) -> Bool {
        guard !refused, configConfirmed.isSet else { return false }
        return write(outputs, partitions: partitions)
    }

    /// The chunk's outputs as its delivery will assemble them (nil when they are not all rendered): writes those
    /// not written yet; false when they were not all written.
    func finish(_ outputs: [Output]?, partitions: Set<Int32>) -> Bool {
        guard !refused, let outputs else { return false }
        return write(Array(outputs.dropFirst(writtenOutputs)), partitions: partitions)
    }

    private func write(_ outputs: [Output], partitions: Set<Int32>) -> Bool {
        if outputs.isEmpty { return true }
        switch ahead.write(outputs, partitions: partitions) {
        case .written(let pending):
            writes.append(AheadWrite(outputs: outputs, pending: pending))
            writtenOutputs += outputs.count
            return true
        case .notYet:
            return false
        case .refused:
            refused = true
            return false
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

/// Set once a chunk's config catch-up showed that the config it is planned with is all there is to apply: the
/// catch-up's answer arrives on another task while the chunk renders.
final class ConfigConfirmation: Sendable {
    private let confirmed = Atomic<Bool>(false)

    func set() { confirmed.store(true, ordering: .releasing) }
    var isSet: Bool { confirmed.load(ordering: .acquiring) }
}
