import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One writer per state directory: an advisory lock (`flock`) on `<state-dir>/mailpush.lock`, held for as
/// long as this object lives. The kernel releases it when the process ends, however it ends (SIGKILL
/// included), so a crash never leaves a stale lock behind.
///
/// `mailpush run` holds it for its whole life; `replay` and `offsets --set` take it for their work, or defer
/// to the process that holds it (docs/exactly-once.md, "One writer per state directory").
public final class StateDirectoryLock: Sendable {
    public static let fileName = "mailpush.lock"

    public enum Attempt: Sendable {
        case acquired(StateDirectoryLock)
        /// Another process holds the lock; `pid` is the holder's process id as it wrote it, when readable.
        case held(pid: Int32?)
    }

    public let path: String
    private let descriptor: Int32

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    deinit {
        // Closing the last descriptor of the open file releases the flock.
        close(descriptor)
    }

    /// Takes the lock without waiting. The directory must exist (opening the `StateStore` creates it).
    public static func tryAcquire(directory: String) throws(StateError) -> Attempt {
        let path = (directory as NSString).appendingPathComponent(fileName)
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw StateError("cannot open lock file \(path): \(String(cString: strerror(errno)))")
        }
        if flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            let holder = Self.readPid(descriptor)
            close(descriptor)
            guard code == EWOULDBLOCK else {
                throw StateError("cannot lock \(path): \(String(cString: strerror(code)))")
            }
            return .held(pid: holder)
        }
        // The holder's pid, for the message another process prints; only informative (the lock is the flock).
        let text = Array("\(getpid())\n".utf8)
        if ftruncate(descriptor, 0) == 0 {
            _ = text.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        }
        return .acquired(StateDirectoryLock(path: path, descriptor: descriptor))
    }

    /// True while some process holds the lock of `directory` (a snapshot: it may change right after).
    public static func isHeld(directory: String) throws(StateError) -> Bool {
        switch try tryAcquire(directory: directory) {
        case .acquired: false // released again as the temporary lock object goes away
        case .held: true
        }
    }

    private static func readPid(_ descriptor: Int32) -> Int32? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: buffer[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }
}
