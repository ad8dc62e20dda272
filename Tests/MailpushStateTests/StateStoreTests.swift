import Foundation
import GRDB
import MailpushPartition
import MailpushState
import MailpushTestSupport
import Testing

@Suite struct StateStoreTests {
    static func directory() -> String {
        TestDirectories.path("mailpush-state")
    }

    @Test func backgroundCheckpointsKeepCommitsFromCheckpointing() async throws {
        let dir = Self.directory()
        let store = try StateStore(directory: dir, checkpointsInBackground: true)
        let events = TopicPartition(topic: "email.received", partition: 0)
        // Random keys dirty a page each: well past SQLite's default of 1,000 pages of log per checkpoint.
        for batch in 0..<30 {
            let keys = (0..<300).map { _ in UUID().uuidString }
            try store.commitEventBatch(offsets: [events: Int64(batch + 1)], processedEmails: keys, processedAtMs: 1000, outputMarks: [:])
        }
        let logPages = try await store.checkpoint()
        #expect(logPages > 1000, "commits left the log to checkpoint(): \(logPages) pages")
        try store.commitEventBatch(offsets: [events: 31], processedEmails: ["last"], processedAtMs: 1000, outputMarks: [:])
        let afterRestart = try await store.checkpoint()
        #expect(afterRestart < 100, "the log starts over once copied: \(afterRestart) pages")

        let reopened = try StateStore(directory: dir)
        #expect(try reopened.offsets() == [events: 31])
        #expect(try reopened.processedEmails(among: ["last"], sinceMs: 0) == ["last"])
    }

    /// A batch's keys are entered and looked up a few statements at a time, in pieces of 2^k keys: every key of
    /// a batch of any size counts, once, and a key entered again moves to the newer time.
    /// An earlier embedded development broker's state: everything goes, the cluster it was recorded for with it,
    /// and the state works as a new one.
    @Test func aDiscardedStateIsANewOne() throws {
        let store = try StateStore(directory: Self.directory())
        let events = TopicPartition(topic: "email.received", partition: 0)
        #expect(try store.recordedCluster() == nil && store.offsets().isEmpty)
        try store.recordCluster(.embedded)
        let batch = try store.commitEventBatch(
            offsets: [events: 5], processedEmails: ["m1"], processedAtMs: 1, outputMarks: [events: 3],
            stateRecords: { _ in UnwrittenStateRecord.Batch(marks: [], records: [(events, [1])]) })
        #expect(batch != nil)
        _ = try store.instanceId()
        #expect(try !store.offsets().isEmpty && store.recordedCluster() == .embedded)

        try store.discardEverything()
        #expect(try store.offsets().isEmpty && store.recordedCluster() == nil)
        #expect(try store.offsets().isEmpty && store.outputMarks().isEmpty && store.splitUnwrittenBatches() == 0)
        #expect(try store.processedEmails(among: ["m1"], sinceMs: 0).isEmpty)
        try store.commitEventBatch(offsets: [events: 2], processedEmails: ["m1"], processedAtMs: 2, outputMarks: [:])
        #expect(try store.offsets() == [events: 2])
    }

    @Test func dedupeEntriesOfABatchOfAnySizeAreFoundExactly() throws {
        let store = try StateStore(directory: Self.directory())
        let early = (0..<700).map { "early-\($0)" } // 256 + 256 + 128 + 32 + 16 + 8 + 4
        try store.commitEventBatch(offsets: [:], processedEmails: early + early.prefix(3), processedAtMs: 1000, outputMarks: [:])
        let late = (0..<301).map { "late-\($0)" }
        try store.commitEventBatch(offsets: [:], processedEmails: late + early.suffix(5), processedAtMs: 2000, outputMarks: [:])

        let unknown = (0..<299).map { "unknown-\($0)" }
        let asked = early + late + unknown
        #expect(try store.processedEmails(among: asked, sinceMs: 0) == Set(early + late))
        #expect(try store.processedEmails(among: asked, sinceMs: 1500) == Set(late + early.suffix(5)), "entered again: the newer time")
        #expect(try store.processedEmails(among: asked, sinceMs: 2001) == [])
        #expect(try store.processedEmails(among: ["early-699"], sinceMs: 1500) == ["early-699"])
        #expect(try store.processedEmails(among: [String](), sinceMs: 0) == [])
    }

