import Foundation
import MailpushCore

/// The independent test vectors of the contract (docs/contract.md), carried by this target as resources in
/// `Vectors/` so that a clone of the repository tests itself with nothing beside it.
public enum SpecVectors {
    public struct NotFound: Error, CustomStringConvertible {
        public let name: String
        public var description: String { "test vector file \(name) is missing from MailpushTestSupport's Vectors resources" }
    }

    /// Parsed `Vectors/<name>`, e.g. `filters.json`.
    public static func load(_ name: String) throws -> JSONValue {
        let url = try url(of: name)
        let data = try Data(contentsOf: url)
        return try JSONValue.parse([UInt8](data))
    }

    public static func url(of name: String) throws -> URL {
        let base = (name as NSString).deletingPathExtension
        let ext = (name as NSString).pathExtension
        guard let url = Bundle.module.url(forResource: base, withExtension: ext, subdirectory: "Vectors") else {
            throw NotFound(name: name)
        }
        return url
    }
}
