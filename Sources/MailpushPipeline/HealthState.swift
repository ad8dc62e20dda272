import Metrics
import Synchronization

/// What `/healthz` and `/readyz` report: shared between the pipeline task and the HTTP server.
public final class HealthState: Sendable {
    private struct State {
        var ready = false
        var detail = "starting"
        var lastBeat = ContinuousClock.now
        /// In a fleet: the member's partitions, which must all be processing for the service to be ready.
        var partitions: PartitionPhases?
        /// The latest progress of long work, and when it was reported: shown beside a fleet member's partitions
        /// while one of them is being taken over (a read-back of a long output history, say).
        var progress: (detail: String, at: ContinuousClock.Instant)?
    }

    private let state = Mutex(State())
    private let readyGauge = Gauge(label: "mailpush_ready")

    public init() {}

    /// Ready: config topics caught up, the broker answering, and in a fleet, joined with every assigned
    /// partition processing. `detail` says what it waits for when it is not.
    public var readiness: (ready: Bool, detail: String) {
        let (ready, detail, partitions, progress) = state.withLock { ($0.ready, $0.detail, $0.partitions, $0.progress) }
        guard ready, let partitions else { return (ready, detail) }
        let membership = partitions.readiness
        if !membership.working, let progress, ContinuousClock.now - progress.at < .seconds(2) {
            return (false, "\(membership.detail); \(progress.detail)")
        }
        return (membership.working, membership.detail)
    }

    /// Whether the pipeline itself (not its fleet membership) is ready.
    var pipelineReady: Bool { state.withLock { $0.ready } }

    /// From now on readiness also needs `partitions` to be working (a fleet member).
    func follow(_ partitions: PartitionPhases) {
        state.withLock { $0.partitions = partitions }
        recordReadiness()
    }

    func recordReadiness() {
        readyGauge.record(readiness.ready ? 1 : 0)
    }

    /// Alive while the pipeline loop keeps turning (it beats at least once per poll).
    public func isAlive(within limit: Duration = .seconds(120)) -> Bool {
        state.withLock { ContinuousClock.now - $0.lastBeat < limit }
    }

    func beat() { state.withLock { $0.lastBeat = ContinuousClock.now } }

    /// Long work (a config catch-up, a read-back, a big batch) that is moving: alive, and while not ready,
    /// `/readyz` says how far it got. `detail` must never carry record content.
    func progress(_ detail: @autoclosure () -> String) {
        state.withLock {
            $0.lastBeat = ContinuousClock.now
            if !$0.ready {
                $0.detail = detail()
            } else if $0.partitions != nil {
                $0.progress = (detail(), $0.lastBeat)
            }
        }
    }

    func setReady(_ ready: Bool, _ detail: String) {
        state.withLock {
            $0.ready = ready
            $0.detail = detail
            $0.lastBeat = ContinuousClock.now
        }
        recordReadiness()
    }
}
