import MailpushPartition
import MailpushTestSupport
import Testing

@testable import MailpushPipeline

/// Restoring a partition from a compacted state topic (the latest record per key at its original position,
/// tombstones and the records they delete removed) reaches the state a restore of the full log reaches: the
/// same owner, epoch, offset, marks, unexpired dedupe entries and unfinished replays (docs/exactly-once.md,
/// "A fleet", "Compaction"). Histories are generated from a seed: owners that claim, commit batches (joined
/// while a write is under way, some without dedupe entries), write checkpoints, hand over gracefully or crash
/// (a replaced owner's records landing late), execute replays, and delete what the service deletes.
struct PartitionRestoreCompactionTests {
    @Test(arguments: 0..<400)
    func restoringTheCompactedLogEqualsRestoringTheFullLog(seed: UInt64) {
        var history = StateHistory(seed: seed)
        history.run(steps: 150)
        let full = history.restore(Array(history.log.enumerated()))
        let compacted = history.restore(StateHistory.compacted(history.log))
        #expect(compacted.epoch == full.epoch, "seed \(seed)")
        #expect(compacted.owner == full.owner, "seed \(seed)")
        #expect(compacted.offset == full.offset, "seed \(seed)")
        #expect(compacted.marks == full.marks, "seed \(seed)")
        #expect(compacted.released == full.released, "seed \(seed)")
        #expect(compacted.pendingPosition == full.pendingPosition, "seed \(seed)")
        let horizon = history.deletionHorizonMs
        #expect(compacted.emails.filter { $0.value >= horizon } == full.emails.filter { $0.value >= horizon }, "seed \(seed)")
        #expect(
            compacted.replays.filter { !$0.value.isDone } == full.replays.filter { !$0.value.isDone }, "seed \(seed)")
        // The history itself must exercise compaction: a test whose logs never lose a record proves nothing.
        #expect(StateHistory.compacted(history.log).count < history.log.count, "seed \(seed)")
    }

    /// Across the generated histories, each case the fold must survive happens somewhere.
    @Test func theGeneratedHistoriesCoverEveryCase() {
        var seen = StateHistory.Cases()
        for seed in UInt64(0)..<400 {
            var history = StateHistory(seed: seed)
            history.run(steps: 150)
            seen.formUnion(history.cases)
        }
        #expect(seen == .all, "missing: \(StateHistory.Cases.all.subtracting(seen))")
    }

    /// The read-back of a takeover starts no earlier than the last checkpoint, however long the owner held the
    /// partition and however many of its batch records compaction removed.
    @Test func aCheckpointBoundsWhereTheSuccessorStarts() {
        let jobs = TopicPartition(topic: "mailpush.push-jobs", partition: 0)
        var log: [(key: String, value: PartitionStateRecord?)] = []
        func write(_ record: PartitionStateRecord) { log.append((record.key, record)) }
        write(
            PartitionStateRecord(
                kind: .claim, topic: "e", partition: 0, epoch: 1, owner: "a", offset: 0, marks: PartitionStateRecord.encodeMarks([jobs: 0]))
        )
        for batch in Int64(0)..<1000 {
            write(
                PartitionStateRecord(
                    kind: .batch, topic: "e", partition: 0, epoch: 1, owner: "a", from: batch * 10, offset: batch * 10 + 10,
                    marks: PartitionStateRecord.encodeMarks([jobs: batch * 20]), processedAtMs: batch, emails: ["m\(batch)"]))
            if batch % 100 == 99 && batch < 900 {
                write(
                    PartitionStateRecord(
                        kind: .checkpoint, topic: "e", partition: 0, epoch: 1, owner: "a", offset: batch * 10 + 10,
                        marks: PartitionStateRecord.encodeMarks([jobs: batch * 20])))
            }
        }
        // Every batch record expired and was deleted except the last 50; one of those never landed.
        let kept = log.filter { entry in
            guard case .batch = entry.value?.kind, let record = entry.value else { return true }
            return record.offset > 9000 && record.offset != 9600
        }
        var fold = PartitionRestore()
        for entry in StateHistory.compacted(kept) { if let record = entry.element.value { fold.apply(record) } }
        #expect(fold.offset == 9590, "the last checkpoint (9000), then the chain up to the missing record")
        #expect(fold.marks == [jobs: 19160])
    }
}

/// A generated history of one partition's state records, written the way the service writes them.
struct StateHistory {
    struct Cases: OptionSet, Hashable, CustomStringConvertible {
        let rawValue: Int
        static let joined = Cases(rawValue: 1)
        static let withoutEntries = Cases(rawValue: 2)
        static let checkpoint = Cases(rawValue: 4)
        static let release = Cases(rawValue: 8)
        static let crash = Cases(rawValue: 16)
        static let lateRecords = Cases(rawValue: 32)
        static let lostRecord = Cases(rawValue: 64)
        static let expiredDeleted = Cases(rawValue: 128)
        static let coveredDeleted = Cases(rawValue: 256)
        static let replay = Cases(rawValue: 512)
        static let replayDeleted = Cases(rawValue: 1024)
        static let position = Cases(rawValue: 2048)
        static let racingClaim = Cases(rawValue: 4096)
        static let all: Cases = [
            .joined, .withoutEntries, .checkpoint, .release, .crash, .lateRecords, .lostRecord, .expiredDeleted, .coveredDeleted,
            .replay, .replayDeleted, .position, .racingClaim,
        ]
        var description: String { "\(rawValue)" }
    }

