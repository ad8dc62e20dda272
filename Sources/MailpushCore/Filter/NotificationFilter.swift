public enum FilterAction: String, Sendable, Hashable {
    case enable = "ENABLE"
    case disable = "DISABLE"
}

/// One item of a Sudo Notification Service filter list (`UpdateSettingsInput.filter`).
public struct FilterItem: Sendable, Hashable {
    /// The service whose notifications the item is about; only `emService` items count here.
    public var serviceName: String
    public var action: FilterAction
    /// A JSON-logic rule, as the JSON text the client sent.
    public var rule: String
    public var enableMeta: String?

    public init(serviceName: String, action: FilterAction, rule: String, enableMeta: String? = nil) {
        self.serviceName = serviceName
        self.action = action
        self.rule = rule
        self.enableMeta = enableMeta
    }
}

/// The `meta` object a rule sees (CONTRACT §4).
public struct FilterMeta: Sendable, Hashable {
    public var type: String
    public var emailAddressId: String
    public var sudoId: String
    public var folderId: String
    /// The id of the address's sealing key; absent when the address has none.
    public var keyId: String?

    public init(
        type: String = EmailReceived.messageReceivedType, emailAddressId: String, sudoId: String,
        folderId: String, keyId: String? = nil
    ) {
        self.type = type
        self.emailAddressId = emailAddressId
        self.sudoId = sudoId
        self.folderId = folderId
        self.keyId = keyId
    }

    public init(event: EmailReceived, keyId: String?) {
        self.init(
            type: event.type, emailAddressId: event.emailAddressId, sudoId: event.sudoId,
            folderId: event.folderId, keyId: keyId)
    }

    enum Field: String, Sendable {
        case type, emailAddressId, sudoId, folderId, keyId
    }

    subscript(field: Field) -> String? {
        switch field {
        case .type: return type
        case .emailAddressId: return emailAddressId
        case .sudoId: return sudoId
        case .folderId: return folderId
        case .keyId: return keyId
        }
    }

    var jsonValue: JSONValue {
        var members: [String: JSONValue] = [
            "type": .string(type), "emailAddressId": .string(emailAddressId),
            "sudoId": .string(sudoId), "folderId": .string(folderId),
        ]
        if let keyId { members["keyId"] = .string(keyId) }
        return .object(members)
    }
}

/// A device's filter list, compiled once when the registration is decoded (CONTRACT §4).
public struct NotificationFilter: Sendable {
    public static let emailServiceName = "emService"

    /// `emService` rules that do not parse or use an unsupported operator (they never match).
    public let invalidRuleCount: Int

    /// The decision steps, in list order: valid `emService` items minus catch-alls, with
    /// context-free rules folded to a constant.
    private let steps: [Step]
    /// Whether an ENABLE item true for every context exists; it decides only after all steps.
    public let hasCatchAll: Bool

    private struct Step: Sendable {
        var action: FilterAction
        var rule: Rule
    }

    private enum Rule: Sendable {
        case always
        case expression(LogicExpression)
    }

    /// Compiles `items`; they are not kept (a registration at the limits holds 1,000 of them, about 170 KB decoded,
    /// which the service would carry for every cached device and never read).
    public init(items: [FilterItem]) {
        var steps: [Step] = []
        var invalid = 0
        var catchAll = false
        for item in items where item.serviceName == Self.emailServiceName {
            guard let expression = Self.compile(item.rule) else {
                invalid += 1
                continue
            }
            if expression.isConstant {
                // Rules without `var` have one value for every context, so decide them now.
                // A true ENABLE is a catch-all (`{"==":[1,1]}` in any spelling) and moves to the
                // end; a true DISABLE keeps its place; a false rule can never decide anything.
                guard JSLogic.truthy(expression.evaluate(Self.placeholderMeta)) else { continue }
                if item.action == .enable {
                    catchAll = true
                } else {
                    steps.append(Step(action: .disable, rule: .always))
                }
            } else {
                steps.append(Step(action: item.action, rule: .expression(expression)))
            }
        }
        // Nothing after an unconditional step can ever be reached.
        if let i = steps.firstIndex(where: { if case .always = $0.rule { true } else { false } }) {
            steps.removeSubrange((i + 1)...)
            catchAll = false
        }
        self.steps = steps
        self.invalidRuleCount = invalid
        self.hasCatchAll = catchAll
    }

    /// Whether the device wants a notification for an email with this meta.
    public func wantsNotification(for meta: FilterMeta) -> Bool {
        for step in steps {
            switch step.rule {
            case .always:
                return step.action == .enable
            case .expression(let e):
                if e.matches(meta) { return step.action == .enable }
            }
        }
        return hasCatchAll
    }

    /// Parses and compiles a rule string; `nil` when it is not usable. Rules are compared as
    /// parsed JSON, so whitespace and key order never matter.
    static func compile(_ rule: String) -> LogicExpression? {
        guard let json = try? JSONValue.parse(rule) else { return nil }
        return try? LogicExpression.compile(json)
    }

    private static let placeholderMeta = FilterMeta(type: "", emailAddressId: "", sudoId: "", folderId: "")
}
