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

    @Test func replayRequestsResumeFromTheirLastCommittedBatch() throws {
        let dir = Self.directory()
        let id: Int64
        do {
            let store = try StateStore(directory: dir)
            id = try store.submitReplay(
                eventsTopic: "email.received",
                cursors: [.init(partition: 0, next: 0, end: 10), .init(partition: 1, next: 5, end: 5)], force: false, nowMs: 1)
            var counts = ReplayRequest.Counts()
            counts.eventsRead = 4
            counts.jobs = 8
            try store.commitReplayBatch(id: id, cursors: [0: 4], counts: counts, processedEmails: ["a"], processedAtMs: 2,
                                        outputMarks: [TopicPartition(topic: "mailpush.push-jobs", partition: 0): 3])
        }
        let store = try StateStore(directory: dir)
        let pending = try store.pendingReplays()
        #expect(pending.map(\.id) == [id])
        #expect(pending.first?.remaining == [.init(partition: 0, next: 4, end: 10)], "resumes after the committed batch")
        #expect(pending.first?.eventsTotal == 10 && pending.first?.counts.jobs == 8)
        #expect(try store.processedEmails(among: ["a"], sinceMs: 0) == ["a"], "dedupe entries commit with the cursor")
        try store.finishReplay(id: id, status: .done)
        #expect(try store.pendingReplays().isEmpty)
        #expect(try store.replay(id: id)?.status == .done)
    }

    @Test func stateDirectoryLockHasOneHolderAtATime() throws {
        let dir = Self.directory()
        _ = try StateStore(directory: dir)
        guard case .acquired(let first) = try StateDirectoryLock.tryAcquire(directory: dir) else {
            Issue.record("a free directory could not be locked")
            return
        }
        guard case .held(let pid) = try StateDirectoryLock.tryAcquire(directory: dir) else {
            Issue.record("a second lock was granted while the first is held")
            return
        }
        #expect(pid == getpid(), "the holder's pid is readable")
        #expect(try StateDirectoryLock.isHeld(directory: dir))
        withExtendedLifetime(first) {}
    }
}
