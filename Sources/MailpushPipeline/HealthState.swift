import Metrics
import Synchronization

/// What `/healthz` and `/readyz` report: shared between the pipeline task and the HTTP server.
public final class HealthState: Sendable {
    private struct State {
        var ready = false
        var detail = "starting"
        var lastBeat = ContinuousClock.now
    }

    private let state = Mutex(State())
    private let readyGauge = Gauge(label: "mailpush_ready")

    public init() {}

    /// Ready: config topics caught up and the broker answering.
    public var isReady: Bool { state.withLock { $0.ready } }
    public var detail: String { state.withLock { $0.detail } }

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
            if !$0.ready { $0.detail = detail() }
        }
    }

    func setReady(_ ready: Bool, _ detail: String) {
        state.withLock {
            $0.ready = ready
            $0.detail = detail
            $0.lastBeat = ContinuousClock.now
        }
        readyGauge.record(ready ? 1 : 0)
    }
}