    struct Stint {
        var epoch: Int64
        var owner: String
        var committed: Int64
        var waiting: [BatchStatePublisher.Queued] = []
        /// The state of the last batch record written (what a checkpoint holds).
        var written: (offset: Int64, marks: [String: Int64])
        /// A batch record of this stint was given up: no checkpoint heals over it.
        var gap = false
        var checkpointed: Int64?
        var replayProgress: [String: (next: Int64, counts: PartitionStateRecord.ReplayCounts)] = [:]
    }

    static let windowMs: Int64 = 50
    var rng: SplitMix64
    var log: [(key: String, value: PartitionStateRecord?)] = []
    var cases = Cases()
    var nowMs: Int64 = 1000
    var outputEnd: Int64 = 0
    var emailNumber = 0
    var owners = 0
    var replayNumber = 0
    var stint: Stint
    /// Every deletion so far was of records older than this.
    var deletionHorizonMs: Int64 = .min

    init(seed: UInt64) {
        // Offset as the generator this test first had, so each seed still draws the same history.
        rng = SplitMix64(seed: seed &+ 0x9E37_79B9_7F4A_7C15)
        stint = Stint(epoch: 0, owner: "o0", committed: 0, written: (0, [:]))
        claim()
    }

    /// Log entries at their offsets.
    typealias Positioned = [(offset: Int, element: (key: String, value: PartitionStateRecord?))]

    func restore(_ entries: Positioned) -> PartitionRestore {
        var fold = PartitionRestore()
        for entry in entries { if let record = entry.element.value { fold.apply(record, at: Int64(entry.offset)) } }
        return fold
    }

    /// Kafka's compaction: the latest record of each key at its position; a tombstone removes its key.
    static func compacted(_ log: [(key: String, value: PartitionStateRecord?)]) -> Positioned {
        var last: [String: Int] = [:]
        for (index, entry) in log.enumerated() { last[entry.key] = index }
        return log.enumerated().filter { last[$0.element.key] == $0.offset && $0.element.value != nil }.map { ($0.offset, $0.element) }
    }

    mutating func write(_ record: PartitionStateRecord) { log.append((record.key, record)) }

    var marks: [String: Int64] { ["mailpush.push-jobs/0": outputEnd] }

    /// `racingTheLastRecord`: the claimant's restore stopped before the last record (a position request landed
    /// meanwhile).
    mutating func claim(racingTheLastRecord: Bool = false) {
        let restoredTo = racingTheLastRecord ? log.count - 1 : log.count
        var fold = restore(Array(log.enumerated().prefix(restoredTo)))
        fold.takeUpPosition()
        owners += 1
        stint = Stint(
            epoch: fold.epoch + 1, owner: "o\(owners)", committed: fold.offset ?? 0,
            written: (fold.offset ?? 0, fold.offset == nil ? marks : fold.marks.encoded))
        write(
            PartitionStateRecord(
                kind: .claim, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, offset: stint.committed,
                marks: stint.written.marks, restoredTo: Int64(restoredTo)))
        // Unfinished replays continue from their progress.
        for replay in fold.replays.values where !replay.isDone {
            stint.replayProgress[replay.id] = (replay.next, replay.counts)
        }
    }

    mutating func run(steps: Int) {
        for _ in 0..<steps {
            nowMs += Int64(rng.next(below: 8))
            switch rng.next(below: 100) {
            case 0..<45: commitBatch()
            case 45..<60: flush()
            case 60..<68: checkpoint()
            case 68..<78: deleteExpired()
            case 78..<82: handOver()
            case 82..<86: crash()
            case 86..<88: requestPosition()
            case 88..<90: requestReplay()
            default: replayStep()
            }
        }
    }

    mutating func commitBatch() {
        let from = stint.committed
        stint.committed += Int64(1 + rng.next(below: 10))
        outputEnd += Int64(rng.next(below: 20))
        var emails: [String] = []
        if rng.next(below: 4) > 0 {
            for _ in 0..<(1 + rng.next(below: 3)) {
                emailNumber += 1
                emails.append("m\(emailNumber)")
            }
        } else {
            cases.insert(.withoutEntries)
        }
        let record = PartitionStateRecord(
            kind: .batch, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, from: from, offset: stint.committed,
            marks: marks, processedAtMs: nowMs, emails: emails)
        let before = stint.waiting.count
        BatchStatePublisher.queue(.init(record: record), into: &stint.waiting)
        if stint.waiting.count == before { cases.insert(.joined) }
    }

