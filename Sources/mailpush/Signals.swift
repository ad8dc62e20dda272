import Dispatch
import Foundation
import Logging
import Synchronization

/// A second SIGTERM/SIGINT during a graceful shutdown exits at once. That is safe: nothing uncommitted is
/// lost, recovery at the next start finds what the unfinished batch had already written.
enum SecondSignal {
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []

    static func exitImmediately(logger: Logger) {
        let seen = Counter()
        for signalNumber in [SIGTERM, SIGINT] {
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler {
                if seen.increment() >= 2 {
                    logger.warning("second signal: exiting now; the next start recovers the batch in flight")
                    exit(128 + signalNumber)
                }
            }
            source.resume()
            sources.append(source)
        }
    }

    private final class Counter: Sendable {
        private let count = Atomic<Int>(0)
        func increment() -> Int {
            count.wrappingAdd(1, ordering: .relaxed).newValue
        }
    }
}

/// SIGTERM and SIGINT from the first moment of `mailpush run` on. The service group handles them only once it
/// runs; before that, either killed the process by its default action (an exit by signal, not 0), for instance a
/// pod deleted while it started. A signal that lands during start-up now becomes the group's graceful shutdown,
/// delivered as soon as the group exists, and every later one is delivered there too (duplicates are harmless).
final class StartUpSignals: Sendable {
    private struct State {
        var received = false
        var shutdown: (@Sendable () -> Void)?
    }

    private let state = Mutex(State())
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []

    static func install() -> StartUpSignals {
        let signals = StartUpSignals()
        for signalNumber in [SIGTERM, SIGINT] {
            // As the service group does: the source sees the signal instead of its default action.
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler { signals.received() }
            source.resume()
            sources.append(source)
        }
        return signals
    }

    private func received() {
        let shutdown = state.withLock { state in
            state.received = true
            return state.shutdown
        }
        shutdown?()
    }

    /// From now on a signal calls `shutdown`; one received before calls it at once.
    func deliver(to shutdown: @escaping @Sendable () -> Void) {
        let pending = state.withLock { state in
            state.shutdown = shutdown
            return state.received
        }
        if pending { shutdown() }
    }
}
