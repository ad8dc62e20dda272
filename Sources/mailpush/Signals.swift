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
