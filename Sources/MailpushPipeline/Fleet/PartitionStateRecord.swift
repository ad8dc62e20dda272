import Foundation
import MailpushCore
import MailpushPartition
import MailpushState

/// One record of the state topic (`mailpush.state`, compacted): how an event partition's state travels between
/// the instances of a fleet. Format v1, JSON; the key names the event partition, so that compaction keeps each
/// partition's latest head (claim or release) and every batch's dedupe entries until they expire.
///
/// - `claim`: an instance took the partition over with a new `epoch`; `offset` and `marks` are what it restored.
/// - `batch`: a committed batch moved the partition from `from` to `offset`; `emails` are its dedupe entries.
/// - `release`: the owner stopped at `offset` with nothing of its own left in flight (a graceful handover).
/// - `checkpoint`: the owner's state at one of its commits (`offset`, `marks`), written after the batch records
///   that reach it: a complete state, so that a restore does not depend on batch records compaction removed.
/// - `position`: `mailpush offsets --set` asks the fleet to continue the partition at `offset`, with `marks` the
///   output topics' ends when it asked. The next claim takes it up (`PartitionRestore`); an owner that sees it in
///   a renewal claims the partition again to do so.
///
/// Records of an epoch lower than one already seen were written by an owner that had been replaced (a paused
/// instance): they are ignored, which is what makes the epoch a fence (docs/exactly-once.md, "A fleet").
struct PartitionStateRecord: Codable, Sendable, Equatable {
    enum Kind: String, Codable, Sendable { case claim, batch, release, checkpoint, replay, replayProgress, position }

