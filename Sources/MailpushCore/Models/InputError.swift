/// Why an input record (event, device registration or address key) cannot be used.
///
/// `reason` is one line a person can act on; it is used verbatim as the `mailpush-error`
/// header of dead letters and in log lines. `category` is the dead-letter reason an event with this
/// error gets (the metric label).
public struct InputError: Error, CustomStringConvertible, Sendable, Equatable {
    public let reason: String
    public let category: Category

    public init(reason: String, category: Category) {
        self.reason = reason
        self.category = category
    }

    public var description: String { reason }

    public typealias Category = DeadLetterReason

    static func invalidJSON(_ error: JSONParseError) -> InputError {
        InputError(reason: error.description, category: Category.invalidJSON)
    }

    static func missingField(_ path: String) -> InputError {
        InputError(reason: "missing field \(path)", category: Category.missingField)
    }

    static func invalidField(_ path: String, _ requirement: String) -> InputError {
        InputError(reason: "field \(path) \(requirement)", category: Category.invalidField)
    }

    /// A value of the right type that breaks a limit of CONTRACT §2/§3 (`invalid field owner: …`).
    static func invalidValue(_ path: String, _ problem: String) -> InputError {
        InputError(reason: "invalid field \(path): \(problem)", category: Category.invalidField)
    }
}

/// The bounds of CONTRACT §2 and §3 that keep one tenant's input from costing the others.
public enum InputLimits {
    /// Ids (`owner`, `emailAddressId`, `sudoId`, `messageId`, `folderId`, `deviceId`, an address key's `keyId`).
    public static let maxIdBytes = 256
    /// `pushToken`, and a com method's `value`.
    public static let maxTokenBytes = 4096
    /// Items in one device's `filter` list.
    public static let maxFilterItems = 1000
    /// The UTF-8 bytes of all `rule` strings of one device together.
    public static let maxRuleTextBytes = 64 * 1024
}

/// Renders a value from the input for an error line: JSON-quoted (so control characters and
/// newlines cannot break the one-line rule) and cut to a readable length.
///
/// Cut by Unicode scalars, not characters: one character can hold thousands of combining marks, and a
/// hostile value would otherwise be copied whole into every dead letter's header and log line.
public func quotedForError(_ value: String, limit: Int = 64) -> String {
    var out: [UInt8] = []
    JSONWriter.appendQuoted(value.cut(afterScalars: limit), to: &out)
    return String(decoding: out, as: UTF8.self).withInvisiblesEscaped
}

extension String {
    /// The first `limit` Unicode scalars, followed by `…` when there were more.
    public func cut(afterScalars limit: Int) -> String {
        let head = unicodeScalars.prefix(limit)
        return head.endIndex == unicodeScalars.endIndex ? self : String(head) + "…"
    }

    /// This text with every character a header, a log line or a terminal must not get raw written as `\uXXXX`:
    /// the controls (JSON leaves DEL and the C1 controls raw; a newline would start a forged log line),
    /// invisible format characters (the bidirectional overrides that reorder what a person reads, zero-width
    /// spaces) and the line and paragraph separators. Inside a JSON string the escapes keep the value intact.
    public var withInvisiblesEscaped: String {
        guard unicodeScalars.contains(where: \.needsEscapeToBeSeen) else { return self }
        var escaped = ""
        for scalar in unicodeScalars {
            guard scalar.needsEscapeToBeSeen else {
                escaped.unicodeScalars.append(scalar)
                continue
            }
            for unit in String(scalar).utf16 {
                let hex = String(unit, radix: 16)
                escaped += "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
            }
        }
        return escaped
    }
}

extension Unicode.Scalar {
    fileprivate var needsEscapeToBeSeen: Bool {
        switch properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator: true
        default: false
        }
    }
}
