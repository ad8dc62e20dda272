import Foundation
import Logging
import MailpushCore
import MailpushState
import MailpushTestSupport
import Testing

@testable import MailpushPipeline

@Suite struct LRUCacheTests {
    @Test func theLeastRecentlyUsedLeavesFirst() {
        var cache = LRUCache<String, Int>(capacity: 3)
        cache.set("a", 1)
        cache.set("b", 2)
        cache.set("c", 3)
        #expect(cache.get("a") == 1, "a is now the most recently used")
        let evicted = cache.set("d", 4)
        #expect(evicted.map(\.key) == ["b"] && evicted.map(\.value) == [2])
        #expect(cache.get("b") == nil)
        #expect(cache.keysByRecency == ["d", "a", "c"])
        #expect(cache.count == 3)
    }

    @Test func replacingAValueKeepsOneEntryAndRefreshesIt() {
        var cache = LRUCache<String, Int>(capacity: 2)
        cache.set("a", 1)
        cache.set("b", 2)
        #expect(cache.set("a", 10).isEmpty, "nothing leaves when a key is replaced")
        #expect(cache.count == 2)
        #expect(cache.set("c", 3).map(\.key) == ["b"])
        #expect(cache.get("a") == 10)
    }

    @Test func removedSlotsAreReused() {
        var cache = LRUCache<Int, Int>(capacity: 2)
        for round in 0...1000 {
            cache.set(round, round)
            if round % 3 == 0 { #expect(cache.remove(round) == round) }
        }
        #expect(cache.count == 2)
        #expect(cache.keysByRecency == [1000, 998], "999 was removed, 997 evicted")
        #expect(cache.remove(12345) == nil)
    }

    @Test func theOldestLeaveUntilTheWeightFitsAndAValueHeavierThanAllIsNotKept() {
        var cache = LRUCache<String, Int>(capacity: 100, maxWeight: 10)
        cache.set("a", 1, weight: 4)
        cache.set("b", 2, weight: 4)
        #expect(cache.set("c", 3, weight: 5).map(\.key) == ["a"])
        #expect(cache.totalWeight == 9)
        #expect(cache.set("b", 20, weight: 6).map(\.key) == ["c"], "a heavier value for a key makes room too")
        #expect(cache.set("d", 4, weight: 11).map(\.key) == ["d"], "heavier than the cache: not kept")
        #expect(cache.set("b", 30, weight: 11).map(\.key) == ["b", "b"], "the old value leaves, the new one is not kept")
        #expect(cache.count == 0 && cache.totalWeight == 0)
    }
}

@Suite struct ConfigDirectoryTests {
    static func store() throws -> StateStore {
        try StateStore(directory: TestDirectories.path("mailpush-dir"))
    }

    static func device(_ id: String, owner: String, token: String = "apns-token") -> [UInt8] {
        Fixtures.device(deviceId: id, owner: owner, target: .ios(token: token)).bytes
    }

    /// Applies records the way the service does: stored first, then given to the directory.
    static func apply(_ meanings: [ConfigRecordMeaning], to directory: ConfigDirectory, store: StateStore?) throws {
        if let store { try store.applyConfig(meanings.compactMap(\.stateChange), offsets: [:]) }
        directory.apply(meanings)
    }

    static func register(_ id: String, owner: String, token: String = "apns-token") -> ConfigRecordMeaning {
        ConfigRecordMeaning.device(key: Array(id.utf8), value: device(id, owner: owner, token: token))
    }

    static func token(_ device: DeviceRegistration) -> String? {
        if case .apns(let token) = device.target { token } else { nil }
    }

    let logger = Logger(label: "test")

