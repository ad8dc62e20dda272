import Dispatch
import Synchronization

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

    /// Starts a blocking librdkafka call on this queue's thread now, to be awaited later (`Answer.value`): a
    /// task started to make it would have to wait for a cooperative thread first.
    func start<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) -> Answer<T> {
        let answer = Answer<T>()
        self.async { answer.set(Result(catching: body)) }
        return answer
    }
}

/// The result of a call started with `DispatchQueue.start`, once it is there.
public final class Answer<T: Sendable>: Sendable {
    private struct State {
        var result: Result<T, KafkaError>?
        var waiting: [CheckedContinuation<Result<T, KafkaError>, Never>] = []
    }
    private let state = Mutex(State())

    fileprivate init() {}

    fileprivate func set(_ result: Result<T, KafkaError>) {
        let waiting = state.withLock { state in
            state.result = result
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume(returning: result) }
    }

    public func value() async throws(KafkaError) -> T {
        try await withCheckedContinuation { continuation in
            let result = state.withLock { state in
                if state.result == nil { state.waiting.append(continuation) }
                return state.result
            }
            if let result { continuation.resume(returning: result) }
        }.get()
    }
}

extension ContinuousClock.Instant {
    /// Time left until this deadline, never negative.
    var remaining: Duration { max(.zero, self - ContinuousClock.now) }
}
