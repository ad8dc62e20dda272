import MailpushCore
import MailpushTestSupport
import Testing

/// Filter lists as the Sudo iOS and Android SDKs write them, edited on one or both platforms.
@Suite("SDK-written filter lists")
struct SudoFilterListTests {
    typealias Platform = SudoFilterList.Platform

    static let address1 = "em-add-1"
    static let address2 = "em-add-2"
    static let sudo1 = "sudo-1"

    static func meta(address: String = address1, sudo: String = sudo1) -> FilterMeta {
        FilterMeta(emailAddressId: address, sudoId: sudo, folderId: "\(address)-INBOX", keyId: "key-1")
    }

    static let fresh = SudoFilterList()

    @Test func nothingConfiguredMeansNoNotifications() {
        #expect(!Self.fresh.filter.wantsNotification(for: Self.meta()))
    }

    @Test(arguments: Platform.allCases)
    func initEnablesEverything(_ p: Platform) {
        let list = Self.fresh.initEmailNotifications(on: p)
        #expect(list.items.count == 2)
        #expect(list.filter.hasCatchAll)
        #expect(list.filter.wantsNotification(for: Self.meta()))
        #expect(!list.filter.wantsNotification(for: FilterMeta(type: "messageDeleted", emailAddressId: "a", sudoId: "s", folderId: "f")))
    }

    @Test(arguments: Platform.allCases)
    func disablingAnAddressSilencesOnlyThatAddress(_ p: Platform) {
        let list = Self.fresh.initEmailNotifications(on: p).setEmailNotificationsForAddressId(Self.address1, enabled: false, on: p)
        #expect(!list.filter.wantsNotification(for: Self.meta(address: Self.address1)))
        #expect(list.filter.wantsNotification(for: Self.meta(address: Self.address2)))
        let reenabled = list.setEmailNotificationsForAddressId(Self.address1, enabled: true, on: p)
        #expect(reenabled.filter.wantsNotification(for: Self.meta(address: Self.address1)))
        #expect(reenabled.items.count == 2)
    }

    @Test(arguments: Platform.allCases)
    func disablingASudoSilencesAllItsAddresses(_ p: Platform) {
        let list = Self.fresh.initEmailNotifications(on: p).setEmailNotificationsForSudoId(Self.sudo1, enabled: false, on: p)
        #expect(!list.filter.wantsNotification(for: Self.meta(address: Self.address1, sudo: Self.sudo1)))
        #expect(!list.filter.wantsNotification(for: Self.meta(address: Self.address2, sudo: Self.sudo1)))
        #expect(list.filter.wantsNotification(for: Self.meta(address: Self.address1, sudo: "sudo-2")))
    }

    /// Edited on one platform, then on the other: the first platform's catch-all survives in
    /// the middle of the list, before the second platform's DISABLE — which must still win.
    @Test(arguments: [(Platform.ios, Platform.android), (.android, .ios)])
    func catchAllLeftInTheMiddleDoesNotOverrideALaterDisable(_ first: Platform, _ second: Platform) {
        let list = Self.fresh
            .initEmailNotifications(on: first)
            .setEmailNotificationsForAddressId(Self.address2, enabled: false, on: first)
            .setEmailNotificationsForAddressId(Self.address1, enabled: false, on: second)
        let rules = list.items.map(\.rule)
        // The shape the contract describes really arises: a catch-all before the last DISABLE.
        let middleCatchAll = rules.firstIndex(of: SudoFilterList.catchAllRule(first))
        let lastDisable = rules.lastIndex { $0.contains("meta.emailAddressId") }
        #expect(middleCatchAll != nil && lastDisable != nil && middleCatchAll! < lastDisable!)
        #expect(rules.last == SudoFilterList.catchAllRule(second))

        #expect(!list.filter.wantsNotification(for: Self.meta(address: Self.address1)))
        #expect(!list.filter.wantsNotification(for: Self.meta(address: Self.address2)))
        #expect(list.filter.wantsNotification(for: Self.meta(address: "em-add-3")))
    }

    @Test(arguments: [(Platform.ios, Platform.android), (.android, .ios)])
    func sudoDisabledOnTheOtherPlatformStillWins(_ first: Platform, _ second: Platform) {
        let list = Self.fresh
            .initEmailNotifications(on: first)
            .initEmailNotifications(on: second)
            .setEmailNotificationsForSudoId(Self.sudo1, enabled: false, on: second)
        #expect(!list.filter.wantsNotification(for: Self.meta()))
        let reenabledOnFirst = list.setEmailNotificationsForSudoId(Self.sudo1, enabled: true, on: first)
        #expect(reenabledOnFirst.filter.wantsNotification(for: Self.meta()))
    }

