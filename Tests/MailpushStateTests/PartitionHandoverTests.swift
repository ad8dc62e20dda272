import Foundation
import MailpushPartition
import MailpushState
import MailpushTestSupport
import Testing

@Suite struct PartitionHandoverTests {
    let p3 = TopicPartition(topic: "email.received", partition: 3)
    let jobs0 = TopicPartition(topic: "mailpush.push-jobs", partition: 0)
    let jobs1 = TopicPartition(topic: "mailpush.push-jobs", partition: 1)

    func store() throws -> StateStore {
        try StateStore(
            directory: TestDirectories.path("mailpush-handover"))
    }

    /// A batch's records are stored as one row with its commit; the records set aside become rows of their own, and
    /// the batch leaves once resolved; a batch still stored at the next start (a crash) is split whole.
    @Test func aStoredBatchKeepsItsRecordsUntilEachIsWrittenOrSetAside() throws {
        let store = try store()
        let p4 = TopicPartition(topic: "email.received", partition: 4)
        let records = [(p3, Array("three".utf8)), (p4, Array(repeating: UInt8(7), count: 70_000))]
        func commit(_ offset: Int64) throws -> Int64 {
            try #require(
                try store.commitEventBatch(
                    offsets: [p3: offset], processedEmails: [], processedAtMs: 1, outputMarks: [jobs0: offset],
                    stateRecords: { marks in
                        let jobs0Mark = marks.first { $0.name == jobs0.name }!.offset
                        return UnwrittenStateRecord.Batch(marks: Array("\(jobs0Mark)".utf8), records: records)
                    }))
        }
        let first = try commit(5)
        let second = try commit(6)
        #expect(try store.unwrittenStateRecords(except: []).isEmpty, "a batch waiting for its write is not a record of its own")

        try store.stateBatchesResolved([first], setAside: [first: [p4], second: [p3]], deletable: [])
        let aside = try store.unwrittenStateRecords(except: [])
        #expect(aside.map { [$0.partition.partition: $0.value] } == [[4: records[1].1], [3: Array("three".utf8)]])
        #expect(aside.map(\.marks) == [Array("5".utf8), Array("6".utf8)], "each with its own batch's marks")

