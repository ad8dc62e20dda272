/// Where a device's push jobs go.
public enum PushTarget: Sendable, Hashable {
    case apns(token: String)
    case fcm(token: String)
    /// Sponsor com method 3: forwarded to the configured sponsor webhook.
    case webhook(sponseeDetails: String)

    /// Whether its jobs carry sealed email metadata (APNs and FCM), and so need the address's key.
    public var isSealed: Bool {
        if case .webhook = self { false } else { true }
    }
}

/// DeviceRegistration v1 (CONTRACT §3), with its filter already compiled.
public struct DeviceRegistration: Sendable {
    public var deviceId: String
    public var owner: String
    public var bundleId: String?
    public var target: PushTarget
    public var filter: NotificationFilter

    public init(deviceId: String, owner: String, bundleId: String? = nil, target: PushTarget, filter: NotificationFilter) {
        self.deviceId = deviceId
        self.owner = owner
        self.bundleId = bundleId
        self.target = target
        self.filter = filter
    }

    /// `ios`, `android` (also com method 4) or `webhook` (com method 3).
    public var platform: String {
        switch target {
        case .apns: return "ios"
        case .fcm: return "android"
        case .webhook: return "webhook"
        }
    }

    /// Com method types of the sponsor push-forwarding scheme.
    public enum ComMethodType {
        public static let sponsorWebhook: Int64 = 3
        public static let fcm: Int64 = 4
    }

    /// Decodes a record value of `mailpush.devices` (a null value, unregister, is the caller's).
    ///
    /// A usable `platform` + `pushToken` wins; otherwise a `comMethod` is used. Filter items
    /// must be well-formed objects (the whole registration is rejected otherwise, so the device
    /// keeps its previous one); their rules are only checked when compiled, and a bad rule
    /// merely never matches.
    public static func decode(_ bytes: [UInt8]) throws(InputError) -> DeviceRegistration {
        let r = try FieldReader.root(bytes, what: "device registration")
        let deviceId = try r.id("deviceId")
        let owner = try r.id("owner")
        try checkTokenLimits(r)
        let bundleId = try r.optionalString("bundleId")
        let target = try decodeTarget(r)
        let items = try decodeFilter(r)
        return DeviceRegistration(
            deviceId: deviceId, owner: owner, bundleId: bundleId,
            target: target, filter: NotificationFilter(items: items))
    }

    /// The filter items of a registration, in list order, as `decode` reads them (the decoded registration keeps
    /// only their compiled form).
    public static func decodeFilterItems(_ bytes: [UInt8]) throws(InputError) -> [FilterItem] {
        try decodeFilter(FieldReader.root(bytes, what: "device registration"))
    }

    /// Over-long tokens reject the whole registration, before the fallback from
    /// `platform`/`pushToken` to `comMethod` could hide one (CONTRACT §3 limits).
    private static func checkTokenLimits(_ r: FieldReader) throws(InputError) {
        func check(_ value: JSONValue?, _ path: String) throws(InputError) {
            guard case .string(let s)? = value else { return }
            let bytes = s.utf8.count
            if bytes > InputLimits.maxTokenBytes {
                throw .invalidValue(path, "\(bytes) UTF-8 bytes, at most \(InputLimits.maxTokenBytes) allowed")
            }
        }
        try check(r.member("pushToken"), "pushToken")
        if case .object(let comMethod)? = r.member("comMethod") {
            try check(comMethod["value"], "comMethod.value")
        }
    }

    private static func decodeTarget(_ r: FieldReader) throws(InputError) -> PushTarget {
        let comMethod = try r.optionalObject("comMethod")
        if r.member("platform") != nil || r.member("pushToken") != nil {
            do {
                return try decodePlatformTarget(r)
            } catch {
                // An unusable platform/pushToken pair is only an error when there is no
                // com method to fall back on.
                guard let comMethod else { throw error }
                return try decodeComMethod(comMethod)
            }
        }
        guard let comMethod else {
            throw InputError(reason: "missing field platform (or comMethod)", category: InputError.Category.missingField)
        }
        return try decodeComMethod(comMethod)
    }

    private static func decodePlatformTarget(_ r: FieldReader) throws(InputError) -> PushTarget {
        let platform = try r.string("platform")
        let token = try r.nonEmptyString("pushToken")
        switch platform.lowercased() {
        case "ios": return .apns(token: token)
        case "android": return .fcm(token: token)
        default:
            throw InputError(
                reason: "unsupported platform \(quotedForError(platform)) (expected ios or android)",
                category: InputError.Category.unsupportedType)
        }
    }

    private static func decodeComMethod(_ comMethod: FieldReader) throws(InputError) -> PushTarget {
        let type = try comMethod.int64("type")
        let value = try comMethod.nonEmptyString("value")
        switch type {
        case ComMethodType.fcm:
            let prefix = "FCM:"
            guard value.hasPrefix(prefix), value.count > prefix.count else {
                throw .invalidField("comMethod.value", "must be \"FCM:<token>\" for type 4")
            }
            return .fcm(token: String(value.dropFirst(prefix.count)))
        case ComMethodType.sponsorWebhook:
            return .webhook(sponseeDetails: value)
        default:
            throw InputError(
                reason: "unsupported comMethod type \(type) (expected 3 or 4)",
                category: InputError.Category.unsupportedType)
        }
    }

    private static func decodeFilter(_ r: FieldReader) throws(InputError) -> [FilterItem] {
        guard let value = r.member("filter") else { return [] }
        guard case .array(let elements) = value else { throw .invalidField("filter", "must be an array") }
        if elements.count > InputLimits.maxFilterItems {
            throw .invalidValue("filter", "\(elements.count) items, at most \(InputLimits.maxFilterItems) allowed")
        }
        var ruleBytes = 0
        var items: [FilterItem] = []
        items.reserveCapacity(elements.count)
        for (i, element) in elements.enumerated() {
            let path = "filter[\(i)]"
            guard case .object(let members) = element else { throw .invalidField(path, "must be an object") }
            let item = FieldReader(members, prefix: path + ".")
            let serviceName = try item.string("serviceName")
            let actionText = try item.string("actionType")
            guard let action = FilterAction(rawValue: actionText) else {
                throw .invalidField(path + ".actionType", "must be ENABLE or DISABLE")
            }
            let rule = try item.string("rule")
            ruleBytes += rule.utf8.count
            items.append(
                FilterItem(
                    serviceName: serviceName, action: action,
                    rule: rule, enableMeta: try item.optionalString("enableMeta")))
        }
        // Checked before any rule is compiled: evaluation is linear in this total, so the bound
        // is what keeps one device's filter cheap for every event of its owner.
        if ruleBytes > InputLimits.maxRuleTextBytes {
            throw .invalidValue("filter", "\(ruleBytes) bytes of rule text, at most \(InputLimits.maxRuleTextBytes) allowed")
        }
        return items
    }
}
