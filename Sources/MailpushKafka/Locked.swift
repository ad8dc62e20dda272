import Foundation

/// A value behind a lock (NSLock rather than `Mutex`, which needs macOS 15).
/// `@unchecked Sendable` is sound: `value` is only reached through `withLock`.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