        #expect(try store.splitUnwrittenBatches() == 1, "the second batch, left by a crash")
        let all = try store.unwrittenStateRecords(except: [])
        #expect(all.count == 4, "split whole: its record set aside before is there twice, which writing twice allows")
        #expect(Array(all.suffix(2)).map(\.partition) == [p3, p4] && all.suffix(2).allSatisfy { $0.marks == Array("6".utf8) })
        #expect(try store.splitUnwrittenBatches() == 0)
    }

    @Test func aRestoredPartitionOnlyLowersMarksAndAddsEntries() throws {
        let store = try store()
        try store.commitEventBatch(offsets: [p3: 5], processedEmails: ["local"], processedAtMs: 100, outputMarks: [jobs0: 50, jobs1: 10])
        try store.applyRestored([
            RestoredPartition(
                partition: p3, offset: 40, outputMarks: [jobs0: 20, jobs1: 30], processedEmails: ["restored": 200, "local": 50],
                owner: PartitionOwnerRecord(epoch: 7, stateNextOffset: 12))
        ])
        #expect(try store.offsets()[p3] == 40)
        #expect(try store.outputMarks() == [jobs0: 20, jobs1: 10], "a mark may only move back")
        #expect(try store.processedEmails(among: ["local", "restored"], sinceMs: 0) == ["local", "restored"])
        #expect(try store.processedEmails(among: ["local"], sinceMs: 99) == ["local"], "the later processing time is kept")
        #expect(try store.partitionOwners()[p3] == PartitionOwnerRecord(epoch: 7, stateNextOffset: 12))
    }

    @Test func restoredPartitionsAppliedTogetherMeetTheSameRules() throws {
        let store = try store()
        let p4 = TopicPartition(topic: "email.received", partition: 4)
        try store.commitEventBatch(offsets: [p3: 5], processedEmails: ["local"], processedAtMs: 100, outputMarks: [jobs0: 50, jobs1: 10])
        try store.applyRestored([
            RestoredPartition(
                partition: p3, offset: 40, outputMarks: [jobs0: 20, jobs1: 30], processedEmails: ["three": 200, "local": 50],
                owner: PartitionOwnerRecord(epoch: 7, stateNextOffset: 12)),
            RestoredPartition(
                partition: p4, offset: 9, outputMarks: [jobs0: 35, jobs1: 5], processedEmails: ["four": 300],
                owner: PartitionOwnerRecord(epoch: 2, stateNextOffset: 3)),
        ])
        #expect(try store.offsets()[p3] == 40)
        #expect(try store.offsets()[p4] == 9)
        #expect(try store.outputMarks() == [jobs0: 20, jobs1: 5], "each mark the lowest of the local and every restored one")
        #expect(try store.processedEmails(among: ["local", "three", "four"], sinceMs: 0) == ["local", "three", "four"])
        #expect(try store.partitionOwners()[p3] == PartitionOwnerRecord(epoch: 7, stateNextOffset: 12))
        #expect(try store.partitionOwners()[p4] == PartitionOwnerRecord(epoch: 2, stateNextOffset: 3))
    }

    @Test func unreleasedPartitionsKeepTheMarksOfTheirLastRun() throws {
        let store = try store()
        try store.setOutputMarks([jobs0: 8])
        try store.setPartitionOwner(p3, PartitionOwnerRecord(epoch: 2, stateNextOffset: 4))
        let released = TopicPartition(topic: "email.received", partition: 1)
        try store.setPartitionOwner(released, PartitionOwnerRecord(epoch: 1, stateNextOffset: 9, marks: [jobs0: 3]))
        try store.keepMarksOfUnreleasedPartitions()
        try store.setOutputMarks([jobs0: 100])
        #expect(try store.partitionOwners()[p3]?.marks == [jobs0: 8])
        #expect(try store.partitionOwners()[released]?.marks == [jobs0: 3])
    }

    @Test func deletableRecordsAreListedOnceNeededNoMoreAndForgotten() throws {
        let store = try store()
        func record(_ partition: TopicPartition, _ key: String, _ at: Int64, _ covered: Int64?) -> DeletableStateRecord {
            DeletableStateRecord(partition: partition, key: key, deleteAfterMs: at, coveredAt: covered)
        }
        try store.recordDeletableStateRecords([
            record(p3, "a", 100, 10), record(p3, "b", 300, 20), record(jobs0, "other", 50, nil), record(p3, "noEntries", 0, 30),
            record(p3, "r/replay/x/progress/5", 0, nil), record(p3, "r/replay/x", 0, nil),
        ])
        func deletable(_ checkpoint: Int64, before: Int64, progress: Bool = false) throws -> [String] {
            try store.deletableStateRecords(checkpoints: [p3: checkpoint], beforeMs: before, progress: progress, limit: 10).map(\.key)
                .sorted()
        }
        let expired = try store.deletableStateRecords(checkpoints: [p3: 20], beforeMs: 200, progress: false, limit: 10)
        #expect(expired.map(\.key).sorted() == ["a", "r/replay/x"], "noEntries waits for a checkpoint at 30")
        try store.forgetDeletableStateRecords(expired)
        #expect(try deletable(20, before: 200).isEmpty)
        #expect(try deletable(20, before: 200, progress: true) == ["r/replay/x/progress/5"])
        #expect(try deletable(30, before: 400) == ["b", "noEntries"])
        #expect(try deletable(-1, before: 400).isEmpty)
    }

    @Test func fleetReplaysMapToLocalRequestsAndTagTheirOutputs() throws {
        let store = try store()
        let local = try store.submitFleetReplay(
            replayId: "r-1", eventsTopic: "email.received", partition: 3, next: 10, end: 20, force: true, nowMs: 0)
        #expect(try store.fleetReplayLocalId(replayId: "r-1", partition: 3) == local)
        #expect(store.replayTag(localId: local) == "r-1")
        let plain = try store.submitReplay(
            eventsTopic: "email.received", cursors: [.init(partition: 0, next: 0, end: 5)], force: false, nowMs: 0)
        #expect(store.replayTag(localId: plain) == "request-\(plain)")
        #expect(try store.instanceId() == (try store.instanceId()), "one identity per state directory")
    }

    @Test func aFleetReplayContinuedFromAnotherOwnersProgressCountsThePartFromItsStart() throws {
        let store = try store()
        var done = ReplayRequest.Counts()
        done.eventsRead = 30
        done.jobs = 50
        done.deadLetters = 2
        let local = try store.submitFleetReplay(
            replayId: "r-1", eventsTopic: "email.received", partition: 3, next: 40, end: 60, force: false, nowMs: 0, done: done)
        let request = try #require(try store.replay(id: local))
        #expect(request.counts == done)
        #expect(request.eventsTotal - request.counts.eventsRead == 20, "what is left to read: 40 to 60")
    }

    @Test func thePartitionsWithAFleetReplayToRunAreThoseOfItsPendingRequests() throws {
        let store = try store()
        let running = try store.submitFleetReplay(
            replayId: "r-1", eventsTopic: "email.received", partition: 3, next: 10, end: 20, force: false, nowMs: 0)
        let finished = try store.submitFleetReplay(
            replayId: "r-1", eventsTopic: "email.received", partition: 5, next: 0, end: 20, force: false, nowMs: 0)
        _ = try store.submitReplay(eventsTopic: "email.received", cursors: [.init(partition: 7, next: 0, end: 5)], force: false, nowMs: 0)
        try store.finishReplay(id: finished, status: .done)
        #expect(try store.partitionsWithPendingFleetReplays() == [3], "a local replay's partition 7 is no fleet replay")
        try store.finishReplay(id: running, status: .done, detail: "left to the partition's owner")
        #expect(try store.partitionsWithPendingFleetReplays().isEmpty)
    }
}