    /// A commit stores its offsets and marks a piece of partitions per statement: every partition of a batch of any
    /// size counts, a later commit moves only its own, and a fleet's records get the marks in the byte order of their
    /// names ("jobs/10" before "jobs/2"), which their JSON is written in.
    @Test func offsetsAndMarksOfAnyNumberOfPartitionsAreStoredAndNamedInByteOrder() throws {
        let store = try StateStore(directory: Self.directory())
        let events = (0..<300).map { TopicPartition(topic: "email.received", partition: Int32($0)) }
        let jobs = (0..<300).map { TopicPartition(topic: "mailpush.push-jobs", partition: Int32($0)) }
        let dead = TopicPartition(topic: "mailpush.dead-letters", partition: 7)
        try store.commitEventBatch(
            offsets: Dictionary(uniqueKeysWithValues: events.map { ($0, Int64($0.partition) + 1) }), processedEmails: [],
            processedAtMs: 1, outputMarks: Dictionary(uniqueKeysWithValues: (jobs + [dead]).map { ($0, Int64($0.partition) * 2) }))
        #expect(try store.offsets() == Dictionary(uniqueKeysWithValues: events.map { ($0, Int64($0.partition) + 1) }))

        var named: [NamedOutputMark] = []
        try store.commitEventBatch(
            offsets: [events[5]: 100], processedEmails: [], processedAtMs: 2, outputMarks: [jobs[10]: 1_000],
            stateRecords: { marks in
                named = marks
                return UnwrittenStateRecord.Batch(marks: [], records: [(events[5], [1])])
            })
        var expected = Dictionary(uniqueKeysWithValues: (jobs + [dead]).map { ($0, Int64($0.partition) * 2) })
        expected[jobs[10]] = 1_000
        #expect(try store.outputMarks() == expected)
        #expect(try store.offsets()[events[5]] == 100 && store.offsets()[events[6]] == 7)
        #expect(named.map(\.name) == expected.keys.map(\.name).sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) })
        #expect(named.first { $0.name == "mailpush.push-jobs/10" }?.offset == 1_000 && named.count == 301)
        #expect(named.map(\.name).prefix(3) == ["mailpush.dead-letters/7", "mailpush.push-jobs/0", "mailpush.push-jobs/1"])
    }

    /// A group member's commit hands its state records the marks table as it stands after the commit, whatever
    /// changed the marks since the commit before: that commit, `setOutputMarks`, restored partitions, or a write
    /// this store did not make (another connection).
    @Test func aCommitsStateRecordsGetTheMarksTableAsItStandsAfterIt() throws {
        let dir = Self.directory()
        let store = try StateStore(directory: dir)
        let events = TopicPartition(topic: "email.received", partition: 0)
        let jobs = (0..<12).map { TopicPartition(topic: "mailpush.push-jobs", partition: Int32($0)) }
        var offset: Int64 = 0
        func commit(_ marks: [TopicPartition: Int64]) throws -> [NamedOutputMark] {
            offset += 1
            var named: [NamedOutputMark] = []
            try store.commitEventBatch(
                offsets: [events: offset], processedEmails: [], processedAtMs: offset, outputMarks: marks,
                stateRecords: { marks in
                    named = marks
                    return UnwrittenStateRecord.Batch(marks: [], records: [(events, [1])])
                })
            return named
        }
        func table() throws -> [NamedOutputMark] {
            try store.outputMarks().map { NamedOutputMark(name: $0.key.name, offset: $0.value) }
                .sorted { $0.name.precedesInByteOrder($1.name) }
        }
        func expectTable(_ named: [NamedOutputMark], _ comment: Comment? = nil) throws {
            let table = try table()
            #expect(named == table, comment)
        }

        try expectTable(commit([jobs[2]: 20, jobs[10]: 100]))
        try expectTable(commit([jobs[1]: 10, jobs[2]: 21]), "one added before the others, one moved")
        try store.setOutputMarks([jobs[3]: 30])
        try expectTable(commit([jobs[2]: 22]))
        try store.applyRestored([
            RestoredPartition(
                partition: events, offset: offset, outputMarks: [jobs[10]: 5], processedEmails: [:],
                owner: PartitionOwnerRecord(epoch: 1, stateNextOffset: 0))
        ])
        try expectTable(commit([:]))
        offset += 1
        try store.commitEventBatch(offsets: [events: offset], processedEmails: [], processedAtMs: 1, outputMarks: [jobs[11]: 11])
        try expectTable(commit([jobs[2]: 23]), "after a commit without state records")
        let other = try DatabaseQueue(path: "\(dir)/\(StateStore.fileName)")
        try other.write { try $0.execute(sql: "UPDATE output_mark SET scan_from = 7 WHERE partition = 1") }
        let named = try commit([jobs[4]: 40])
        try expectTable(named)
        #expect(named.map(\.name) == ["1", "10", "11", "2", "3", "4"].map { "mailpush.push-jobs/\($0)" })
        #expect(named.map(\.offset) == [7, 5, 11, 23, 30, 40])
    }

