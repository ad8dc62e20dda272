import Foundation
import MailpushCore

/// The independent test vectors in `shared/spec/vectors/` (beside the repository, in the
/// developer layout and in CI's). Set `MAILPUSH_SPEC_DIR` to the `spec` folder to override.
public enum SpecVectors {
    public struct NotFound: Error, CustomStringConvertible {
        public let searched: [String]
        public var description: String {
            "spec vectors not found; set MAILPUSH_SPEC_DIR to shared/spec (searched: \(searched.joined(separator: ", ")))"
        }
    }

    /// Parsed `vectors/<name>`, e.g. `filters.json`.
    public static func load(_ name: String) throws -> JSONValue {
        let url = try directory().appendingPathComponent(name)
        let data = try Data(contentsOf: url)
        return try JSONValue.parse([UInt8](data))
    }

    public static func directory(startingAt file: String = #filePath) throws -> URL {
        var searched: [String] = []
        let fm = FileManager.default
        if let env = ProcessInfo.processInfo.environment["MAILPUSH_SPEC_DIR"] {
            let url = URL(fileURLWithPath: env).appendingPathComponent("vectors")
            if fm.fileExists(atPath: url.appendingPathComponent("filters.json").path) { return url }
            searched.append(url.path)
        }
        var dir = URL(fileURLWithPath: file).deletingLastPathComponent()
        while dir.path != "/" && !dir.path.isEmpty {
            let url = dir.appendingPathComponent("shared/spec/vectors")
            if fm.fileExists(atPath: url.appendingPathComponent("filters.json").path) { return url }
            searched.append(dir.path)
            dir = dir.deletingLastPathComponent()
        }
        throw NotFound(searched: searched)
    }
}
