/// A parsed JSON document.
///
/// Objects are unordered on the way in (inputs never depend on key order); use `JSONWriter`
/// when key order matters on the way out.
///
/// Not `indirect`: arrays and objects already keep their elements on the heap; boxing every value besides
/// was an allocation per string, number and bool of a document (about a tenth of decoding an event).
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])
}

/// A JSON number that keeps integers exact.
///
/// Epoch milliseconds and similar values must survive a round trip bit for bit, so literals
/// without fraction or exponent that fit in `Int64` are stored as integers; everything else is
/// a `Double`. Equality is numeric (`1 == 1.0`), as JSON itself has only one number type.
public struct JSONNumber: Sendable, Hashable, CustomStringConvertible {
    public enum Storage: Sendable, Hashable {
        case int(Int64)
        case double(Double)
    }

    public let storage: Storage

    public init(_ value: Int64) { storage = .int(value) }
    public init(_ value: Int) { storage = .int(Int64(value)) }
    public init(_ value: Double) { storage = .double(value) }

    /// The value as an exact integer, if it is one (`3`, `3.0`, `3e0`), otherwise `nil`.
    public var int64Value: Int64? {
        switch storage {
        case .int(let i): return i
        case .double(let d): return Int64(exactly: d)
        }
    }

    public var doubleValue: Double {
        switch storage {
        case .int(let i): return Double(i)
        case .double(let d): return d
        }
    }

    public static func == (lhs: JSONNumber, rhs: JSONNumber) -> Bool {
        switch (lhs.storage, rhs.storage) {
        case (.int(let a), .int(let b)): return a == b
        case (.double(let a), .double(let b)): return a == b
        case (.int(let i), .double(let d)), (.double(let d), .int(let i)):
            // Compare exactly: a large Int64 may round to a Double it is not equal to.
            return Int64(exactly: d) == i
        }
    }

    public func hash(into hasher: inout Hasher) {
        // Equal numbers must hash alike whatever their storage; distinct integers that round to
        // the same Double merely collide.
        hasher.combine(doubleValue)
    }

    public var description: String {
        switch storage {
        case .int(let i): return String(i)
        case .double(let d): return d.description
        }
    }
}

extension JSONValue {
    /// The member `key` of an object, or `nil` for a missing member or a non-object.
    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    public var numberValue: JSONNumber? {
        if case .number(let n) = self { return n }
        return nil
    }

    public var arrayValue: [JSONValue]? {
        if case .array(let a) = self { return a }
        return nil
    }

    public var objectValue: [String: JSONValue]? {
        if case .object(let o) = self { return o }
        return nil
    }

    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// Compact serialization; object keys are sorted so the output is deterministic.
    public var serialized: [UInt8] {
        var writer = JSONWriter()
        writer.value(self)
        return writer.bytes
    }
}
