import Logging
import Synchronization

/// Reports long reads (config catch-up, output read-back) as they go: every report keeps `/healthz`
/// beating, so a liveness probe never kills a process that is progressing; while the service is not ready,
/// `/readyz` says how far it got. A read of at least `announceFrom` records is logged when it starts and when
/// it ends, and every `interval` in between, so an operator sees how much is ahead and how long it took,
/// however fast the machine. Small reads (the catch-up before each batch) log nothing. Counts only, never
/// content.
final class ProgressReporter: Sendable {
    private struct Read {
        var started = ContinuousClock.now
        var lastLog = ContinuousClock.now
        var logged = false
    }

    private let what: String
    private let logger: Logger
    private let health: HealthState
    private let interval: Duration
    private let announceFrom: Int64
    private let current: Mutex<Read>

    init(
        _ what: String, logger: Logger, health: HealthState, interval: Duration = .seconds(5), announceFrom: Int64 = 10_000
    ) {
        self.what = what
        self.logger = logger
        self.health = health
        self.interval = interval
        self.announceFrom = announceFrom
        current = Mutex(Read())
    }

    /// A read of `total` records starts.
    func start(total: Int64) {
        let announce = total >= announceFrom
        current.withLock { $0 = Read(logged: announce) }
        if announce {
            logger.info("\(what): reading", metadata: ["records": "0", "total": "\(total)"])
        }
    }

    func report(read: Int64, of total: Int64) {
        health.progress("\(what): \(read) of \(total) records")
        let due = current.withLock { current in
            guard ContinuousClock.now - current.lastLog >= interval else { return false }
            current.lastLog = .now
            current.logged = true
            return true
        }
        if due {
            logger.info("\(what): still reading", metadata: ["records": "\(read)", "total": "\(total)"])
        }
    }

    /// The read ended; logged when its start or progress was.
    func finish(read: Int64) {
        let (logged, started) = current.withLock { ($0.logged, $0.started) }
        guard logged else { return }
        let milliseconds = (ContinuousClock.now - started).milliseconds
        logger.info("\(what): done", metadata: ["records": "\(read)", "milliseconds": "\(milliseconds)"])
    }
}
