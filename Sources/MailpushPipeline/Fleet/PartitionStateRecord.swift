import Foundation
import MailpushCore
import MailpushPartition

/// One record of the state topic (`mailpush.state`, compacted): how an event partition's state travels between
/// the instances of a fleet. Format v1, JSON; the key names the event partition, so that compaction keeps each
/// partition's latest head (claim or release) and every batch's dedupe entries until they expire.
///
/// - `claim`: an instance took the partition over with a new `epoch`; `offset` and `marks` are what it restored.
/// - `batch`: a committed batch moved the partition from `from` to `offset`; `emails` are its dedupe entries.
/// - `release`: the owner stopped at `offset` with nothing of its own left in flight (a graceful handover).
/// - `checkpoint`: the owner's state at one of its commits (`offset`, `marks`), written after the batch records
///   that reach it: a complete state, so that a restore does not depend on batch records compaction removed.
///
/// Records of an epoch lower than one already seen were written by an owner that had been replaced (a paused
/// instance): they are ignored, which is what makes the epoch a fence (docs/exactly-once.md, "A fleet").
struct PartitionStateRecord: Codable, Sendable, Equatable {
    enum Kind: String, Codable, Sendable { case claim, batch, release, checkpoint, replay, replayProgress }

    var v = 1
    var kind: Kind
    var topic: String
    var partition: Int32
    var epoch: Int64
    var owner: String
    /// The owner's host name (a pod's name), for people reading `mailpush offsets`; claims only.
    var host: String?
    /// batch only: the partition's offset before the batch.
    var from: Int64?
    /// claim/release: the partition's next offset; batch: its next offset after the batch.
    var offset: Int64
    /// Output partition ("topic/partition") → where recovery starts reading it back for this partition.
    var marks: [String: Int64]
    var processedAtMs: Int64?
    var emails: [String]?
    /// replay / replayProgress: the replay's id (the command's), and for a request whether it ignores the
    /// dedupe window. A request covers [`from`, `offset`); a progress record says the owner has replayed up to
    /// `offset`, with the counts so far.
    var replayId: String?
    var force: Bool?
    var counts: ReplayCounts?

    struct ReplayCounts: Codable, Sendable, Equatable {
        var events = 0
        var jobs = 0
        var deadLetters = 0
        var duplicates = 0
    }

    static let currentVersion = 1

    var key: String {
        switch kind {
        // With the epoch: a replaced owner's late record and its successor's may end at the same offset, and
        // compaction would keep only one of their dedupe entries (and perhaps the wrong owner's chain).
        case .batch: "\(topic)/\(partition)/batch/\(epoch)/\(offset)"
        case .claim: "\(topic)/\(partition)/head"
        // Apart from the claim: a replaced owner's late release must not replace a newer owner's claim when the
        // topic is compacted (latest record per key).
        case .release: "\(topic)/\(partition)/release"
        case .checkpoint: "\(topic)/\(partition)/checkpoint"
        case .replay: "\(topic)/\(partition)/replay/\(replayId ?? "")"
        // Unique per progress step: each may carry dedupe entries that must outlive the next one.
        case .replayProgress: "\(topic)/\(partition)/replay/\(replayId ?? "")/progress/\(offset)"
        }
    }

    static func encodeMarks(_ marks: [TopicPartition: Int64]) -> [String: Int64] {
        Dictionary(uniqueKeysWithValues: marks.map { ("\($0.key.topic)/\($0.key.partition)", $0.value) })
    }

    func decodedMarks() -> [TopicPartition: Int64] {
        var result: [TopicPartition: Int64] = [:]
        for (name, offset) in marks {
            guard let slash = name.lastIndex(of: "/"), let partition = Int32(name[name.index(after: slash)...]) else { continue }
            result[TopicPartition(topic: String(name[..<slash]), partition: partition)] = offset
        }
        return result
    }