    @Test func offsetsConfigAndDedupeSurviveReopening() throws {
        let dir = Self.directory()
        do {
            let store = try StateStore(directory: dir)
            let devices = TopicPartition(topic: "mailpush.devices", partition: 1)
            try store.applyConfig(
                [
                    ConfigChange(table: .devices, id: "dev-1", owner: "user-1", value: Array("{}".utf8)),
                    ConfigChange(table: .devices, id: "dev-2", owner: "user-1", value: Array("{}".utf8)),
                    ConfigChange(table: .addressKeys, id: "em-1", owner: "user-1", value: Array("{\"k\":1}".utf8)),
                ],
                offsets: [devices: 3])
            try store.applyConfig([ConfigChange(table: .devices, id: "dev-2", owner: nil, value: nil)], offsets: [devices: 4])
            let events = TopicPartition(topic: "email.received", partition: 0)
            try store.commitEventBatch(
                offsets: [events: 10], processedEmails: ["a", "b"], processedAtMs: 1000,
                outputMarks: [TopicPartition(topic: "mailpush.push-jobs", partition: 2): 7])
        }
        let store = try StateStore(directory: dir)
        #expect(try store.devices().map(\.deviceId) == ["dev-1"], "the tombstone deleted dev-2")
        #expect(try store.addressKeys().map(\.record) == [Array("{\"k\":1}".utf8)])
        #expect(
            try store.offsets() == [
                TopicPartition(topic: "mailpush.devices", partition: 1): 4,
                TopicPartition(topic: "email.received", partition: 0): 10,
            ])
        #expect(try store.outputMarks() == [TopicPartition(topic: "mailpush.push-jobs", partition: 2): 7])
        #expect(try store.processedEmails(among: ["a", "b", "c"], sinceMs: 0) == ["a", "b"])
        #expect(try store.processedEmails(among: ["a"], sinceMs: 1001) == [], "outside the window")
    }

    @Test func aKeysChangesInOneChunkApplyInTheirOrder() throws {
        let store = try StateStore(
            directory: TestDirectories.path("mailpush-order"))
        try store.applyConfig(
            [
                ConfigChange(table: .devices, id: "dev-b", owner: "user-1", value: Array("{\"v\":1}".utf8)),
                ConfigChange(table: .devices, id: "dev-a", owner: "user-1", value: Array("{\"v\":1}".utf8)),
                ConfigChange(table: .devices, id: "dev-b", owner: nil, value: nil),
                ConfigChange(table: .devices, id: "dev-c", owner: nil, value: nil),
                ConfigChange(table: .devices, id: "dev-c", owner: "user-2", value: Array("{\"v\":2}".utf8)),
                ConfigChange(table: .devices, id: "dev-a", owner: "user-3", value: Array("{\"v\":3}".utf8)),
            ],
            offsets: [:])
        let rows = try store.devices(owners: ["user-1", "user-2", "user-3"], ownerBytes: .max, totalBytes: .max).rows
        #expect(rows.map(\.deviceId).sorted() == ["dev-a", "dev-c"], "dev-b registered, then deleted")
        #expect(rows.first { $0.deviceId == "dev-a" }.map { ($0.owner, $0.registration) }! == ("user-3", Array("{\"v\":3}".utf8)))
        #expect(rows.first { $0.deviceId == "dev-c" }.map { ($0.owner, $0.registration) }! == ("user-2", Array("{\"v\":2}".utf8)))
    }

    /// A read of many owners holds whole owners up to its budgets and names the rest, so no owner's devices are ever
    /// held at once; `forEachDevicePage` hands those over in pages.
    @Test func aReadOfOwnersStopsAtItsBudgetsAndLargeOwnersComeInPages() throws {
        let store = try StateStore(directory: Self.directory())
        let value = [UInt8](repeating: UInt8(ascii: "x"), count: 100)
        var changes = (0..<30).map { ConfigChange(table: .devices, id: "dev-big-\($0)", owner: "big", value: value) }
        changes += (0..<10).map { ConfigChange(table: .devices, id: "dev-\($0)", owner: "user-\($0)", value: value) }
        try store.applyConfig(changes, offsets: [:])

        let owners = ["user-0", "big", "user-1"] + (2..<10).map { "user-\($0)" }
        let read = try store.devices(owners: owners, ownerBytes: 500, totalBytes: 650)
        #expect(read.unread.contains("big"), "3,000 bytes: more than one owner may take")
        #expect(read.rows.map(\.owner) == ["user-0", "user-1", "user-2", "user-3", "user-4", "user-5"], "owner by owner, 600 bytes")
        #expect(Set(read.unread) == ["big", "user-6", "user-7", "user-8", "user-9"], "the rest: past 650 bytes")
        #expect(read.tooLarge == ["big"])
        #expect(read.bytesByOwner["user-0"] == 100 && read.bytesByOwner["big"] == nil)

        var pages: [[String]] = []
        try store.forEachDevicePage(owner: "big", pageBytes: 1_000) { page in pages.append(page.map(\.deviceId)) }
        #expect(pages.map(\.count) == [10, 10, 10])
        #expect(pages.flatMap { $0 } == (0..<30).map { "dev-big-\($0)" }.sorted { $0.precedesInByteOrder($1) })
    }

    @Test func devicesAreReadByOwnerAndKeysByAddress() throws {
        let store = try StateStore(directory: Self.directory())
        // More owners than one statement names (lookupChunk), and an owner change.
        var changes = (0..<1200).map {
            ConfigChange(table: .devices, id: "dev-\($0)", owner: "user-\($0 % 600)", value: Array("{\"n\":\($0)}".utf8))
        }
        changes.append(ConfigChange(table: .devices, id: "dev-0", owner: "user-moved", value: Array("{}".utf8)))
        changes += (0..<3).map { ConfigChange(table: .addressKeys, id: "em-\($0)", owner: nil, value: Array("{\"k\":\($0)}".utf8)) }
        try store.applyConfig(changes, offsets: [:])

        let rows = try store.devices(owners: (0..<600).map { "user-\($0)" } + ["user-moved", "nobody"], ownerBytes: .max, totalBytes: .max)
            .rows
        #expect(rows.count == 1200)
        #expect(Set(rows.filter { $0.owner == "user-0" }.map(\.deviceId)) == ["dev-600"], "dev-0 moved away")
        #expect(rows.first { $0.deviceId == "dev-0" }.map { ($0.owner, $0.registration) }! == ("user-moved", Array("{}".utf8)))
        #expect(try store.devices(owners: [], ownerBytes: .max, totalBytes: .max).rows.isEmpty)
        #expect(try store.devices(owners: ["user-7"], ownerBytes: .max, totalBytes: .max).rows.map(\.deviceId) == ["dev-607", "dev-7"])

        let keys = try store.addressKeys(addresses: ["em-2", "em-0", "em-9"])
        #expect(
            Dictionary(uniqueKeysWithValues: keys.map { ($0.emailAddressId, $0.record) }) == [
                "em-0": Array("{\"k\":0}".utf8), "em-2": Array("{\"k\":2}".utf8),
            ])
        #expect(try store.configCounts() == (devices: 1200, addressKeys: 3))
    }

    @Test func dedupeEntriesExpireInKeyOrderInBoundedPieces() async throws {
        let store = try StateStore(directory: Self.directory())
        let old = (0..<25).map { String(format: "old-%02d", $0) }
        try store.commitEventBatch(offsets: [:], processedEmails: old, processedAtMs: 100, outputMarks: [:])
        try store.commitEventBatch(offsets: [:], processedEmails: ["new", "old-10a"], processedAtMs: 5000, outputMarks: [:])
        var pieces: [(lastKey: String?, scanned: Int, expired: Int)] = []
        var next = (key: "", including: true)
        repeat {
            pieces.append(
                try store.expireProcessedEmails(from: next.key, including: next.including, below: nil, beforeMs: 1000, scanning: 10))
            next = (pieces.last?.lastKey ?? "", false)
        } while pieces.last?.lastKey != nil
        // Keys in order: new, old-00 … old-10, old-10a, old-11 … old-24; each piece looks at ten of them.
        #expect(pieces.map(\.lastKey) == ["old-08", "old-17", "old-24", nil])
        #expect(pieces.map(\.scanned) == [10, 10, 7, 0])
        #expect(pieces.map(\.expired) == [9, 9, 7, 0], "only the expired among the keys a piece looked at")
        #expect(try store.processedEmails(among: ["new", "old-10a", "old-00"], sinceMs: 0) == ["new", "old-10a"])
        #expect(try await store.processedEmailCount() == 2)
    }

    /// Whether `key` lies in `range`, a slice of `StateStore.dedupeSlice`.
    static func slice(_ range: (start: String, below: String?), holds key: String) -> Bool {
        range.start <= key && (range.below.map { key < $0 } ?? true)
    }

    /// A sweep's slices together hold every key once, hashes or not, and a slice expires only its own keys.
    @Test func theSweepsSlicesCoverEveryKeyOnce() async throws {
        var generator = SplitMix64(seed: 46)
        let hashes = (0..<400).map { _ in String(format: "%016llx%016llx", generator.next(), generator.next()) }
        let odd = ["", "0", "05a0", "05a", "ffff", "ffffffff", "zzz", "é", "0000", "\u{10FFFF}"]
        for slices in [1, 7, 1440, 4096] {
            let bounds = (0..<slices).map { StateStore.dedupeSlice($0, of: slices) }
            for key in hashes + odd {
                let holders = bounds.filter { Self.slice($0, holds: key) }
                #expect(holders.count == 1, "\(key) in \(holders.count) of \(slices) slices")
            }
            #expect(zip(bounds, bounds.dropFirst()).allSatisfy { $0.below == $1.start }, "adjacent")
        }

        let store = try StateStore(directory: Self.directory())
        let keys = hashes + odd.filter { !$0.isEmpty }
        try store.commitEventBatch(offsets: [:], processedEmails: keys, processedAtMs: 100, outputMarks: [:])
        try store.commitEventBatch(offsets: [:], processedEmails: ["fresh"], processedAtMs: 5000, outputMarks: [:])
        var expired = 0
        for slice in 0..<7 {
            let range = StateStore.dedupeSlice(slice, of: 7)
            let inSlice = keys.filter { Self.slice(range, holds: $0) }
            let swept = try await store.expireProcessedEmails(slice: slice, of: 7, beforeMs: 1000, scanning: 16)
            #expect(swept.expired == inSlice.count, "slice \(slice) expired its own keys")
            #expect(swept.kept == (Self.slice(range, holds: "fresh") ? 1 : 0))
            expired += swept.expired
        }
        #expect(expired == keys.count)
        #expect(try await store.processedEmailCount() == 1, "the entry inside the window stays")
    }

    /// The service's gauge of the window's size: what one slice kept, times the slices.
    @Test func oneSlicesEntriesEstimateTheWindowsSize() async throws {
        var generator = SplitMix64(seed: 4_600)
        let store = try StateStore(directory: Self.directory())
        let keys = (0..<4_000).map { _ in String(format: "%016llx%016llx", generator.next(), generator.next()) }
        try store.commitEventBatch(offsets: [:], processedEmails: keys, processedAtMs: 5000, outputMarks: [:])
        let swept = try await store.expireProcessedEmails(slice: 3, of: 16, beforeMs: 1000)
        #expect(swept.expired == 0)
        #expect(abs(swept.kept * 16 - 4_000) < 600, "\(swept.kept) × 16 against 4,000")
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

    @Test func aForwardClockJumpDoesNotDropTheDedupeWindow() async throws {
        let store = try StateStore(directory: Self.directory())
        let minute: Int64 = 60_000
        let window = 7 * 24 * 60 * minute
        let t0: Int64 = 1_800_000_000_000
        try store.commitEventBatch(offsets: [:], processedEmails: ["old"], processedAtMs: t0 - 6 * 24 * 60 * minute, outputMarks: [:])
        try store.commitEventBatch(offsets: [:], processedEmails: ["recent"], processedAtMs: t0, outputMarks: [:])

        // A normal run: the horizon is the window's start.
        let normal = try store.advanceDedupeHorizon(towardMs: t0 - window, windowMs: window, maxAdvanceMs: 2 * minute)
        #expect(normal == t0 - window)
        #expect(try await store.expireProcessedEmails(slice: 0, of: 1, beforeMs: normal).expired == 0)

        // The wall clock jumps 8 days (more than the window) a minute later; runs keep coming every minute.
        let jumped = t0 + minute + 8 * 24 * 60 * minute
        var horizon = normal
        for run in 0..<10 {
            horizon = try store.advanceDedupeHorizon(
                towardMs: jumped + Int64(run) * minute - window, windowMs: window, maxAdvanceMs: 2 * minute)
            try await store.expireProcessedEmails(slice: 0, of: 1, beforeMs: horizon)
        }
        #expect(horizon == normal + 20 * minute, "expiry moved at most two minutes per run")
        #expect(try store.dedupeHorizonMs() == horizon)
        #expect(try await store.processedEmailCount() == 2, "both entries are still inside the window they were given")
        // The lookup the pipeline does (window start = min(now - window, horizon)) still finds them.
        #expect(try store.processedEmails(among: ["old", "recent"], nowMs: jumped, windowMs: window) == ["old", "recent"])
        #expect(try store.processedEmails(among: ["old", "recent"], sinceMs: jumped - window) == [], "without the horizon")

        // Expiry still happens, at real-time speed: a day of runs later "old" (then 7 days old in real time) is gone.
        for run in 10..<(10 + 24 * 60) {
            horizon = try store.advanceDedupeHorizon(
                towardMs: jumped + Int64(run) * minute - window, windowMs: window, maxAdvanceMs: 2 * minute)
        }
        try await store.expireProcessedEmails(slice: 0, of: 1, beforeMs: horizon)
        #expect(try store.processedEmails(among: ["old", "recent"], sinceMs: horizon) == ["recent"])
        #expect(try store.processedEmails(among: ["old", "recent"], nowMs: jumped + 24 * 60 * minute, windowMs: window) == ["recent"])
    }

    /// The service cancels its checkpoint task at shutdown: a checkpoint cut short that way did nothing, and
    /// must not be reported as a failure ("state checkpoint failed" was logged at shutdown).
    @Test func aCheckpointInACancelledTaskIsNotAFailure() async throws {
        let store = try StateStore(directory: Self.directory(), checkpointsInBackground: true)
        try store.commitEventBatch(offsets: [:], processedEmails: ["a"], processedAtMs: 1, outputMarks: [:])
        let outcome = await Task { () async -> Result<Int, any Error> in
            withUnsafeCurrentTask { $0?.cancel() }
            do { return .success(try await store.checkpoint()) } catch { return .failure(error) }
        }.value
        #expect(throws: Never.self) { try outcome.get() }
        #expect(try await store.checkpoint() >= 0, "a later checkpoint still runs")
    }

    /// Cancelled while it runs, a checkpoint is interrupted by SQLite (`SQLITE_INTERRUPT`): also no failure. A clean
    /// stop of a service with a long log to copy (1,000 partitions) logged "state checkpoint failed … interrupted".
    @Test func aCheckpointInterruptedByItsTasksCancellationIsNotAFailure() async throws {
        let store = try StateStore(directory: Self.directory(), checkpointsInBackground: true)
        let events = TopicPartition(topic: "email.received", partition: 0)
        var interruptedOrNot: [Result<Int, any Error>] = []
        for round in 0..<8 {
            for batch in 0..<20 {
                let keys = (0..<300).map { _ in UUID().uuidString }
                try store.commitEventBatch(
                    offsets: [events: Int64(round * 100 + batch + 1)], processedEmails: keys, processedAtMs: 1000, outputMarks: [:])
            }
            let task = Task { () async -> Result<Int, any Error> in
                do { return .success(try await store.checkpoint()) } catch { return .failure(error) }
            }
            try await Task.sleep(for: .microseconds(500 * (round + 1)))
            task.cancel()
            interruptedOrNot.append(await task.value)
        }
        for outcome in interruptedOrNot { #expect(throws: Never.self) { try outcome.get() } }
        #expect(try await store.checkpoint() >= 0, "a later checkpoint still runs")
    }

    @Test func theHorizonOfAnOlderStateStartsFromItsNewestEntry() throws {
        let store = try StateStore(directory: Self.directory())
        try store.commitEventBatch(offsets: [:], processedEmails: ["a"], processedAtMs: 5_000_000, outputMarks: [:])
        #expect(try store.dedupeHorizonMs() == nil)
        // First run after a jump far ahead: starts at newest - window, then moves by the cap only.
        let horizon = try store.advanceDedupeHorizon(towardMs: 900_000_000, windowMs: 1_000_000, maxAdvanceMs: 120_000)
        #expect(horizon == 5_000_000 - 1_000_000 + 120_000)
        // A backward jump is taken at once (it only keeps entries longer).
        #expect(try store.advanceDedupeHorizon(towardMs: 1_000, windowMs: 1_000_000, maxAdvanceMs: 120_000) == 1_000)
    }

    @Test func stateIsOwnerOnly() throws {
        let parent = Self.directory()
        let dir = parent + "/nested/state"
        let store = try StateStore(directory: dir)
        try store.commitEventBatch(offsets: [:], processedEmails: ["a"], processedAtMs: 1, outputMarks: [:])
        func mode(_ path: String) throws -> Int {
            let attributes = try FileManager.default.attributesOfItem(atPath: path)
            return (attributes[.posixPermissions] as! NSNumber).intValue & 0o777
        }
        #expect(try mode(dir) == 0o700)
        let files = try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasPrefix(StateStore.fileName) }
        #expect(Set(files).isSuperset(of: [StateStore.fileName, StateStore.fileName + "-wal", StateStore.fileName + "-shm"]))
        for file in files {
            #expect(try mode(dir + "/" + file) == 0o600, "\(file)")
        }
    }

    @Test func anOlderStatesFilesAreTightened() throws {
        let dir = Self.directory()
        do { _ = try StateStore(directory: dir) }
        let db = dir + "/" + StateStore.fileName
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: db)
        _ = try StateStore(directory: dir)
        let attributes = try FileManager.default.attributesOfItem(atPath: db)
        #expect((attributes[.posixPermissions] as! NSNumber).intValue & 0o777 == 0o600)
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
            try store.commitReplayBatch(
                id: id, cursors: [0: 4], counts: counts, processedEmails: ["a"], processedAtMs: 2,
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
