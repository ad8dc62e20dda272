import Dispatch

extension DispatchQueue {
    /// Runs a blocking librdkafka call on this (serial, hence overcommitting) queue's own thread instead of
    /// on Swift's cooperative pool, and awaits its result.
    func run<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            self.async { continuation.resume(returning: body()) }
        }
    }

    func run<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) async throws(KafkaError) -> T {
        try await run { Result(catching: body) }.get()
    }
}

extension ContinuousClock.Instant {
    /// Time left until this deadline, never negative.
    var remaining: Duration { max(.zero, self - ContinuousClock.now) }
}