    /// The publisher writes what waits; now and then a write is given up (the record never lands).
    mutating func flush() {
        for record in stint.waiting.map(\.record) {
            if rng.next(below: 30) == 0 {
                stint.gap = true
                cases.insert(.lostRecord)
                continue
            }
            write(record)
            if !stint.gap { stint.written = (record.offset, record.marks) }
        }
        stint.waiting = []
    }

    /// After the batch records before it, the state of the last one written; never past a record given up.
    mutating func checkpoint() {
        flush()
        guard !stint.gap else { return }
        write(
            PartitionStateRecord(
                kind: .checkpoint, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, offset: stint.written.offset,
                marks: stint.written.marks, processedAtMs: nowMs))
        stint.checkpointed = stint.written.offset
        cases.insert(.checkpoint)
    }

    /// The owner's expiry run: a checkpoint first, then whatever it may delete (some of it: a run can stop
    /// half-way), finished replays' requests before their progress.
    mutating func deleteExpired() {
        checkpoint()
        let cutoff = nowMs - Self.windowMs
        deletionHorizonMs = max(deletionHorizonMs, cutoff)
        let fold = restore(Self.compacted(log))
        let deletable = fold.deletableRecords.filter { entry in
            entry.atMs < cutoff && (entry.coveredAt.map { covered in stint.checkpointed.map { covered <= $0 } ?? false } ?? true)
        }
        let requests = Set(fold.replays.values.map(\.requestKey))
        for entry in deletable.sorted(by: { requests.contains($0.key) && !requests.contains($1.key) }) {
            if rng.next(below: 5) == 0 { break }
            log.append((entry.key, nil))
            if entry.coveredAt != nil {
                cases.insert(entry.atMs == 0 ? .coveredDeleted : .expiredDeleted)
            } else {
                cases.insert(.replayDeleted)
            }
        }
    }

    mutating func handOver() {
        flush()
        write(
            PartitionStateRecord(
                kind: .release, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, offset: stint.written.offset,
                marks: stint.written.marks))
        cases.insert(.release)
        claim()
    }

    /// The owner stops without a release; what it had waiting may land after the next owner's claim, with a
    /// checkpoint and a release of its own (a paused owner between its lease check and the write).
    mutating func crash() {
        cases.insert(.crash)
        var replaced = stint
        if rng.next(below: 2) == 0 { replaced.waiting = [] }
        claim()
        guard rng.next(below: 2) == 0 else { return }
        cases.insert(.lateRecords)
        let current = stint
        stint = replaced
        if rng.next(below: 2) == 0 { checkpoint() } else { flush() }
        if rng.next(below: 2) == 0 {
            write(
                PartitionStateRecord(
                    kind: .release, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, offset: stint.written.offset,
                    marks: stint.written.marks))
        }
        stint = current
    }

    /// `mailpush offsets --set`: the owner sees the request in a renewal and claims the partition again, or (a
    /// stopped fleet) the next claim takes it up. A claim may race the request: restored before it landed, written
    /// after it, and taken up only by a later claim.
    mutating func requestPosition() {
        write(
            PartitionStateRecord.position(
                topic: "e", partition: 0, requestedBy: "ops", host: "h", offset: Int64(rng.next(below: Int(stint.committed + 20))),
                marks: [TopicPartition(topic: "mailpush.push-jobs", partition: 0): outputEnd]))
        cases.insert(.position)
        switch rng.next(below: 4) {
        case 0, 1:
            flush()
            claim()
        case 2:
            cases.insert(.racingClaim)
            claim(racingTheLastRecord: true)
        default:
            break
        }
    }

    mutating func requestReplay() {
        replayNumber += 1
        let from = Int64(rng.next(below: Int(max(stint.committed, 1))))
        let record = PartitionStateRecord(
            kind: .replay, topic: "e", partition: 0, epoch: -1, owner: "replay", from: from, offset: from + Int64(1 + rng.next(below: 30)),
            marks: [:], replayId: "r\(replayNumber)", force: rng.next(below: 2) == 0)
        write(record)
        stint.replayProgress[record.replayId!] = (from, .init())
        cases.insert(.replay)
    }

    mutating func replayStep() {
        let fold = restore(Array(log.enumerated()))
        guard let id = stint.replayProgress.keys.sorted().first, let replay = fold.replays[id] else { return }
        var progress = stint.replayProgress[id]!
        progress.next = min(replay.end, progress.next + Int64(1 + rng.next(below: 8)))
        progress.counts.events += 1
        progress.counts.jobs += rng.next(below: 3)
        var emails: [String] = []
        if rng.next(below: 2) == 0 {
            emailNumber += 1
            emails.append("m\(emailNumber)")
        }
        write(
            PartitionStateRecord(
                kind: .replayProgress, topic: "e", partition: 0, epoch: stint.epoch, owner: stint.owner, offset: progress.next,
                marks: [:], processedAtMs: nowMs, emails: emails.isEmpty ? nil : emails, replayId: id, counts: progress.counts))
        stint.replayProgress[id] = progress.next >= replay.end ? nil : progress
    }
}

extension [TopicPartition: Int64] {
    fileprivate var encoded: [String: Int64] { PartitionStateRecord.encodeMarks(self) }
}
