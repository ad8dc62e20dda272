import Foundation
import MailpushPartition
import MailpushState
import Testing

@Suite struct StateStoreTests {
    static func directory() -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("mailpush-state-\(UUID().uuidString)").path
        return path
    }

    @Test func offsetsConfigAndDedupeSurviveReopening() throws {
        let dir = Self.directory()
        do {
            let store = try StateStore(directory: dir)
            let devices = TopicPartition(topic: "mailpush.devices", partition: 1)
            try store.applyConfig(
                [ConfigChange(table: .devices, id: "dev-1", owner: "user-1", value: Array("{}".utf8)),
                 ConfigChange(table: .devices, id: "dev-2", owner: "user-1", value: Array("{}".utf8)),
                 ConfigChange(table: .addressKeys, id: "em-1", owner: "user-1", value: Array("{\"k\":1}".utf8))],
                offsets: [devices: 3])
            try store.applyConfig([ConfigChange(table: .devices, id: "dev-2", owner: nil, value: nil)], offsets: [devices: 4])
            let events = TopicPartition(topic: "email.received", partition: 0)
            try store.commitEventBatch(offsets: [events: 10], processedEmails: ["a", "b"], processedAtMs: 1000,
                                       outputMarks: [TopicPartition(topic: "mailpush.push-jobs", partition: 2): 7])
        }
        let store = try StateStore(directory: dir)
        #expect(try store.devices().map(\.deviceId) == ["dev-1"], "the tombstone deleted dev-2")
        #expect(try store.addressKeys().map(\.record) == [Array("{\"k\":1}".utf8)])
        #expect(try store.offsets() == [TopicPartition(topic: "mailpush.devices", partition: 1): 4,
                                        TopicPartition(topic: "email.received", partition: 0): 10])
        #expect(try store.outputMarks() == [TopicPartition(topic: "mailpush.push-jobs", partition: 2): 7])
        #expect(try store.processedEmails(among: ["a", "b", "c"], sinceMs: 0) == ["a", "b"])
        #expect(try store.processedEmails(among: ["a"], sinceMs: 1001) == [], "outside the window")
    }

    @Test func devicesAreReadByOwnerAndKeysByAddress() throws {
        let store = try StateStore(directory: Self.directory())
        // More owners than one statement names (lookupChunk), and an owner change.
        var changes = (0..<1200).map { ConfigChange(table: .devices, id: "dev-\($0)", owner: "user-\($0 % 600)", value: Array("{\"n\":\($0)}".utf8)) }
        changes.append(ConfigChange(table: .devices, id: "dev-0", owner: "user-moved", value: Array("{}".utf8)))
        changes += (0..<3).map { ConfigChange(table: .addressKeys, id: "em-\($0)", owner: nil, value: Array("{\"k\":\($0)}".utf8)) }
        try store.applyConfig(changes, offsets: [:])

        let rows = try store.devices(owners: (0..<600).map { "user-\($0)" } + ["user-moved", "nobody"])
        #expect(rows.count == 1200)
        #expect(Set(rows.filter { $0.owner == "user-0" }.map(\.deviceId)) == ["dev-600"], "dev-0 moved away")
        #expect(rows.first { $0.deviceId == "dev-0" }.map { ($0.owner, $0.registration) }! == ("user-moved", Array("{}".utf8)))
        #expect(try store.devices(owners: []).isEmpty)
        #expect(try store.devices(owners: ["user-7"]).map(\.deviceId).sorted() == ["dev-607", "dev-7"])

        let keys = try store.addressKeys(addresses: ["em-2", "em-0", "em-9"])
        #expect(Dictionary(uniqueKeysWithValues: keys.map { ($0.emailAddressId, $0.record) }) ==
                ["em-0": Array("{\"k\":0}".utf8), "em-2": Array("{\"k\":2}".utf8)])
        #expect(try store.configCounts() == (devices: 1200, addressKeys: 3))
    }

    @Test func dedupeEntriesExpireInBoundedChunks() throws {
        let store = try StateStore(directory: Self.directory())
        try store.commitEventBatch(offsets: [:], processedEmails: (0..<25).map { "old-\($0)" }, processedAtMs: 100, outputMarks: [:])
        try store.commitEventBatch(offsets: [:], processedEmails: ["new"], processedAtMs: 5000, outputMarks: [:])
        #expect(try store.expireProcessedEmails(beforeMs: 1000, limit: 10) == 10)
        #expect(try store.expireProcessedEmails(beforeMs: 1000, limit: 10) == 10)
        #expect(try store.expireProcessedEmails(beforeMs: 1000, limit: 10) == 5)
        #expect(try store.expireProcessedEmails(beforeMs: 1000, limit: 10) == 0)
        #expect(try store.processedEmailCount() == 1)
    }

    @Test func setOffsetsReportsWhatChanged() throws {
        let store = try StateStore(directory: Self.directory())
        let key = TopicPartition(topic: "email.received", partition: 3)
        let first = try store.setOffsets([key: 5])
        #expect(first.count == 1 && first[key]! == nil, "no previous value")
        #expect(try store.setOffsets([key: 9])[key]! == 5)
        #expect(try store.offsets()[key] == 9)
    }

    @Test func corruptDatabaseIsReportedByName() throws {
        let dir = Self.directory()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let file = "\(dir)/\(StateStore.fileName)"
        try Data(repeating: 0x5A, count: 8192).write(to: URL(fileURLWithPath: file))
        let error = #expect(throws: StateError.self) { try StateStore(directory: dir) }
        #expect(error?.description.contains(file) == true)
        #expect(error?.description.contains("backup") == true, "tells the operator what to do")
    }

    @Test func stateDirectoryThatIsAFileIsRefused() throws {
        let path = Self.directory()
        try Data("x".utf8).write(to: URL(fileURLWithPath: path))
        let error = #expect(throws: StateError.self) { try StateStore(directory: path) }
        #expect(error?.description == "state directory \(path) is not a directory")
    }
}
