import Foundation

/// Shows a long-running replay's progress on standard error: a bar redrawn in place, with rate and ETA, when
/// standard error is a terminal; otherwise one plain line every few seconds (logs, CI, `kubectl logs`).
final class ProgressDisplay: @unchecked Sendable { // used from one task at a time
    private let label: String
    private let interactive: Bool
    private let started = ContinuousClock.now
    private var lastDrawn: ContinuousClock.Instant?
    private var lastLine = ""

    init(label: String, interactive: Bool = isatty(STDERR_FILENO) == 1) {
        self.label = label
        self.interactive = interactive
    }

    /// `done` of `total` events; `detail` says what they gave (jobs, dead letters, skipped).
    func update(done: Int, total: Int, detail: String, force: Bool = false) {
        let now = ContinuousClock.now
        let every: Duration = interactive ? .milliseconds(200) : .seconds(5)
        if !force, let lastDrawn, now - lastDrawn < every { return }
        lastDrawn = now
        let elapsed = Double((now - started).components.seconds) + Double((now - started).components.attoseconds) / 1e18
        let rate = elapsed > 0 ? Double(done) / elapsed : 0
        let eta = rate > 0 && total > done ? Self.clock(Double(total - done) / rate) : "-"
        let percent = total > 0 ? min(100, done * 100 / total) : 100
        if interactive {
            let width = 30
            let filled = total > 0 ? min(width, done * width / total) : width
            let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
            let line = "\(label): [\(bar)] \(percent)% \(done)/\(total) events, \(Int(rate))/s, ETA \(eta), \(detail)"
            let padding = String(repeating: " ", count: max(0, lastLine.count - line.count))
            lastLine = line
            FileHandle.standardError.write(Data("\r\(line)\(padding)".utf8))
        } else {
            FileHandle.standardError.write(
                Data("\(label): \(done)/\(total) events (\(percent)%), \(Int(rate))/s, ETA \(eta), \(detail)\n".utf8))
        }
    }

    /// Ends the bar's line (on a terminal), so what follows starts on a line of its own.
    func finish() {
        if interactive && !lastLine.isEmpty { FileHandle.standardError.write(Data("\n".utf8)) }
    }

    static func clock(_ seconds: Double) -> String {
        let total = Int(seconds.rounded(.up))
        return total >= 3600
            ? String(format: "%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60)
            : String(format: "%d:%02d", total / 60, total % 60)
    }
}
