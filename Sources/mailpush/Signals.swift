import Dispatch
import Foundation
import Logging
import Synchronization

/// SIGTERM and SIGINT of `mailpush run`, from the first line of `run` on.
///
/// The first signal asks the service group for its graceful shutdown. The group handles the signals itself only
/// once it runs; before that, a signal killed the process by its default action (an exit by signal, not 0), for
/// instance a pod deleted while it started. So one that lands during start-up is remembered and delivered as soon
/// as the group exists (a request the group also got itself is harmless twice).
///
/// A second signal exits at once. That is safe: nothing uncommitted is lost, recovery at the next start finds
/// what the unfinished batch had already written.
final class ShutdownSignals: Sendable {
    private struct State {
        var received = 0
        var shutdown: (@Sendable () -> Void)?
        var logger: Logger?
    }

    private let state = Mutex(State())
    nonisolated(unsafe) private static var sources: [any DispatchSourceSignal] = []

    static func install() -> ShutdownSignals {
        let signals = ShutdownSignals()
        for signalNumber in [SIGTERM, SIGINT] {
            // As the service group does: the source sees the signal instead of its default action.
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler { signals.received(signalNumber) }
            source.resume()
            sources.append(source)
        }
        return signals
    }

    private func received(_ signalNumber: Int32) {
        let (count, shutdown, logger) = state.withLock { state in
            state.received += 1
            return (state.received, state.shutdown, state.logger)
        }
        guard count == 1 else {
            logger?.warning("second signal: exiting now; the next start recovers the batch in flight")
            exit(128 + signalNumber)
        }
        shutdown?()
    }

    /// From now on the first signal calls `shutdown`; one received before calls it at once.
    func deliver(to shutdown: @escaping @Sendable () -> Void, logger: Logger) {
        let pending = state.withLock { state in
            state.shutdown = shutdown
            state.logger = logger
            return state.received > 0
        }
        if pending { shutdown() }
    }
}
