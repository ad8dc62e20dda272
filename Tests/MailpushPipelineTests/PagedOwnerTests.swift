import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushState
import MailpushTestSupport
import Testing

@testable import MailpushPipeline

/// An owner whose registrations are too large to hold whole, and the owners of a batch beyond what it may hold,
/// are read a page at a time: what a batch decides and renders must not change.
@Suite struct PagedOwnerTests {
    let logger = Logger(label: "test")
    /// About 1 KB stored per registration: 10 of them are more than one page.
    static let tiny = ConfigDirectory.CacheCapacity(owners: 100, addresses: 10, deviceBytes: 6_000, ownerPageBytes: 2_500)

    static func registration(_ id: String, owner: String, sudoDisabled: Bool = false) -> ConfigRecordMeaning {
        var filter = SudoFilterList().initEmailNotifications(on: .ios)
        if sudoDisabled { filter = filter.setEmailNotificationsForSudoId("sudo-1", enabled: false, on: .ios) }
        let value = Fixtures.device(
            deviceId: id, owner: owner, target: .ios(token: "apns-\(id)-" + String(repeating: "t", count: 900)), filter: filter)
        return ConfigRecordMeaning.device(key: Array(id.utf8), value: value.bytes)
    }

    /// "big": 12 devices, every third one with the Sudo's notifications disabled; "small-0" … "small-7": one each.
    static func store() throws -> StateStore {
        let store = try StateStore(
            directory: TestDirectories.path("mailpush-paged"))
        var meanings = (0..<12).map { registration("dev-big-\($0)", owner: "big", sudoDisabled: $0 % 3 == 0) }
        meanings += (0..<8).map { registration("dev-small-\($0)", owner: "small-\($0)") }
        meanings.append(
            ConfigRecordMeaning.addressKey(key: Array("em-add-1".utf8), value: TestKeys.addressKeyJSON(emailAddressId: "em-add-1").bytes))
        try store.applyConfig(meanings.compactMap(\.stateChange), offsets: [:])
        return store
    }

    static func pages(of owner: String, in view: ConfigView) throws -> [[String]] {
        var pages: [[String]] = []
        try view.forEachDevicePage(owner: owner) { page in pages.append(page.map(\.deviceId)) }
        return pages
    }

    @Test func anOwnerLargerThanAPageIsReadPageByPageAndNeverCached() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, capacity: Self.tiny, log: RecordLog(logger: logger))
        for _ in 0..<2 {
            let view = try directory.view(owners: ["big", "small-0"], addresses: [])
            #expect(view.pagedOwners == ["big"])
            #expect(view.devices(owner: "big").isEmpty, "not held whole")
            #expect(view.devices(owner: "small-0").map(\.deviceId) == ["dev-small-0"])
            let pages = try Self.pages(of: "big", in: view)
            #expect(pages.count > 1 && pages.allSatisfy { $0.count <= 3 }, "pages of about 2,500 bytes: \(pages)")
            #expect(pages.flatMap { $0 } == (0..<12).map { "dev-big-\($0)" }.sorted { $0.precedesInByteOrder($1) })
        }
    }

    @Test func aBatchReadsItsOwnersWholeOnlyUpToItsBudgetAndTheRestPageByPage() throws {
        let store = try Self.store()
        let directory = ConfigDirectory(store: store, capacity: Self.tiny, log: RecordLog(logger: logger))
        let owners = (0..<8).map { "small-\($0)" }
        let view = try directory.view(owners: Set(owners), addresses: [])
        #expect(!view.pagedOwners.isEmpty && view.devicesByOwner.count < 8, "about 6,000 bytes hold 5 of the 8")
        #expect(Set(view.devicesByOwner.keys).isDisjoint(with: view.pagedOwners))
        for owner in owners {
            let devices =
                view.pagedOwners.contains(owner)
                ? try Self.pages(of: owner, in: view).flatMap { $0 } : view.devices(owner: owner).map(\.deviceId)
            #expect(devices == ["dev-\(owner)"])
        }
    }

    /// Events for "big" (one of them twice) and for two small owners: the same outputs, in the same order, and the
    /// same counts, whether "big" is read whole or page by page.
    @Test func aPagedOwnersEmailsAreDecidedAndRenderedAsAWholeOnes() async throws {
        let store = try Self.store()
        let processor = BatchProcessor(
            topics: Topics(), configuration: PipelineConfiguration(kafka: KafkaConfiguration(bootstrapServers: "unused:9092")))
        let events = [
            Fixtures.event(owner: "big", messageId: "m1"), Fixtures.event(owner: "small-1", messageId: "m2"),
            Fixtures.event(owner: "big", sudoId: "sudo-2", messageId: "m3"), Fixtures.event(owner: "big", messageId: "m1"),
            Fixtures.event(owner: "small-2", messageId: "m4"),
        ]
        let records = events.enumerated().map { offset, event in
            KafkaRecord(
                topic: "email.received", partition: 0, offset: Int64(offset), key: nil, value: event.bytes, headers: [],
                timestampMs: nil)
        }
        func outcome(_ capacity: ConfigDirectory.CacheCapacity) async throws -> (outputs: [String], filtered: Int, duplicates: Int) {
            let directory = ConfigDirectory(store: store, capacity: capacity, log: RecordLog(logger: logger))
            let batch = try await processor.process(
                records, nowMs: 1_700_000_000_000,
                config: { owners, addresses in try directory.view(owners: owners, addresses: addresses) },
                alreadyProcessed: { _ in [] })
            let outputs = batch.outputs.map { output in
                switch output.kind {
                case .job(let jobId, _): "\(output.source.offset) \(jobId)"
                case .deadLetter(let reason, let detail): "\(output.source.offset) \(reason.rawValue): \(detail)"
                }
            }
            return (outputs, batch.filteredNotifications, batch.duplicates)
        }
        let whole = try await outcome(ConfigDirectory.CacheCapacity())
        let paged = try await outcome(Self.tiny)
        #expect(whole.outputs.count == 8 + 12 + 2, "m1: 8 of big's 12 devices, m3 (another Sudo): all 12, one each for the small owners")
        #expect(paged.outputs == whole.outputs)
        #expect(paged.filtered == whole.filtered && whole.filtered == 4)
        #expect(paged.duplicates == whole.duplicates && whole.duplicates == 1)
    }
}

