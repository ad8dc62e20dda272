import MailpushCore

/// A filter list edited the way the Sudo Email SDKs edit `NotificationConfiguration`
/// (`initEmailNotifications`, `setEmailNotificationsForAddressId/SudoId(enabled:)`).
///
/// The two SDKs differ in one detail that matters: the catch-all they append is spelled
/// `{"==":[1,1]}` on iOS and `{"==" : [ 1, 1]}` on Android, and each strips only its own
/// spelling (by string comparison) before re-appending it. A list edited on both platforms
/// therefore keeps the other platform's catch-all in the middle. Address/Sudo rules are
/// recognised structurally (parsed JSON) by both, in either operand order.
public struct SudoFilterList: Sendable {
    public enum Platform: Sendable, CaseIterable {
        case ios, android
    }

    public static let serviceName = "emService"
    /// Identical on both platforms (Kotlin's `JsonObject.toString()` is compact too).
    public static let defaultFirstRule = #"{"!=":[{"var":"meta.type"},"messageReceived"]}"#

    public static func catchAllRule(_ platform: Platform) -> String {
        switch platform {
        case .ios: return #"{"==":[1,1]}"#
        case .android: return #"{"==" : [ 1, 1]}"#
        }
    }

    public var items: [FilterItem]

    public init(items: [FilterItem] = []) {
        self.items = items
    }

    /// `initEmailNotifications()`.
    public func initEmailNotifications(on platform: Platform) -> SudoFilterList {
        let others = items.filter { $0.serviceName != Self.serviceName }
        let kept = ownRulesRemoved(platform)
        return SudoFilterList(items: others + [Self.firstItem] + kept + [Self.catchAllItem(platform)])
    }

    /// `setEmailNotificationsForAddressId(emailAddressId:enabled:)`.
    public func setEmailNotificationsForAddressId(_ emailAddressId: String, enabled: Bool, on platform: Platform) -> SudoFilterList {
        setSingleMeta("emailAddressId", emailAddressId, enabled: enabled, on: platform)
    }

    /// `setEmailNotificationsForSudoId(sudoId:enabled:)`.
    public func setEmailNotificationsForSudoId(_ sudoId: String, enabled: Bool, on platform: Platform) -> SudoFilterList {
        setSingleMeta("sudoId", sudoId, enabled: enabled, on: platform)
    }

    /// Adds an arbitrary item at the end (another service's rule, a hand-written rule).
    public func appending(_ item: FilterItem) -> SudoFilterList {
        SudoFilterList(items: items + [item])
    }

    public var filter: NotificationFilter { NotificationFilter(items: items) }

    // MARK: - SDK behaviour

    private func setSingleMeta(_ name: String, _ value: String, enabled: Bool, on platform: Platform) -> SudoFilterList {
        let others = items.filter { $0.serviceName != Self.serviceName }
        let kept = ownRulesRemoved(platform).filter { !Self.isRuleMatchingSingleMeta($0.rule, name: name, value: value) }
        var result = others + [Self.firstItem] + kept
        if !enabled {
            // Both SDKs serialise this rule compactly, `var` first.
            let rule = #"{"==":[{"var":"meta.\#(name)"},\#(Self.quoted(value))]}"#
            result.append(FilterItem(serviceName: Self.serviceName, action: .disable, rule: rule))
        }
        result.append(Self.catchAllItem(platform))
        return SudoFilterList(items: result)
    }

    /// emService items minus this platform's own default first/last rules (string compare).
    private func ownRulesRemoved(_ platform: Platform) -> [FilterItem] {
        items.filter {
            $0.serviceName == Self.serviceName && $0.rule != Self.defaultFirstRule && $0.rule != Self.catchAllRule(platform)
        }
    }

    /// The SDKs' `isRuleMatchingSingleMeta`: `{"==":[{"var":"meta.<name>"},"<value>"]}` in
    /// either operand order, compared as parsed JSON.
    static func isRuleMatchingSingleMeta(_ rule: String, name: String, value: String) -> Bool {
        guard let json = try? JSONValue.parse(rule), let operands = json["=="]?.arrayValue, operands.count == 2 else {
            return false
        }
        let target = "meta.\(name)"
        switch (operands[0], operands[1]) {
        case (.object(let v), .string(let s)), (.string(let s), .object(let v)):
            return v["var"]?.stringValue == target && s == value
        default:
            return false
        }
    }

    private static let firstItem = FilterItem(serviceName: serviceName, action: .disable, rule: defaultFirstRule)

    private static func catchAllItem(_ platform: Platform) -> FilterItem {
        FilterItem(serviceName: serviceName, action: .enable, rule: catchAllRule(platform))
    }

    private static func quoted(_ s: String) -> String {
        var out: [UInt8] = []
        JSONWriter.appendQuoted(s, to: &out)
        return String(decoding: out, as: UTF8.self)
    }
}
