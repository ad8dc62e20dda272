/// Reads typed fields out of a decoded JSON object and produces the `InputError` reasons of
/// CONTRACT §1 ("missing field from.emailAddress", "field sentAtEpochMs must be an integer").
///
/// A member that is absent or `null` counts as missing: producers that write `null` for an
/// unknown value mean the same thing as leaving it out.
struct FieldReader {
    let members: [String: JSONValue]
    /// Dotted path of this object inside the document, "" for the root ("from." for `from`).
    let prefix: String

    init(_ members: [String: JSONValue], prefix: String = "") {
        self.members = members
        self.prefix = prefix
    }

    /// Parses `bytes` and requires a top-level object.
    static func root(_ bytes: [UInt8], what: String) throws(InputError) -> FieldReader {
        let value: JSONValue
        do {
            value = try JSONValue.parse(bytes)
        } catch {
            throw InputError.invalidJSON(error)
        }
        guard case .object(let members) = value else {
            throw InputError(reason: "\(what) must be a JSON object", category: InputError.Category.invalidJSON)
        }
        return FieldReader(members)
    }

    func path(_ name: String) -> String { prefix + name }

    /// The member, with `null` folded into "absent".
    func member(_ name: String) -> JSONValue? {
        switch members[name] {
        case nil, .null?: return nil
        case let value?: return value
        }
    }

    func string(_ name: String) throws(InputError) -> String {
        guard let value = member(name) else { throw .missingField(path(name)) }
        guard case .string(let s) = value else { throw .invalidField(path(name), "must be a string") }
        return s
    }

    /// Ids: an empty id would silently collide (job ids, partition keys), so it is an error.
    func nonEmptyString(_ name: String) throws(InputError) -> String {
        let s = try string(name)
        if s.isEmpty { throw .invalidField(path(name), "must not be empty") }
        return s
    }

    /// An id (CONTRACT §2, §3, §5): non-empty, at most `InputLimits.maxIdBytes` UTF-8 bytes, no U+0000.
    /// Ids are joined with NUL into dedupe keys and job ids, so a NUL inside one would let two
    /// different emails share a key; the length bound keeps keys, logs and headers small.
    func id(_ name: String) throws(InputError) -> String {
        let s = try nonEmptyString(name)
        let bytes = s.utf8.count
        if bytes > InputLimits.maxIdBytes {
            throw .invalidValue(path(name), "\(bytes) UTF-8 bytes, at most \(InputLimits.maxIdBytes) allowed")
        }
        if s.utf8.contains(0) { throw .invalidValue(path(name), "contains U+0000, which ids may not hold") }
        return s
    }

    func optionalString(_ name: String) throws(InputError) -> String? {
        guard let value = member(name) else { return nil }
        guard case .string(let s) = value else { throw .invalidField(path(name), "must be a string or null") }
        return s
    }

    func bool(_ name: String) throws(InputError) -> Bool {
        guard let value = member(name) else { throw .missingField(path(name)) }
        guard case .bool(let b) = value else { throw .invalidField(path(name), "must be true or false") }
        return b
    }

    /// Accepts integral numbers however written (`1718330537000`, `1.718330537e12`).
    func int64(_ name: String) throws(InputError) -> Int64 {
        guard let value = member(name) else { throw .missingField(path(name)) }
        guard case .number(let n) = value, let i = n.int64Value else {
            throw .invalidField(path(name), "must be an integer")
        }
        return i
    }

    func object(_ name: String) throws(InputError) -> FieldReader {
        guard let value = member(name) else { throw .missingField(path(name)) }
        guard case .object(let o) = value else { throw .invalidField(path(name), "must be an object") }
        return FieldReader(o, prefix: path(name) + ".")
    }

    func optionalObject(_ name: String) throws(InputError) -> FieldReader? {
        guard let value = member(name) else { return nil }
        guard case .object(let o) = value else { throw .invalidField(path(name), "must be an object or null") }
        return FieldReader(o, prefix: path(name) + ".")
    }
}
