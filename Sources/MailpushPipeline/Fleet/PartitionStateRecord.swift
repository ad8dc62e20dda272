import Foundation
import MailpushPartition

/// One record of the state topic (`mailpush.state`, compacted): how an event partition's state travels between
/// the instances of a fleet. Format v1, JSON; the key names the event partition, so that compaction keeps each
/// partition's latest head (claim or release) and every batch's dedupe entries until they expire.
///
/// - `claim`: an instance took the partition over with a new `epoch`; `offset` and `marks` are what it restored.
/// - `batch`: a committed batch moved the partition from `from` to `offset`; `emails` are its dedupe entries.
/// - `release`: the owner stopped at `offset` with nothing of its own left in flight (a graceful handover).
///
/// Records of an epoch lower than one already seen were written by an owner that had been replaced (a paused
/// instance): they are ignored, which is what makes the epoch a fence (docs/exactly-once.md, "A fleet").
struct PartitionStateRecord: Codable, Sendable, Equatable {
    enum Kind: String, Codable, Sendable { case claim, batch, release }

    var v = 1
    var kind: Kind
    var topic: String
    var partition: Int32
    var epoch: Int64
    var owner: String
    /// batch only: the partition's offset before the batch.
    var from: Int64?
    /// claim/release: the partition's next offset; batch: its next offset after the batch.
    var offset: Int64
    /// Output partition ("topic/partition") → where recovery starts reading it back for this partition.
    var marks: [String: Int64]
    var processedAtMs: Int64?
    var emails: [String]?

    static let currentVersion = 1

    var key: String {
        switch kind {
        case .batch: "\(topic)/\(partition)/batch/\(offset)"
        case .claim, .release: "\(topic)/\(partition)/head"
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

    func encoded() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Array((try? encoder.encode(self)) ?? Data())
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
struct PartitionRestore: Sendable, Equatable {
    /// The epoch whose owner's records are being followed; -1 before any.
    private(set) var epoch: Int64 = -1
    private(set) var owner: String?
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

    init() {}

    /// Starts from what this instance's local state says it last had (a partition coming back to it).
    init(epoch: Int64, owner: String, offset: Int64, marks: [TopicPartition: Int64]) {
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
        if record.epoch > epoch {
            // A new owner; whatever it starts from is a state its predecessor committed.
            epoch = record.epoch
            owner = record.owner
            offset = record.offset
            marks = record.decodedMarks()
            released = record.kind == .release
            broken = false
            return
        }
        guard record.epoch == epoch, record.owner == owner, !broken else { return }
        switch record.kind {
        case .claim:
            return
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
}
