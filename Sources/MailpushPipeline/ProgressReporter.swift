import Logging
import Synchronization

/// Reports long reads (config catch-up, output read-back) as they go: every report keeps `/healthz`
/// beating, so a liveness probe never kills a process that is progressing; while the service is not ready,
/// `/readyz` says how far it got; every `interval` a log line says the same. Counts only, never content.
final class ProgressReporter: Sendable {
    private let what: String
    private let logger: Logger
    private let health: HealthState
    private let interval: Duration
    private let lastLog: Mutex<ContinuousClock.Instant>

    init(_ what: String, logger: Logger, health: HealthState, interval: Duration = .seconds(5)) {
        self.what = what
        self.logger = logger
        self.health = health
        self.interval = interval
        lastLog = Mutex(ContinuousClock.now)
    }

    /// A read starts: the next log line comes one `interval` from now, so short reads log nothing.
    func start() { lastLog.withLock { $0 = .now } }

    func report(read: Int64, of total: Int64) {
        health.progress("\(what): \(read) of \(total) records")
        let due = lastLog.withLock { last in
            guard ContinuousClock.now - last >= interval else { return false }
            last = .now
            return true
        }
        if due {
            logger.info("\(what): still reading", metadata: ["records": "\(read)", "total": "\(total)"])
        }
    }
}