    @Test func otherServicesRulesAreIgnored() {
        let list = Self.fresh.initEmailNotifications(on: .ios)
            .appending(FilterItem(serviceName: "vcService", action: .disable, rule: #"{"==":[1,1]}"#))
        #expect(list.filter.wantsNotification(for: Self.meta()))
    }

    @Test func reversedOperandsAreRecognisedByTheSDKAndByTheFilter() {
        let reversed = FilterItem(serviceName: "emService", action: .disable, rule: #"{"==":["em-add-1",{"var":"meta.emailAddressId"}]}"#)
        let list = SudoFilterList(items: [reversed]).initEmailNotifications(on: .android)
        #expect(!list.filter.wantsNotification(for: Self.meta()))
        // Re-enabling on iOS finds and removes the reversed rule (structural match).
        let reenabled = list.setEmailNotificationsForAddressId(Self.address1, enabled: true, on: .ios)
        #expect(!reenabled.items.contains { $0.rule == reversed.rule })
        #expect(reenabled.filter.wantsNotification(for: Self.meta()))
    }

    static func decide(_ rule: String, _ action: FilterAction = .disable, meta: FilterMeta = meta()) -> Bool {
        SudoFilterList(items: [FilterItem(serviceName: "emService", action: action, rule: rule)])
            .initEmailNotifications(on: .ios).filter.wantsNotification(for: meta)
    }

    @Test(arguments: [
        // (DISABLE rule placed between the SDK defaults, does it block em-add-1/sudo-1?)
        (#"{"in":[{"var":"meta.emailAddressId"},["em-add-1","em-add-9"]]}"#, true),
        (#"{"in":[{"var":"meta.emailAddressId"},["em-add-8","em-add-9"]]}"#, false),
        (#"{"in":["INBOX",{"var":"meta.folderId"}]}"#, true),
        (#"{"in":["SPAM",{"var":"meta.folderId"}]}"#, false),
        (#"{"==":[{"var":["meta.missing","sudo-1"]},"sudo-1"]}"#, true),
        (#"{"==":[{"var":["meta.sudoId","x"]},"x"]}"#, false),
        (#"{"!":{"var":"meta.keyId"}}"#, false),
        (#"{"!":[{"var":"meta.nothing"}]}"#, true),
        (#"{"!!":[{"var":"meta.keyId"}]}"#, true),
        (#"{"!!":[{"var":"meta.nothing"}]}"#, false),
        (#"{"===":[{"var":"meta.sudoId"},"sudo-1"]}"#, true),
        (#"{"!==":[{"var":"meta.sudoId"},"sudo-1"]}"#, false),
        (#"{"and":[{"==":[{"var":"meta.sudoId"},"sudo-1"]},{"!=":[{"var":"meta.emailAddressId"},"em-add-1"]}]}"#, false),
        (#"{"or":[{"==":[{"var":"meta.sudoId"},"nope"]},{"==":[{"var":"meta.emailAddressId"},"em-add-1"]}]}"#, true),
        (#"  { "==" :   [ { "var" : "meta.sudoId" } , "sudo-1" ] }  "#, true),
    ])
    func operatorsInSDKLists(_ rule: String, _ blocks: Bool) {
        #expect(Self.decide(rule) == !blocks)
    }

    @Test(arguments: [
        #"{"==":[1,1]}"#, #"{"==" : [ 1, 1]}"#, #"{"==":["x","x"]}"#, "true", #"{"===":[2,2.0]}"#, #"{"!!":[1]}"#,
    ])
    func constantTrueEnableRulesAreCatchAlls(_ rule: String) {
        let filter = NotificationFilter(items: [
            FilterItem(serviceName: "emService", action: .enable, rule: rule),
            FilterItem(serviceName: "emService", action: .disable, rule: #"{"==":[{"var":"meta.sudoId"},"sudo-1"]}"#),
        ])
        #expect(filter.hasCatchAll)
        #expect(!filter.wantsNotification(for: Self.meta()))
        #expect(filter.wantsNotification(for: Self.meta(sudo: "sudo-2")))
    }

    @Test func aConstantDisableKeepsItsPlace() {
        let filter = NotificationFilter(items: [
            FilterItem(serviceName: "emService", action: .enable, rule: #"{"==":[{"var":"meta.sudoId"},"sudo-1"]}"#),
            FilterItem(serviceName: "emService", action: .disable, rule: #"{"==":[1,1]}"#),
            FilterItem(serviceName: "emService", action: .enable, rule: #"{"==":[1,1]}"#),
        ])
        #expect(filter.wantsNotification(for: Self.meta()))
        #expect(!filter.wantsNotification(for: Self.meta(sudo: "sudo-2")))
    }

    @Test(arguments: [
        "{oops", #"{"regex":["x","y"]}"#, #"{"==":[1,1],"!=":[1,2]}"#, "{}", #"{"==":[{"cat":["a"]},"a"]}"#, "",
    ])
    func unusableRulesNeverMatchAndAreCounted(_ rule: String) {
        for action in [FilterAction.enable, .disable] {
            let filter = NotificationFilter(items: [FilterItem(serviceName: "emService", action: action, rule: rule)])
            #expect(filter.invalidRuleCount == 1)
            #expect(!filter.wantsNotification(for: Self.meta()))
        }
        #expect(Self.decide(rule)) // a DISABLE that never matches leaves the catch-all in charge
    }
}