    var v = 1
    var kind: Kind
    var topic: String
    var partition: Int32
    var epoch: Int64
    var owner: String
    /// The owner's host name (a pod's name), for people reading `mailpush offsets`; claims, checkpoints and position
    /// requests.
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
    /// claim only: where in its state partition the restore the claim was made from stopped reading. A position
    /// request at or after it landed while the claimant was restoring, and the claim has not taken it up.
    var restoredTo: Int64?

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
        case .batch: Self.batchKey(topic: topic, partition: partition, epoch: epoch, offset: offset)
        case .claim: "\(topic)/\(partition)/head"
        // Apart from the claim: a replaced owner's late release must not replace a newer owner's claim when the
        // topic is compacted (latest record per key).
        case .release: "\(topic)/\(partition)/release"
        case .checkpoint: "\(topic)/\(partition)/checkpoint"
        // One per partition: a later request replaces an earlier one, which the claim after it has taken up anyway.
        case .position: "\(topic)/\(partition)/position"
        case .replay: "\(topic)/\(partition)/replay/\(replayId ?? "")"
        // Unique per progress step: each may carry dedupe entries that must outlive the next one.
        case .replayProgress: "\(topic)/\(partition)/replay/\(replayId ?? "")/progress/\(offset)"
        }
    }

    // One factory per kind: each says which fields its kind carries.

    /// An instance takes `partition` over with a new `epoch`, continuing from `offset` and `marks`.
    /// `restoredTo`: where the restore the claim was made from stopped reading the partition's state partition.
    static func claim(
        topic: String, partition: Int32, epoch: Int64, owner: String, host: String, offset: Int64, marks: [TopicPartition: Int64],
        restoredTo: Int64
    ) -> PartitionStateRecord {
        PartitionStateRecord(
            kind: .claim, topic: topic, partition: partition, epoch: epoch, owner: owner, host: host, offset: offset,
            marks: encodeMarks(marks), restoredTo: restoredTo)
    }

    /// The most dedupe entries one record holds: 25,000 entries of 35 bytes each (`"<32 hex digits>",`) are 875 KB,
    /// under the 1,000,000 bytes librdkafka's producer takes by default (`message.max.bytes`) with room for the marks.
    /// A group's `--batch-size` is bounded by it, since one batch's entries of one partition travel in one record.
    static let maxEmails = 25_000

    /// A committed batch moved the partition from `from` to `offset`; `emails` are its dedupe entries.
    static func batch(
        topic: String, partition: Int32, epoch: Int64, owner: String, from: Int64, offset: Int64, marks: [String: Int64],
        processedAtMs: Int64, emails: [String]
    ) -> PartitionStateRecord {
        PartitionStateRecord(
            kind: .batch, topic: topic, partition: partition, epoch: epoch, owner: owner, from: from, offset: offset, marks: marks,
            processedAtMs: processedAtMs, emails: emails)
    }

    /// The owner stopped at `offset` with nothing of its own in flight.
    static func release(topic: String, partition: Int32, epoch: Int64, owner: String, offset: Int64, marks: [String: Int64])
        -> PartitionStateRecord
    {
        PartitionStateRecord(kind: .release, topic: topic, partition: partition, epoch: epoch, owner: owner, offset: offset, marks: marks)
    }

    /// `mailpush offsets --set` in a fleet: the partition continues at `offset`. Epoch -1: it fences nobody, and the
    /// owner that takes it up claims the partition with a new epoch.
    static func position(
        topic: String, partition: Int32, requestedBy: String, host: String, offset: Int64, marks: [TopicPartition: Int64]
    ) -> PartitionStateRecord {
        PartitionStateRecord(
            kind: .position, topic: topic, partition: partition, epoch: -1, owner: requestedBy, host: host, offset: offset,
            marks: encodeMarks(marks))
    }

    /// A `position` record the command could have written: a negative offset is none (librdkafka would read -1 and -2
    /// as the log's end and start).
    var isPositionRequest: Bool { kind == .position && offset >= 0 }

    /// A claim after a position request that landed at `requestAt` took it up, unless the claim's restore stopped
    /// reading before it (the claim raced the request). A claim without `restoredTo` (an earlier version's) is
    /// taken to have.
    func hasTakenUpPosition(at requestAt: Int64) -> Bool {
        kind == .claim && restoredTo.map { $0 > requestAt } ?? true
    }

    /// The state of `last`, the owner's last batch record (or claim) written, under the partition's one checkpoint key;
    /// with the owner's host, for `mailpush offsets`, which reads only the state topic's last records.
    static func checkpoint(of last: PartitionStateRecord, host: String, atMs: Int64) -> PartitionStateRecord {
        PartitionStateRecord(
            kind: .checkpoint, topic: last.topic, partition: last.partition, epoch: last.epoch, owner: last.owner, host: host,
            offset: last.offset, marks: last.marks, processedAtMs: atMs)
    }

    /// The key of the batch record that moved `partition` to `offset` under `epoch` (known before it is written:
    /// the commit remembers it for the record's deletion).
    static func batchKey(topic: String, partition: Int32, epoch: Int64, offset: Int64) -> String {
        "\(topic)/\(partition)/batch/\(epoch)/\(offset)"
    }

    static func encodeMarks(_ marks: [TopicPartition: Int64]) -> [String: Int64] {
        Dictionary(uniqueKeysWithValues: marks.map { ($0.key.name, $0.value) })
    }

    func decodedMarks() -> [TopicPartition: Int64] {
        var result: [TopicPartition: Int64] = [:]
        for (name, offset) in marks {
            guard let partition = TopicPartition(name: name) else { continue }
            result[partition] = offset
        }
        return result
    }

    /// The record's JSON, keys in sorted order (what `JSONEncoder` with `.sortedKeys` writes, absent fields left
    /// out). Written by hand: a fleet writes a record per partition of every batch, each with the instance's marks
    /// for every output partition, and `JSONEncoder` took about 9% of the service's CPU under a steady load. A field
    /// added to the record is written here too (`recordsRoundTripAndForeignBytesAreNotRecords` compares with
    /// `JSONEncoder`, and fails while the new field is left out of its record).
    func encoded() -> [UInt8] { encoded(marksJSON: Self.encodeMarksJSON(marks)) }

    /// `marks` as the record writes them: one JSON object, names in byte order.
    static func encodeMarksJSON(_ marks: [String: Int64]) -> [UInt8] {
        encodeMarksJSON(
            sortedByName: marks.sorted(by: { $0.key.precedesInByteOrder($1.key) }).map { NamedOutputMark(name: $0.key, offset: $0.value) })
    }

    /// `encodeMarksJSON` of marks already in the byte order of their names (as the state directory reads them).
    static func encodeMarksJSON(sortedByName marks: [NamedOutputMark]) -> [UInt8] {
        var w = JSONWriter(capacity: 2 + marks.count * 40)
        w.beginObject()
        for mark in marks { w.field(mark.name, mark.offset) }
        w.endObject()
        return w.bytes
    }

    /// The JSON with `marksJSON` (`encodeMarksJSON(marks)`) for the marks: the records of one batch share theirs,
    /// which a write encodes once (`StateWriter.publish`).
    func encoded(marksJSON: [UInt8]) -> [UInt8] {
        var w = JSONWriter(capacity: 256 + marksJSON.count + (emails?.reduce(0) { $0 + $1.utf8.count + 3 } ?? 0))
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
        w.rawValue(marksJSON)
        w.field("offset", offset)
        w.field("owner", owner)
        w.field("partition", Int64(partition))
        if let processedAtMs { w.field("processedAtMs", processedAtMs) }
        if let replayId { w.field("replayId", replayId) }
        if let restoredTo { w.field("restoredTo", restoredTo) }
        w.field("topic", topic)
        w.field("v", Int64(v))
        w.endObject()
        return w.bytes
    }

    /// A committed batch's records, to keep in the state directory until the state topic acknowledges them: their
    /// marks (one batch's, the same in each) once, each record without them (`values`: `unwrittenValues`, which a
    /// commit encodes before it takes the state's writer, as only the marks are known inside it).
    static func unwritten(_ values: [(partition: TopicPartition, value: [UInt8])], marks: [String: Int64]) -> UnwrittenStateRecord.Batch {
        UnwrittenStateRecord.Batch(marks: encodeMarksJSON(marks), records: values)
    }

    /// The records as the state directory keeps them unwritten: each without its marks (`unwritten`).
    static func unwrittenValues(_ records: [PartitionStateRecord]) -> [(partition: TopicPartition, value: [UInt8])] {
        let empty = encodeMarksJSON([:])
        return records.map { (TopicPartition(topic: $0.topic, partition: $0.partition), $0.encoded(marksJSON: empty)) }
    }

    /// A record the state directory kept unwritten, with its batch's marks; nil if this version cannot read it.
    static func decode(unwritten: UnwrittenStateRecord) -> PartitionStateRecord? {
        guard var record = decode(unwritten.value),
            let marks = try? JSONDecoder().decode([String: Int64].self, from: Data(unwritten.marks))
        else { return nil }
        record.marks = marks
        return record
    }

    /// nil for a tombstone, a record of another format version, or bytes that are not a state record (`problem`).
    static func decode(_ value: [UInt8]?) -> PartitionStateRecord? {
        guard let value, let record = try? JSONDecoder().decode(PartitionStateRecord.self, from: Data(value)),
            record.v == currentVersion, record.problem == nil
        else { return nil }
        return record
    }

    /// Why `value`, neither a record of this version nor of a newer one, was not read: for the log.
    static func whyUnreadable(_ value: [UInt8]) -> String {
        struct Version: Decodable { var v: Int }
        let data = Data(value)
        guard let version = try? JSONDecoder().decode(Version.self, from: data) else { return "not a state record" }
        if version.v > currentVersion { return "a newer version's record without a partition and epoch in range" }
        guard version.v == currentVersion else { return "format version \(version.v)" }
        guard let record = try? JSONDecoder().decode(PartitionStateRecord.self, from: data) else {
            return "fields missing or of the wrong type for format version \(currentVersion)"
        }
        return record.problem ?? "unreadable"
    }

    /// The largest epoch a record may carry. A claim takes the largest epoch it saw plus one, and epochs grow by one a
    /// takeover, so no instance writes one near it; a record that claims one (hand-written, or damaged) would make
    /// every successor's claim overflow, and each instance that took the partition over would crash.
    static let maxEpoch: Int64 = 1 << 62

    /// The largest replay count a record may carry: counts are added up across records (far below it in practice).
    static let maxCount = 1 << 53

    /// Why this cannot be a record an instance wrote, or nil. What this version reads must stay within what its
    /// arithmetic and librdkafka take: a negative offset assigned to the events consumer stopped the partition
    /// (librdkafka refuses it), and an epoch or a replay's range near `Int64.max` overflowed in a claim or a replay's counts.
    var problem: String? {
        if partition < 0 { return "partition \(partition)" }
        if !(-1...Self.maxEpoch).contains(epoch) { return "epoch \(epoch) outside -1…\(Self.maxEpoch)" }
        if offset < 0 { return "offset \(offset)" }
        if let from, !(0...offset).contains(from) { return "from \(from) outside 0…\(offset)" }
        if let mark = marks.first(where: { $0.value < 0 }) { return "mark \(mark.value) of \(mark.key)" }
        if let processedAtMs, !EmailReceived.receivedAtRange.contains(processedAtMs) { return "processedAtMs \(processedAtMs)" }
        if let restoredTo, restoredTo < 0 { return "restoredTo \(restoredTo)" }
        let counted = counts.map { [$0.events, $0.jobs, $0.deadLetters, $0.duplicates] } ?? []
        if counted.contains(where: { !(0...Self.maxCount).contains($0) }) { return "replay counts outside 0…\(Self.maxCount)" }
        return nil
    }
}

/// What this version reads of a state record a newer mailpush wrote (a format version above `currentVersion`):
/// not enough to follow, enough to tell whose it is. A claim among such records still fences this instance
/// (`PartitionLeases.renew`): during a rolling upgrade, or a rollback with a newer member left behind, the older
/// member must step back from a partition the newer one took, though it cannot read the newer one's state.
struct NewerStateRecord: Decodable, Sendable {
    var v: Int
    var partition: Int32
    var epoch: Int64?
    var owner: String?
    var host: String?

    /// nil unless `value` is a record of a newer format version (with an epoch this version can claim past).
    static func decode(_ value: [UInt8]?) -> NewerStateRecord? {
        guard let value, let record = try? JSONDecoder().decode(NewerStateRecord.self, from: Data(value)),
            record.v > PartitionStateRecord.currentVersion, record.partition >= 0,
            (-1...PartitionStateRecord.maxEpoch).contains(record.epoch ?? -1)
        else { return nil }
        return record
    }
}