    /// The record's JSON, keys in sorted order (what `JSONEncoder` with `.sortedKeys` writes, absent fields left
    /// out). Written by hand: a fleet writes a record per partition of every batch, each with the instance's marks
    /// for every output partition, and `JSONEncoder` took about 9% of the service's CPU under a steady load. A field
    /// added to the record is written here too (`recordsRoundTripAndForeignBytesAreNotRecords` compares with
    /// `JSONEncoder`, and fails while the new field is left out of its record).
    func encoded() -> [UInt8] {
        var w = JSONWriter(capacity: 256 + marks.count * 40 + (emails?.reduce(0) { $0 + $1.utf8.count + 3 } ?? 0))
        w.beginObject()
        if let counts {
            w.key("counts")
            w.beginObject()
            w.field("deadLetters", Int64(counts.deadLetters))
            w.field("duplicates", Int64(counts.duplicates))
            w.field("events", Int64(counts.events))
            w.field("jobs", Int64(counts.jobs))
            w.endObject()
        }
        if let emails {
            w.key("emails")
            w.beginArray()
            for email in emails { w.value(email) }
            w.endArray()
        }
        w.field("epoch", epoch)
        if let force { w.field("force", force) }
        if let from { w.field("from", from) }
        if let host { w.field("host", host) }
        w.field("kind", kind.rawValue)
        w.key("marks")
        w.beginObject()
        for (name, offset) in marks.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
            w.field(name, offset)
        }
        w.endObject()
        w.field("offset", offset)
        w.field("owner", owner)
        w.field("partition", Int64(partition))
        if let processedAtMs { w.field("processedAtMs", processedAtMs) }
        if let replayId { w.field("replayId", replayId) }
        w.field("topic", topic)
        w.field("v", Int64(v))
        w.endObject()
        return w.bytes
    }

    /// nil for a tombstone, a record of another format version, or bytes that are not a state record.
    static func decode(_ value: [UInt8]?) -> PartitionStateRecord? {
        guard let value, let record = try? JSONDecoder().decode(PartitionStateRecord.self, from: Data(value)),
            record.v == currentVersion
        else { return nil }
        return record
    }
}

/// Folds a partition's state records, in log order, into the state a new owner continues from.
struct PartitionRestore: Sendable {
    /// The epoch whose owner's records are being followed; -1 before any.
    private(set) var epoch: Int64 = -1
    private(set) var owner: String?
    private(set) var host: String?
    private(set) var offset: Int64?
    private(set) var marks: [TopicPartition: Int64] = [:]
    /// Every email a record says was processed (its outputs all written), whoever wrote it.
    private(set) var emails: [String: Int64] = [:]
    /// The followed owner's last record was a release: nothing of it can still be in flight.
    private(set) var released = false
    /// A batch record of the followed epoch was missing (one that never landed): later ones are not followed,
    /// their events are read again from `offset` (their outputs are found by the read-back).
    private(set) var broken = false
    private(set) var records = 0
    /// Batch records seen, by key: when their dedupe entries were processed (0: none) and the offset they reach.
    /// The new owner deletes each once its entries expired and a checkpoint of its own covers it.
    private(set) var batchRecords: [String: (processedAtMs: Int64, offset: Int64)] = [:]

    struct KeyAt: Sendable {
        var key: String
        /// When it was written.
        var atMs: Int64
        /// When its dedupe entries were processed; 0 without any.
        var entriesAtMs: Int64
    }
    /// Progress records of replays whose request was deleted (finished ones).
    private(set) var orphanProgress: [KeyAt] = []

    private func entriesAt(_ record: PartitionStateRecord) -> Int64 {
        (record.emails ?? []).isEmpty ? 0 : record.processedAtMs ?? 0
    }

    /// Replays requested for this partition (by `mailpush replay` in a fleet), by id.
    private(set) var replays: [String: FleetReplay] = [:]

    struct FleetReplay: Sendable, Equatable {
        var id: String
        var from: Int64
        var end: Int64
        var force: Bool
        /// How far an owner has replayed, and what it wrote so far.
        var next: Int64
        /// Each owner (epoch) reports what its own part wrote; the replay's counts are their sum.
        var countsByEpoch: [Int64: PartitionStateRecord.ReplayCounts] = [:]

        static func == (a: FleetReplay, b: FleetReplay) -> Bool {
            a.id == b.id && a.from == b.from && a.end == b.end && a.force == b.force && a.next == b.next
                && a.countsByEpoch == b.countsByEpoch
        }
        var isDone: Bool { next >= end }
        /// Keys of its progress records by epoch, in log order, with when each was written.
        var progressKeys: [Int64: [KeyAt]] = [:]
        var requestKey: String
        var counts: PartitionStateRecord.ReplayCounts {
            countsByEpoch.values.reduce(into: PartitionStateRecord.ReplayCounts()) { sum, counts in
                sum.events += counts.events
                sum.jobs += counts.jobs
                sum.deadLetters += counts.deadLetters
                sum.duplicates += counts.duplicates
            }
        }
    }

    /// The records are the partition's from the beginning of its state partition (not those after what a local
    /// state already reflects).
    private let readFromStart: Bool

