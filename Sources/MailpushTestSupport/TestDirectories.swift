import Foundation

/// State directories for tests, all inside one directory of the test process that goes when the process exits.
///
/// A `swift test` run makes a few dozen state directories; left in the system's temporary directory, every run
/// added them to those of the runs before. A run that dies leaves its directory behind: the next run removes it.
public enum TestDirectories {
    /// A path for a new directory (not created: a `StateStore` creates its own), named after `prefix`.
    public static func path(_ prefix: String) -> String {
        root.appendingPathComponent("\(prefix)-\(UUID().uuidString)").path
    }

    /// A new, empty directory named after `prefix`.
    public static func make(_ prefix: String) throws -> String {
        let path = path(prefix)
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    private static let rootPrefix = "mailpush-tests-"

    private static let root: URL = {
        let temporary = FileManager.default.temporaryDirectory
        removeDirectoriesOfEndedRuns(in: temporary)
        let root = temporary.appendingPathComponent("\(rootPrefix)\(getpid())")
        try? FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(at: TestDirectories.root) }
        return root
    }()

    private static func removeDirectoriesOfEndedRuns(in temporary: URL) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: temporary.path)) ?? []
        for name in names where name.hasPrefix(rootPrefix) {
            guard let pid = Int32(name.dropFirst(rootPrefix.count)), kill(pid, 0) != 0, errno == ESRCH else { continue }
            try? FileManager.default.removeItem(at: temporary.appendingPathComponent(name))
        }
    }
}
