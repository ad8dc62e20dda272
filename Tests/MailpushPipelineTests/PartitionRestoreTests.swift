import Foundation
import MailpushPartition
import Testing

@testable import MailpushPipeline

/// The fold a new owner continues from (docs/exactly-once.md, "A fleet"): epochs fence, a missing batch record
/// stops the chain, every record's dedupe entries count, replays travel with their progress.
struct PartitionRestoreTests {
    let jobs0 = TopicPartition(topic: "mailpush.push-jobs", partition: 0)

    func record(
        _ kind: PartitionStateRecord.Kind, epoch: Int64, owner: String, from: Int64? = nil, offset: Int64, mark: Int64 = 0,
        emails: [String]? = nil
    ) -> PartitionStateRecord {
        PartitionStateRecord(
            kind: kind, topic: "email.received", partition: 3, epoch: epoch, owner: owner, from: from, offset: offset,
            marks: PartitionStateRecord.encodeMarks([jobs0: mark]), processedAtMs: emails == nil ? nil : 1000, emails: emails)
    }

    @Test func followsTheLatestOwnersChainOfBatches() {
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 1, owner: "a", offset: 0))
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, mark: 5, emails: ["e1"]))
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 10, offset: 20, mark: 9, emails: ["e2"]))
        #expect(fold.offset == 20)
        #expect(fold.marks == [jobs0: 9])
        #expect(fold.owner == "a")
        #expect(!fold.released)
        #expect(Set(fold.emails.keys) == ["e1", "e2"])
    }

    /// Batches committed while a write of batch records is under way are joined per partition
    /// (`BatchStatePublisher`): following the joined record reaches the state the separate ones reach.
    @Test func joinedBatchRecordsRestoreWhatTheSeparateOnesDo() {
        let claim = record(.claim, epoch: 1, owner: "a", offset: 0)
        let batches = [
            record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, mark: 5, emails: ["e1"]),
            record(.batch, epoch: 1, owner: "a", from: 10, offset: 20, mark: 9, emails: ["e2"]),
            record(.batch, epoch: 1, owner: "a", from: 20, offset: 25, mark: 11, emails: ["e3"]),
        ]
        var waiting: [BatchStatePublisher.Queued] = []
        for (stored, batch) in batches.enumerated() {
            BatchStatePublisher.queue(.init(record: batch, batches: [Int64(stored)]), into: &waiting)
        }
        #expect(waiting.count == 1)
        #expect(waiting.first?.batches == [0, 1, 2], "the joined record's write counts for every batch it joins")
        var separate = PartitionRestore()
        var joined = PartitionRestore()
        for record in [claim] + batches { separate.apply(record) }
        for record in [claim] + waiting.map(\.record) { joined.apply(record) }
        #expect(joined.offset == 25 && joined.marks == [jobs0: 11])
        #expect(joined.offset == separate.offset && joined.marks == separate.marks && joined.emails.keys == separate.emails.keys)
        #expect(waiting.first?.record.key == batches.last?.key)
    }

    @Test func batchRecordsAreJoinedOnlyWhenOneContinuesTheOther() {
        let first = record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, emails: ["e1"])
        #expect(first.joined(with: record(.batch, epoch: 1, owner: "a", from: 12, offset: 20, emails: ["e2"])) == nil, "a gap")
        #expect(first.joined(with: record(.batch, epoch: 2, owner: "b", from: 10, offset: 20, emails: ["e2"])) == nil, "a new owner")
        #expect(first.joined(with: record(.release, epoch: 1, owner: "a", offset: 10)) == nil)
        // The later record's key is deleted when its own entries expire: entries never move to a key without any.
        #expect(first.joined(with: record(.batch, epoch: 1, owner: "a", from: 10, offset: 20)) == nil)
        #expect(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10).joined(with: first) == nil, "not continuing")
        let empty = record(.batch, epoch: 1, owner: "a", from: 0, offset: 10)
        #expect(empty.joined(with: record(.batch, epoch: 1, owner: "a", from: 10, offset: 20, emails: ["e2"]))?.from == 0)
    }

    /// While a slow state partition held the writes back, joining grew one record past what the producer takes; a
    /// record refused for its size was then retried forever, with every other record of the write.
    @Test func joinedRecordsStayUnderWhatTheProducerTakes() {
        let emails = { (prefix: String, count: Int) in (0..<count).map { "\(prefix)\($0)" } }
        let half = PartitionStateRecord.maxEmails / 2
        let first = record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, emails: emails("a", half))
        let second = record(.batch, epoch: 1, owner: "a", from: 10, offset: 20, emails: emails("b", half))
        let third = record(.batch, epoch: 1, owner: "a", from: 20, offset: 30, emails: emails("c", 1))
        var waiting: [BatchStatePublisher.Queued] = []
        for next in [first, second, third] { BatchStatePublisher.queue(.init(record: next, batches: [next.offset]), into: &waiting) }
        #expect(waiting.map(\.record.from) == [0, 20], "the third starts a record of its own")
        #expect(waiting.map { $0.record.emails?.count ?? 0 } == [2 * half, 1])
        #expect(waiting.map(\.batches) == [[10, 20], [30]])
        // 25,000 entries: the record as written stays under librdkafka's default message.max.bytes.
        let digests = Array(repeating: String(repeating: "f", count: 32), count: PartitionStateRecord.maxEmails)
        let full = record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, emails: digests)
        #expect(full.encoded().count < 1_000_000 - 10_000)
    }

    /// `mailpush offsets --set` in a fleet: a position request moves the partition for whoever claims it next,
    /// whatever the owner's records after it say (it had not seen the request yet); a claim after it took it up.
    @Test func aPositionRequestMovesThePartitionUntilAClaimTakesItUp() {
        let request = PartitionStateRecord.position(
            topic: "email.received", partition: 3, requestedBy: "ops", host: "laptop", offset: 4, marks: [jobs0: 70])
        #expect(request.key == "email.received/3/position")
        #expect(PartitionStateRecord.decode(request.encoded()) == request)
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 1, owner: "a", offset: 0))
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, mark: 5, emails: ["e1"]))
        fold.apply(request)
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 10, offset: 20, mark: 9, emails: ["e2"]))
        #expect(fold.pendingPosition == request)
        #expect(fold.epoch == 1 && fold.owner == "a", "a request fences nobody")
        var takenUp = fold
        takenUp.takeUpPosition()
        #expect(takenUp.offset == 4 && takenUp.marks == [jobs0: 70] && takenUp.position == request)
        #expect(takenUp.pendingPosition == nil)
        #expect(!takenUp.released, "the owner that had not seen the request may still have outputs in flight")
        #expect(Set(takenUp.emails.keys) == ["e1", "e2"], "the dedupe entries of every batch stay")

        // The claim that took it up comes after it: later restores follow that claim's owner.
        fold.apply(record(.claim, epoch: 2, owner: "b", offset: 4, mark: 70))
        fold.apply(record(.batch, epoch: 2, owner: "b", from: 4, offset: 8, mark: 72))
        #expect(fold.pendingPosition == nil)
        fold.takeUpPosition()
        #expect(fold.offset == 8 && fold.position == nil)

        var hostile = request
        hostile.offset = -2
        fold.apply(hostile)
        #expect(fold.pendingPosition == nil, "a negative offset is no request")
    }

    /// A claim whose restore stopped reading before the request landed comes after it in the log, but continues
    /// from the owner's chain: the request still waits, for that owner's first renewal or, if it dies first, for the
    /// next claim.
    @Test func aClaimThatRacedAPositionRequestLeavesItWaiting() {
        let request = PartitionStateRecord.position(
            topic: "email.received", partition: 3, requestedBy: "ops", host: "laptop", offset: 4, marks: [jobs0: 70])
        func claim(epoch: Int64, offset: Int64, restoredTo: Int64?) -> PartitionStateRecord {
            var claim = record(.claim, epoch: epoch, owner: "b", offset: offset, mark: 5)
            claim.restoredTo = restoredTo
            return claim
        }
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 1, owner: "a", offset: 0), at: 0)
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, mark: 5, emails: ["e1"]), at: 1)
        fold.apply(request, at: 2)
        fold.apply(claim(epoch: 2, offset: 10, restoredTo: 2), at: 3)
        #expect(fold.pendingPosition == request)
        #expect(fold.epoch == 2 && fold.offset == 10)
        var restarted = fold
        restarted.takeUpPosition()
        #expect(restarted.offset == 4 && restarted.marks == [jobs0: 70])

        var later = fold
        later.apply(claim(epoch: 3, offset: 4, restoredTo: 5), at: 5)
        #expect(later.pendingPosition == nil, "a claim restored past the request took it up")
        var older = fold
        older.apply(claim(epoch: 3, offset: 10, restoredTo: nil), at: 5)
        #expect(older.pendingPosition == nil, "an earlier version's claim, which says nothing, is taken to have taken it up")
    }

    @Test func aPositionRequestTakenUpFromTheRenewalWinsOverTheRestoredChain() {
        var fold = PartitionRestore(epoch: 4, owner: "a", offset: 100, marks: [jobs0: 40])
        fold.apply(record(.batch, epoch: 4, owner: "a", from: 100, offset: 120, mark: 45))
        let request = PartitionStateRecord.position(
            topic: "email.received", partition: 3, requestedBy: "ops", host: "laptop", offset: 0, marks: [jobs0: 50])
        fold.takeUpPosition(request)
        #expect(fold.offset == 0 && fold.marks == [jobs0: 50] && fold.epoch == 4)
    }

    @Test func aMissingBatchRecordStopsTheChainButKeepsTheEntries() {
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 1, owner: "a", offset: 0))
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10, mark: 5))
        // The record for [10, 20) never landed.
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 20, offset: 30, mark: 12, emails: ["e3"]))
        fold.apply(record(.release, epoch: 1, owner: "a", offset: 30, mark: 12))
        #expect(fold.offset == 10)
        #expect(fold.marks == [jobs0: 5])
        #expect(!fold.released, "a release past a gap does not let the next owner skip the lease wait")
        #expect(fold.emails["e3"] != nil, "the emails of a committed batch were processed, chain or not")
    }

    @Test func aReplacedOwnersLateRecordsAreIgnored() {
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 1, owner: "a", offset: 0))
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 0, offset: 10))
        fold.apply(record(.claim, epoch: 2, owner: "b", offset: 10, mark: 7))
        // a, paused, writes late: lower epoch.
        fold.apply(record(.batch, epoch: 1, owner: "a", from: 10, offset: 15, emails: ["late"]))
        fold.apply(record(.release, epoch: 1, owner: "a", offset: 15))
        #expect(fold.owner == "b")
        #expect(fold.offset == 10)
        #expect(fold.marks == [jobs0: 7])
        #expect(!fold.released)
        #expect(fold.emails["late"] != nil)
    }

    @Test func aReleaseLetsTheNextOwnerStartAtOnce() {
        var fold = PartitionRestore()
        fold.apply(record(.claim, epoch: 4, owner: "a", offset: 100))
        fold.apply(record(.batch, epoch: 4, owner: "a", from: 100, offset: 120, mark: 50))
        fold.apply(record(.release, epoch: 4, owner: "a", offset: 120, mark: 60))
        #expect(fold.released)
        #expect(fold.offset == 120)
        #expect(fold.marks == [jobs0: 60])
    }

    @Test func aPartitionComingBackStartsFromItsLocalState() {
        var fold = PartitionRestore(epoch: 3, owner: "me", offset: 40, marks: [jobs0: 30])
        // Our own records in the tail are behind the local state (it commits before it publishes).
        fold.apply(record(.batch, epoch: 3, owner: "me", from: 30, offset: 40, mark: 25))
        #expect(fold.offset == 40)
        #expect(fold.marks == [jobs0: 30])
        // Another owner had it meanwhile: its state wins.
        fold.apply(record(.claim, epoch: 4, owner: "other", offset: 40, mark: 30))
        fold.apply(record(.batch, epoch: 4, owner: "other", from: 40, offset: 55, mark: 44))
        #expect(fold.offset == 55)
        #expect(fold.owner == "other")
    }

    @Test func replaysTravelWithTheirProgressAndItsCountsFromTheStart() {
        var fold = PartitionRestore()
        var request = record(.replay, epoch: -1, owner: "replay", from: 0, offset: 100)
        request.replayId = "r1"
        request.force = true
        fold.apply(request)
        func progress(epoch: Int64, owner: String, offset: Int64, _ counts: PartitionStateRecord.ReplayCounts) -> PartitionStateRecord {
            var progress = record(.replayProgress, epoch: epoch, owner: owner, offset: offset)
            progress.replayId = "r1"
            progress.counts = counts
            return progress
        }
        fold.apply(progress(epoch: 2, owner: "a", offset: 30, .init(events: 30, jobs: 60, deadLetters: 1, duplicates: 0)))
        // b restored a's progress at 30 and went on from its counts; a's progress at 40 landed late, after b's
        // restore: 30-40 was replayed by both, and is counted once.
        fold.apply(progress(epoch: 3, owner: "b", offset: 50, .init(events: 50, jobs: 100, deadLetters: 1, duplicates: 2)))
        fold.apply(progress(epoch: 2, owner: "a", offset: 40, .init(events: 40, jobs: 80, deadLetters: 1, duplicates: 0)))
        fold.apply(progress(epoch: 3, owner: "b", offset: 70, .init(events: 70, jobs: 140, deadLetters: 1, duplicates: 2)))
        let replay = fold.replays["r1"]
        #expect(replay?.next == 70)
        #expect(replay?.force == true)
        #expect(replay?.counts == .init(events: 70, jobs: 140, deadLetters: 1, duplicates: 2))
        #expect(replay?.isDone == false)
        #expect(fold.epoch == -1, "replay records are nobody's ownership")
    }

    /// What a new owner deletes: a finished replay's request and progress, a replay's superseded progress, and
    /// progress left without its request; an unfinished replay's last progress of each owner stays.
    @Test func aRestoreListsTheReplayRecordsNoLongerNeeded() {
        func progress(_ id: String, epoch: Int64, offset: Int64, at: Int64) -> PartitionStateRecord {
            var record = record(.replayProgress, epoch: epoch, owner: "o\(epoch)", offset: offset)
            record.replayId = id
            record.processedAtMs = at
            return record
        }
        var finished = record(.replay, epoch: -1, owner: "replay", from: 0, offset: 10)
        finished.replayId = "done"
        var open = record(.replay, epoch: -1, owner: "replay", from: 0, offset: 100)
        open.replayId = "open"
        var fold = PartitionRestore()
        for record in [
            progress("gone", epoch: 1, offset: 5, at: 50), finished, open, progress("done", epoch: 1, offset: 4, at: 60),
            progress("done", epoch: 2, offset: 10, at: 70), progress("open", epoch: 1, offset: 20, at: 80),
            progress("open", epoch: 1, offset: 30, at: 90), progress("open", epoch: 2, offset: 40, at: 95),
        ] {
            fold.apply(record)
        }
        let deletable = Dictionary(uniqueKeysWithValues: fold.deletableRecords.map { ($0.key, $0.atMs) })
        #expect(
            deletable == [
                "email.received/3/replay/gone/progress/5": 0, "email.received/3/replay/done": 70,
                "email.received/3/replay/done/progress/4": 70, "email.received/3/replay/done/progress/10": 70,
                "email.received/3/replay/open/progress/20": 0,
            ])
        // A partition coming back reads only what follows its local state: a request before that is not missing.
        var back = PartitionRestore(epoch: 3, owner: "me", offset: 0, marks: [:])
        back.apply(progress("gone", epoch: 1, offset: 5, at: 50))
        #expect(back.deletableRecords.isEmpty)
    }

    @Test func recordsNoInstanceCouldHaveWrittenAreNotRecords() {
        func decoded(_ change: (inout PartitionStateRecord) -> Void) -> PartitionStateRecord? {
            var value = record(.batch, epoch: 2, owner: "a", from: 3, offset: 9, mark: 4, emails: ["x"])
            change(&value)
            return PartitionStateRecord.decode(value.encoded())
        }
        #expect(decoded { _ in } != nil)
        #expect(decoded { $0.epoch = -1 } != nil)
        #expect(decoded { $0.epoch = PartitionStateRecord.maxEpoch } != nil)
        #expect(decoded { $0.from = 9 } != nil)
        #expect(decoded { $0.epoch = PartitionStateRecord.maxEpoch + 1 } == nil)
        #expect(decoded { $0.epoch = -2 } == nil)
        #expect(
            decoded {
                $0.offset = -5
                $0.from = nil
            } == nil)
        #expect(decoded { $0.from = 10 } == nil)
        #expect(decoded { $0.from = -1 } == nil)
        #expect(decoded { $0.partition = -1 } == nil)
        #expect(decoded { $0.marks["mailpush.push-jobs/0"] = -1 } == nil)
        #expect(decoded { $0.processedAtMs = -1 } == nil)
        #expect(decoded { $0.restoredTo = -1 } == nil)
        #expect(decoded { $0.counts = .init(events: PartitionStateRecord.maxCount + 1) } == nil)
        #expect(decoded { $0.counts = .init(events: 1, jobs: -1) } == nil)

        var claim = record(.claim, epoch: .max, owner: "x", offset: 0)
        #expect(PartitionStateRecord.whyUnreadable(claim.encoded()) == "epoch \(Int64.max) outside -1…\(PartitionStateRecord.maxEpoch)")
        claim.v = 2
        #expect(NewerStateRecord.decode(claim.encoded()) == nil)
        #expect(PartitionStateRecord.whyUnreadable(claim.encoded()) == "a newer version's record without a partition and epoch in range")
        claim.epoch = 7
        #expect(NewerStateRecord.decode(claim.encoded())?.epoch == 7)
        #expect(PartitionStateRecord.whyUnreadable(Array("[1]".utf8)) == "not a state record")
        #expect(PartitionStateRecord.whyUnreadable(Array("{\"v\":0}".utf8)) == "format version 0")
        #expect(PartitionStateRecord.whyUnreadable(Array("{\"v\":1}".utf8)).hasPrefix("fields missing"))
    }

    @Test func recordsRoundTripAndForeignBytesAreNotRecords() throws {
        var original = record(.batch, epoch: 2, owner: "a", from: 3, offset: 9, mark: 4, emails: ["x"])
        original.host = "pod-1"
        #expect(PartitionStateRecord.decode(original.encoded()) == original)
        // Every field, as JSONEncoder with sorted keys writes it (the format other versions read).
        var full = original
        full.marks["mailpush.dead-letters/10"] = 7
        full.marks["mailpush.push-jobs/2"] = 11
        full.processedAtMs = 1234
        full.replayId = "r-\"1\""
        full.force = true
        full.counts = .init(events: 1, jobs: 2, deadLetters: 3, duplicates: 4)
        full.emails = ["x", "é\n"]
        full.restoredTo = 12
        // A field added to the record is set here too, so that the comparison below covers it.
        let unset = Mirror(reflecting: full).children.filter { child in
            Mirror(reflecting: child.value).displayStyle == .optional && Mirror(reflecting: child.value).children.isEmpty
        }
        #expect(unset.isEmpty, "fields left nil: \(unset.map { $0.label ?? "?" })")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        #expect(String(decoding: full.encoded(), as: UTF8.self) == String(decoding: try encoder.encode(full), as: UTF8.self))
        #expect(PartitionStateRecord.decode(full.encoded()) == full)
        for kind in [PartitionStateRecord.Kind.claim, .release, .replay, .replayProgress] {
            let other = record(kind, epoch: 1, owner: "b", offset: 5)
            #expect(PartitionStateRecord.decode(other.encoded()) == other)
        }
        #expect(PartitionStateRecord.decode(Array("{\"v\":2}".utf8)) == nil)
        #expect(PartitionStateRecord.decode(nil) == nil)
        #expect(original.key == "email.received/3/batch/2/9")
        #expect(record(.claim, epoch: 1, owner: "a", offset: 0).key == "email.received/3/head")
    }
}
