/// A JSON-logic rule compiled once, restricted to the operators of CONTRACT §4:
/// `== != === !== ! !! and or in var`.
///
/// Semantics follow the reference implementation (jsonlogic.com / json-logic-js): JavaScript
/// truthiness except that an empty array is false, JavaScript loose equality for `==`/`!=`,
/// `and`/`or` return operand values and short-circuit, `in` is substring search on strings and
/// strict membership on arrays, and `var` takes a dotted path and an optional default.
///
/// Deliberate differences, all on inputs that no Sudo client writes: a missing operand is
/// `null` rather than JavaScript `undefined`, and two arrays/objects are never `==` (JavaScript
/// compares their identity). Objects that are not a single-operator object are rejected instead
/// of being treated as data, so that a malformed rule can never match.
indirect enum LogicExpression: Sendable {
    case literal(JSONValue)
    /// `{"var":"meta.<field>"}` — the only lookups Sudo rules use, resolved without allocating.
    case metaField(FilterMeta.Field, fallback: LogicExpression?)
    /// Any other `var`: the path is itself an expression in JSON-logic.
    case variable(path: LogicExpression?, fallback: LogicExpression?)
    case array([LogicExpression])
    case looseEquals(LogicExpression, LogicExpression, negated: Bool)
    case strictEquals(LogicExpression, LogicExpression, negated: Bool)
    case not(LogicExpression)
    case truthy(LogicExpression)
    case and([LogicExpression])
    case or([LogicExpression])
    case contains(needle: LogicExpression, haystack: LogicExpression)

    /// Why a rule cannot be compiled. Rules are not logged (they may hold ids), so this is only
    /// for tests and debugging.
    enum CompileError: Error {
        case unsupportedOperator(String)
        case notAnOperation
        case nestedTooDeeply
    }

    /// How deeply a rule may nest (operations and arrays alike). Sudo rules nest three or four
    /// levels; the bound keeps compiling, evaluating and printing a rule (all recursive) far from
    /// the stack limit of a concurrency thread, whatever a registration holds.
    static let maxNestingDepth = 32

    static func compile(_ json: JSONValue) throws(CompileError) -> LogicExpression {
        try compile(json, depth: 1)
    }

    private static func compile(_ json: JSONValue, depth: Int) throws(CompileError) -> LogicExpression {
        if depth > maxNestingDepth { throw .nestedTooDeeply }
        switch json {
        case .null, .bool, .number, .string:
            return .literal(json)
        case .array(let elements):
            var compiled: [LogicExpression] = []
            compiled.reserveCapacity(elements.count)
            for e in elements { compiled.append(try compile(e, depth: depth + 1)) }
            if compiled.allSatisfy({ if case .literal = $0 { true } else { false } }) {
                return .literal(json)
            }
            return .array(compiled)
        case .object(let members):
            guard members.count == 1, let (op, rawArgs) = members.first else { throw .notAnOperation }
            // JSON-logic: a non-array operand list is a single operand.
            let rawList: [JSONValue]
            if case .array(let list) = rawArgs { rawList = list } else { rawList = [rawArgs] }
            if op == "var" { return try compileVar(rawList, depth: depth + 1) }
            var args: [LogicExpression] = []
            args.reserveCapacity(rawList.count)
            for a in rawList { args.append(try compile(a, depth: depth + 1)) }
            func arg(_ i: Int) -> LogicExpression { i < args.count ? args[i] : .literal(.null) }
            switch op {
            case "==": return .looseEquals(arg(0), arg(1), negated: false)
            case "!=": return .looseEquals(arg(0), arg(1), negated: true)
            case "===": return .strictEquals(arg(0), arg(1), negated: false)
            case "!==": return .strictEquals(arg(0), arg(1), negated: true)
            case "!": return .not(arg(0))
            case "!!": return .truthy(arg(0))
            case "and": return .and(args)
            case "or": return .or(args)
            case "in": return .contains(needle: arg(0), haystack: arg(1))
            default: throw .unsupportedOperator(op)
            }
        }
    }

    private static func compileVar(_ rawList: [JSONValue], depth: Int) throws(CompileError) -> LogicExpression {
        let path = try rawList.first.map { v throws(CompileError) in try compile(v, depth: depth) }
        let fallback = try rawList.dropFirst().first.map { v throws(CompileError) in try compile(v, depth: depth) }
        if case .literal(.string(let p))? = path, p.hasPrefix("meta."),
            let field = FilterMeta.Field(rawValue: String(p.dropFirst(5)))
        {
            return .metaField(field, fallback: fallback)
        }
        return .variable(path: path, fallback: fallback)
    }

    /// True when the value cannot depend on the context (no `var` anywhere).
    var isConstant: Bool {
        switch self {
        case .literal: return true
        case .metaField, .variable: return false
        case .array(let es), .and(let es), .or(let es): return es.allSatisfy(\.isConstant)
        case .looseEquals(let a, let b, _), .strictEquals(let a, let b, _), .contains(let a, let b):
            return a.isConstant && b.isConstant
        case .not(let e), .truthy(let e): return e.isConstant
        }
    }

    // MARK: - Evaluation

    func evaluate(_ meta: FilterMeta) -> JSONValue {
        switch self {
        case .literal(let v):
            return v
        case .metaField(let field, let fallback):
            if let s = meta[field] { return .string(s) }
            return fallback?.evaluate(meta) ?? .null
        case .variable(let path, let fallback):
            return Self.lookup(path: path?.evaluate(meta), in: meta) ?? fallback?.evaluate(meta) ?? .null
        case .array(let es):
            return .array(es.map { $0.evaluate(meta) })
        case .looseEquals(let a, let b, let negated):
            return .bool(JSLogic.looseEquals(a.evaluate(meta), b.evaluate(meta)) != negated)
        case .strictEquals(let a, let b, let negated):
            return .bool(JSLogic.strictEquals(a.evaluate(meta), b.evaluate(meta)) != negated)
        case .not(let e):
            return .bool(!JSLogic.truthy(e.evaluate(meta)))
        case .truthy(let e):
            return .bool(JSLogic.truthy(e.evaluate(meta)))
        case .and(let es):
            var current = JSONValue.null
            for e in es {
                current = e.evaluate(meta)
                if !JSLogic.truthy(current) { return current }
            }
            return current
        case .or(let es):
            var current = JSONValue.null
            for e in es {
                current = e.evaluate(meta)
                if JSLogic.truthy(current) { return current }
            }
            return current
        case .contains(let needle, let haystack):
            return .bool(JSLogic.contains(needle.evaluate(meta), in: haystack.evaluate(meta)))
        }
    }

    func matches(_ meta: FilterMeta) -> Bool {
        JSLogic.truthy(evaluate(meta))
    }

    /// json-logic-js `var`: `null`/`""`/absent path = the whole data; otherwise walk the dotted
    /// path. `nil` means "not found" (the default then applies).
    private static func lookup(path: JSONValue?, in meta: FilterMeta) -> JSONValue? {
        let data = JSONValue.object(["meta": meta.jsonValue])
        guard let path, !path.isNull else { return data }
        let text = JSLogic.toString(path)
        if text.isEmpty { return data }
        var current: JSONValue = data
        for component in text.split(separator: ".", omittingEmptySubsequences: false) {
            switch current {
            case .object(let members):
                guard let next = members[String(component)] else { return nil }
                current = next
            case .array(let elements):
                guard let i = Int(component), elements.indices.contains(i) else { return nil }
                current = elements[i]
            default:
                return nil
            }
        }
        return current
    }
}