    init() { readFromStart = true }

    /// Starts from what this instance's local state says it last had (a partition coming back to it).
    init(epoch: Int64, owner: String, offset: Int64, marks: [TopicPartition: Int64]) {
        readFromStart = false
        self.epoch = epoch
        self.owner = owner
        self.offset = offset
        self.marks = marks
    }

    mutating func apply(_ record: PartitionStateRecord) {
        records += 1
        if let emails = record.emails, let at = record.processedAtMs {
            for email in emails { self.emails[email] = max(self.emails[email] ?? .min, at) }
        }
        switch record.kind {
        case .replay:
            if let id = record.replayId, replays[id] == nil, let from = record.from {
                replays[id] = FleetReplay(
                    id: id, from: from, end: record.offset, force: record.force ?? false, next: from, requestKey: record.key)
            }
            return
        case .replayProgress:
            guard let id = record.replayId, replays[id] != nil else {
                // Read from the start, its request was deleted (a request lies before its progress): only its
                // entries count.
                if readFromStart {
                    orphanProgress.append(KeyAt(key: record.key, atMs: record.processedAtMs ?? 0, entriesAtMs: entriesAt(record)))
                }
                return
            }
            if var replay = replays[id] {
                replay.next = max(replay.next, record.offset)
                if let counts = record.counts { replay.countsByEpoch[record.epoch] = counts }
                replay.progressKeys[record.epoch, default: []].append(
                    KeyAt(key: record.key, atMs: record.processedAtMs ?? 0, entriesAtMs: entriesAt(record)))
                replays[id] = replay
            }
            return
        case .batch:
            batchRecords[record.key] = ((record.emails ?? []).isEmpty ? 0 : record.processedAtMs ?? 0, record.offset)
        case .claim, .release, .checkpoint:
            break
        }
        if record.epoch > epoch {
            // A new owner; whatever it starts from is a state its predecessor committed.
            epoch = record.epoch
            owner = record.owner
            host = record.host
            offset = record.offset
            marks = record.decodedMarks()
            released = record.kind == .release
            broken = false
            return
        }
        guard record.epoch == epoch else { return }
        if record.kind == .checkpoint {
            // A complete state of the epoch's owner at one of its commits, written after the batch records that
            // reach it: it stands for them, also where compaction removed them. Its owner is the epoch's owner
            // even when another instance's claim of the same epoch is all that compaction left of the claims (a
            // rival is fenced long before an owner's first checkpoint).
            guard record.owner != owner || (offset.map { record.offset >= $0 } ?? true) else { return }
            owner = record.owner
            offset = record.offset
            marks = record.decodedMarks()
            released = false
            broken = false
            return
        }
        guard record.owner == owner, !broken else { return }
        switch record.kind {
        case .replay, .replayProgress, .checkpoint:
            return
        case .claim:
            if host == nil { host = record.host }
        case .batch:
            guard let from = record.from, let current = offset else { return }
            if from == current {
                offset = record.offset
                marks = record.decodedMarks()
                released = false
            } else if from > current {
                broken = true
            }
        case .release:
            guard let current = offset, record.offset >= current else { return }
            offset = record.offset
            marks = record.decodedMarks()
            released = true
        }
    }

    /// The records a new owner may delete from the state topic (`published_batch`), once their time is
    /// before the dedupe horizon: batch records (`coveredAt`: only once a checkpoint of its own reaches their
    /// offset), progress records superseded by a later one of the same replay and owner, and a finished
    /// replay's request and progress (the request goes first: progress without a request is ignored, a request
    /// without its progress would be replayed again).
    var deletableRecords: [(key: String, atMs: Int64, coveredAt: Int64?)] {
        var result = batchRecords.map { (key: $0.key, atMs: $0.value.processedAtMs, coveredAt: Optional($0.value.offset)) }
        result += orphanProgress.map { ($0.key, $0.entriesAtMs, nil) }
        for replay in replays.values {
            let doneAt = replay.progressKeys.values.flatMap { $0.map(\.atMs) }.max() ?? 0
            if replay.isDone { result.append((replay.requestKey, doneAt, nil)) }
            for keys in replay.progressKeys.values {
                for (index, entry) in keys.enumerated() {
                    if index < keys.count - 1 {
                        result.append((entry.key, entry.entriesAtMs, nil))
                    } else if replay.isDone {
                        // An owner's last progress goes with the request, never before it.
                        result.append((entry.key, max(entry.atMs, doneAt), nil))
                    }
                }
            }
        }
        return result
    }
}