/// What a paged owner's emails want is kept by filter meta, so that its next emails do not read its registrations
/// again, until one of its devices changes.
@Suite struct PagedWantsTests {
    let logger = Logger(label: "test")
    let processor = BatchProcessor(
        topics: Topics(), configuration: PipelineConfiguration(kafka: KafkaConfiguration(bootstrapServers: "unused:9092")))

    /// The devices the jobs of one email for "big" go to.
    func devices(wanting messageId: String, directory: ConfigDirectory) async throws -> Set<String> {
        let record = KafkaRecord(
            topic: "email.received", partition: 0, offset: 0, key: nil, value: Fixtures.event(owner: "big", messageId: messageId).bytes,
            headers: [], timestampMs: nil)
        let batch = try await processor.process(
            [record], nowMs: 1_700_000_000_000,
            config: { owners, addresses in try directory.view(owners: owners, addresses: addresses) }, alreadyProcessed: { _ in [] })
        return Set(batch.outputs.compactMap { $0.record.key.map { String(decoding: $0, as: UTF8.self) } })
    }

    /// Stores `meanings` and, unless `unannounced`, tells the directory, as the config follower does.
    func change(_ meanings: [ConfigRecordMeaning], store: StateStore, directory: ConfigDirectory, unannounced: Bool = false) throws {
        try store.applyConfig(meanings.compactMap(\.stateChange), offsets: [:])
        if !unannounced { directory.apply(meanings) }
    }

    @Test func aPagedOwnersWantsAreKeptUntilOneOfItsDevicesChanges() async throws {
        let store = try PagedOwnerTests.store()
        let directory = ConfigDirectory(store: store, capacity: PagedOwnerTests.tiny, log: RecordLog(logger: logger))
        let wanting = Set((0..<12).filter { $0 % 3 != 0 }.map { "dev-big-\($0)" })
        #expect(try await devices(wanting: "m1", directory: directory) == wanting)
        #expect(directory.pagedWants(owner: "big").known?.byMeta.count == 1)

        // A change the directory is not told of shows whether the next email read the registrations again.
        try change(
            [PagedOwnerTests.registration("dev-big-1", owner: "big", sudoDisabled: true)], store: store, directory: directory,
            unannounced: true)
        #expect(try await devices(wanting: "m2", directory: directory) == wanting, "not read again")

        try change([PagedOwnerTests.registration("dev-big-1", owner: "big", sudoDisabled: true)], store: store, directory: directory)
        let afterTurnedOff = wanting.subtracting(["dev-big-1"])
        #expect(try await devices(wanting: "m3", directory: directory) == afterTurnedOff)

        try change([ConfigRecordMeaning.device(key: Array("dev-big-2".utf8), value: nil)], store: store, directory: directory)
        let afterRemoved = afterTurnedOff.subtracting(["dev-big-2"])
        #expect(try await devices(wanting: "m4", directory: directory) == afterRemoved)

        try change([PagedOwnerTests.registration("dev-big-4", owner: "small-0")], store: store, directory: directory)
        let afterMoved = afterRemoved.subtracting(["dev-big-4"])
        #expect(try await devices(wanting: "m5", directory: directory) == afterMoved)

        try change([PagedOwnerTests.registration("dev-big-new", owner: "big")], store: store, directory: directory)
        #expect(
            try await devices(wanting: "m6", directory: directory)
                == afterMoved.union(["dev-big-new"]))
    }

    /// A read that began before a change of devices is not kept: it may have seen the devices before the change.
    @Test func wantsReadBeforeAChangeAreNotKept() throws {
        let store = try PagedOwnerTests.store()
        let directory = ConfigDirectory(store: store, capacity: PagedOwnerTests.tiny, log: RecordLog(logger: logger))
        let (_, changes) = directory.pagedWants(owner: "big")
        try change([PagedOwnerTests.registration("dev-small-9", owner: "small-9")], store: store, directory: directory)
        directory.keep(ConfigDirectory.PagedWants(byMeta: [:], deviceIds: ["dev-big-0"]), owner: "big", ifNoChangeSince: changes)
        #expect(directory.pagedWants(owner: "big").known == nil)
        let (_, now) = directory.pagedWants(owner: "big")
        directory.keep(ConfigDirectory.PagedWants(byMeta: [:], deviceIds: ["dev-big-0"]), owner: "big", ifNoChangeSince: now)
        #expect(directory.pagedWants(owner: "big").known?.deviceIds == ["dev-big-0"])
    }
}