/// The JavaScript coercions JSON-logic inherits.
enum JSLogic {
    /// json-logic-js `truthy`: JavaScript truthiness, except that `[]` is false.
    static func truthy(_ v: JSONValue) -> Bool {
        switch v {
        case .null: return false
        case .bool(let b): return b
        case .number(let n):
            let d = n.doubleValue
            return d != 0 && !d.isNaN
        case .string(let s): return !s.isEmpty
        case .array(let a): return !a.isEmpty
        case .object: return true
        }
    }

    /// JavaScript `===` on JSON values. Arrays/objects are distinct objects, hence never equal.
    static func strictEquals(_ a: JSONValue, _ b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return numbersEqual(x, y)
        case (.string(let x), .string(let y)): return sameCodeUnits(x, y)
        default: return false
        }
    }

    /// JavaScript compares strings code unit by code unit; Swift's `==` would also equate
    /// canonically equivalent strings ("é" and "e\u{301}"), which JavaScript does not.
    static func sameCodeUnits(_ x: String, _ y: String) -> Bool {
        x.utf8.elementsEqual(y.utf8)
    }

    /// JavaScript `==` (Abstract Equality Comparison) on JSON values.
    static func looseEquals(_ a: JSONValue, _ b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.null, _), (_, .null): return false
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return numbersEqual(x, y)
        case (.string(let x), .string(let y)): return sameCodeUnits(x, y)
        case (.array, .array), (.array, .object), (.object, .array), (.object, .object): return false
        case (.number(let n), .string(let s)), (.string(let s), .number(let n)):
            return n.doubleValue == toNumber(s)
        case (.bool(let x), let other), (let other, .bool(let x)):
            return looseEquals(.number(JSONNumber(x ? 1 : 0)), other)
        case (.array, _), (.object, _):
            return looseEquals(.string(toString(a)), b)
        case (_, .array), (_, .object):
            return looseEquals(a, .string(toString(b)))
        }
    }

    /// json-logic-js `in`: substring on strings, strict membership on arrays, else false.
    static func contains(_ needle: JSONValue, in haystack: JSONValue) -> Bool {
        switch haystack {
        case .string(let s):
            // String.prototype.indexOf works on code units, not grapheme clusters, so compare
            // UTF-8 bytes (Swift's `contains` would refuse to match inside a cluster).
            return containsBytes(Array(s.utf8), Array(toString(needle).utf8))
        case .array(let elements):
            return elements.contains { strictEquals($0, needle) }
        default:
            return false
        }
    }

    /// JavaScript `String(value)`.
    static func toString(_ v: JSONValue) -> String {
        switch v {
        case .null: return "null"
        case .bool(let b): return b ? "true" : "false"
        case .number(let n):
            if let i = n.int64Value, abs(n.doubleValue) < 1e21 { return String(i) }
            return n.doubleValue.description
        case .string(let s): return s
        case .array(let a):
            return a.map { e -> String in
                if case .null = e { return "" }
                return toString(e)
            }.joined(separator: ",")
        case .object: return "[object Object]"
        }
    }

    /// JavaScript `Number(string)`: trimmed, empty is 0, unparsable is NaN.
    static func toNumber(_ s: String) -> Double {
        let trimmed = s.trimmingJSWhitespace()
        if trimmed.isEmpty { return 0 }
        if let d = Double(trimmed) { return d }
        return .nan
    }

    private static func numbersEqual(_ a: JSONNumber, _ b: JSONNumber) -> Bool {
        // JavaScript numbers are doubles; NaN never occurs in parsed JSON.
        a == b || a.doubleValue == b.doubleValue
    }

    /// Knuth–Morris–Pratt: O(haystack + needle) whatever the bytes. The naive scan is
    /// O(haystack × needle) on inputs like `"a"*200000+"b"` in `"a"*400000`, which one
    /// registration could use to stall every instance.
    static func containsBytes(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        if needle.isEmpty { return true }
        if needle.count > haystack.count { return false }
        // failure[i]: length of the longest proper border of needle[0...i].
        var failure = [Int](repeating: 0, count: needle.count)
        var k = 0
        for i in 1..<needle.count {
            while k > 0 && needle[i] != needle[k] { k = failure[k - 1] }
            if needle[i] == needle[k] { k += 1 }
            failure[i] = k
        }
        var matched = 0
        for byte in haystack {
            while matched > 0 && byte != needle[matched] { matched = failure[matched - 1] }
            if byte == needle[matched] { matched += 1 }
            if matched == needle.count { return true }
        }
        return false
    }
}

extension String {
    fileprivate func trimmingJSWhitespace() -> Substring {
        let isSpace: (Character) -> Bool = { $0.isWhitespace }
        guard let first = firstIndex(where: { !isSpace($0) }) else { return "" }
        let last = lastIndex(where: { !isSpace($0) })!
        return self[first...last]
    }
}