    @Test func aBatchGetsItsOwnersDevicesInDeviceIdOrderAndTheirKeys() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, log: RecordLog(logger: logger))
        try Self.apply(
            [
                Self.register("dev-b", owner: "user-1"), Self.register("dev-a", owner: "user-1"), Self.register("dev-c", owner: "user-2"),
                ConfigRecordMeaning.addressKey(key: Array("em-1".utf8), value: TestKeys.addressKeyJSON(emailAddressId: "em-1").bytes),
            ], to: directory, store: store)
        let view = try directory.view(owners: ["user-1", "user-3"], addresses: ["em-1", "em-2"])
        #expect(view.devices(owner: "user-1").map(\.deviceId) == ["dev-a", "dev-b"])
        #expect(view.devices(owner: "user-2").isEmpty, "not asked for")
        #expect(view.devices(owner: "user-3").isEmpty)
        guard case .usable(let key)? = view.key(address: "em-1") else {
            Issue.record("em-1 has a usable key")
            return
        }
        #expect(key.keyId == "key-1")
        #expect(view.key(address: "em-2") == nil)
    }

    @Test func aChangeAppliedAfterALookupIsSeenByTheNextOne() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, log: RecordLog(logger: logger))
        try Self.apply(
            [Self.register("dev-1", owner: "user-1", token: "old"), Self.register("dev-2", owner: "user-1")],
            to: directory, store: store)
        #expect(try directory.view(owners: ["user-1", "user-2"], addresses: ["em-1"]).devices(owner: "user-1").count == 2)

        // Now cached: an update, a move to another owner, a tombstone and a new key must all show.
        try Self.apply(
            [
                Self.register("dev-1", owner: "user-1", token: "new"),
                Self.register("dev-2", owner: "user-2"),
                ConfigRecordMeaning.addressKey(key: Array("em-1".utf8), value: TestKeys.addressKeyJSON(emailAddressId: "em-1").bytes),
            ], to: directory, store: store)
        var view = try directory.view(owners: ["user-1", "user-2"], addresses: ["em-1"])
        #expect(view.devices(owner: "user-1").map(Self.token) == ["new"])
        #expect(view.devices(owner: "user-2").map(\.deviceId) == ["dev-2"], "moved from user-1, whose entry was cached")
        #expect(view.key(address: "em-1") != nil, "the cached 'no key' is gone")

        try Self.apply([.deviceRemoved(deviceId: "dev-2"), .keyRemoved(address: "em-1")], to: directory, store: store)
        view = try directory.view(owners: ["user-1", "user-2"], addresses: ["em-1"])
        #expect(view.devices(owner: "user-2").isEmpty)
        #expect(view.devices(owner: "user-1").map(\.deviceId) == ["dev-1"])
        #expect(view.key(address: "em-1") == nil)
    }

    @Test func evictedOwnersAreReadAgainFromTheStore() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, capacity: .init(owners: 2, addresses: 1), log: RecordLog(logger: logger))
        try Self.apply((0..<10).map { Self.register("dev-\($0)", owner: "user-\($0)") }, to: directory, store: store)
        for round in 0..<3 {
            for owner in 0..<10 {
                let view = try directory.view(owners: ["user-\(owner)"], addresses: [])
                #expect(view.devices(owner: "user-\(owner)").map(\.deviceId) == ["dev-\(owner)"], "round \(round)")
            }
        }
        // A device that moves away from an evicted owner: nothing cached names it, the store answers.
        try Self.apply([Self.register("dev-0", owner: "user-9")], to: directory, store: store)
        let view = try directory.view(owners: ["user-0", "user-9"], addresses: [])
        #expect(view.devices(owner: "user-0").isEmpty)
        #expect(view.devices(owner: "user-9").map(\.deviceId) == ["dev-0", "dev-9"])
    }

    @Test func aLookupOfManyOwnersIsAnsweredWhole() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, log: RecordLog(logger: logger))
        // More owners than one SQL statement may name.
        try Self.apply((0..<1500).map { Self.register("dev-\($0)", owner: "user-\($0 / 2)") }, to: directory, store: store)
        let view = try directory.view(owners: Set((0..<751).map { "user-\($0)" }), addresses: [])
        #expect((0..<750).allSatisfy { view.devices(owner: "user-\($0)").count == 2 })
        #expect(view.devices(owner: "user-750").isEmpty)
    }

    @Test func aStoredRegistrationThatNoLongerDecodesIsLeftOut() throws {
        let store = try Self.store()
        try store.applyConfig(
            [
                ConfigChange(table: .devices, id: "dev-1", owner: "user-1", value: Array("{\"deviceId\":\"dev-1\"}".utf8)),
                ConfigChange(table: .devices, id: "dev-2", owner: "user-1", value: Self.device("dev-2", owner: "user-1")),
            ], offsets: [:])
        let view = try ConfigDirectory(store: store, log: RecordLog(logger: logger)).view(owners: ["user-1"], addresses: [])
        #expect(view.devices(owner: "user-1").map(\.deviceId) == ["dev-2"])
    }
}
