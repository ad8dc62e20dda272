import Logging
import Synchronization

/// Log lines about single records (an event dead-lettered, a config record skipped, a key rejected): the first few of
/// each kind in every window are logged, the rest counted and summed up in one line when the window ends.
///
/// Why: a flood of bad records is an input like any other, and its cost must be bounded. A producer writing the wrong
/// format to the events topic, or a fresh instance reading a million registrations with a rule nobody supports,
/// would otherwise log a line per record: thousands a second, more than a person can read and what a log shipper
/// charges for. Every record is still counted in its metric, and every dead letter is on the dead-letter topic with
/// its reason.
struct RecordLog: Sendable {
    let logger: Logger
    private let budget: Budget

    /// Lines of one kind logged per window.
    static let linesPerWindow = 10
    static let window = Duration.seconds(10)

    init(logger: Logger, linesPerWindow: Int = Self.linesPerWindow, window: Duration = Self.window) {
        self.logger = logger
        budget = Budget(linesPerWindow: linesPerWindow, window: window)
    }

    /// Logs `message` unless this window has had its lines of the kind: the message, told apart by `of` (one of
    /// the line's metadata from a small set: a dead letter's reason, a topic; never a record's own text), which the
    /// summary repeats. `countedIn` ends the summary line: where a person finds every record the log left out.
    func log(
        _ level: Logger.Level, _ message: Logger.Message, of category: (key: String, value: String)? = nil, countedIn: String,
        metadata: @autoclosure () -> Logger.Metadata
    ) {
        // A line the level leaves out, and so its summary, is not counted.
        guard level >= logger.logLevel else { return }
        let kind = Kind(
            message: message.description, categoryKey: category?.key, categoryValue: category?.value, level: level, countedIn: countedIn)
        let (admitted, ended) = budget.admit(kind, at: .now)
        if let ended { summarize(ended) }
        if admitted { logger.log(level: level, message, metadata: metadata()) }
    }

    /// Logs the summaries of windows that have ended: called every second or so, and once at the end.
    func flush(all: Bool = false) {
        for ended in budget.takeEnded(at: .now, all: all) { summarize(ended) }
    }

    private func summarize(_ ended: Ended) {
        var metadata: Logger.Metadata = ["notLogged": "\(ended.notLogged)"]
        if let key = ended.kind.categoryKey { metadata[key] = "\(ended.kind.categoryValue ?? "")" }
        logger.log(
            level: ended.kind.level,
            "\(ended.notLogged) more \"\(ended.kind.message)\" lines were not logged in the last \(ended.seconds) s; \(ended.kind.countedIn)",
            metadata: metadata)
    }

    /// A window that ended with lines not logged.
    struct Ended {
        var kind: Kind
        var notLogged: Int
        /// How long the window lasted: longer than `window` when nothing looked at it in time.
        var seconds: Int64
    }

    struct Kind: Hashable, Sendable {
        var message: String
        var categoryKey: String?
        var categoryValue: String?
        var level: Logger.Level
        var countedIn: String
    }

    private final class Budget: Sendable {
        let linesPerWindow: Int
        let window: Duration
        private let tallies = Mutex<[Kind: Tally]>([:])

        private struct Tally {
            var started: ContinuousClock.Instant
            var logged = 0
            var notLogged = 0

            func ended(_ kind: Kind, at now: ContinuousClock.Instant) -> Ended? {
                guard notLogged > 0 else { return nil }
                return Ended(kind: kind, notLogged: notLogged, seconds: max(1, (now - started).components.seconds))
            }
        }

        init(linesPerWindow: Int, window: Duration) {
            self.linesPerWindow = linesPerWindow
            self.window = window
        }

        /// Whether a line of `kind` is logged now, and the summary of its window if that window ended.
        func admit(_ kind: Kind, at now: ContinuousClock.Instant) -> (Bool, Ended?) {
            tallies.withLock { tallies in
                var ended: Ended?
                var tally = tallies[kind] ?? Tally(started: now)
                if now - tally.started >= window {
                    ended = tally.ended(kind, at: now)
                    tally = Tally(started: now)
                }
                let admitted = tally.logged < linesPerWindow
                if admitted { tally.logged += 1 } else { tally.notLogged += 1 }
                tallies[kind] = tally
                return (admitted, ended)
            }
        }

        /// The kinds whose window ended with lines not logged (every one with `all`), their windows closed.
        func takeEnded(at now: ContinuousClock.Instant, all: Bool) -> [Ended] {
            tallies.withLock { tallies in
                var ended: [Ended] = []
                for (kind, tally) in tallies where all || now - tally.started >= window {
                    if let summary = tally.ended(kind, at: now) { ended.append(summary) }
                    tallies[kind] = nil
                }
                return ended
            }
        }
    }
}
