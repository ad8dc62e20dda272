import Foundation
import GRDB
import MailpushPartition

/// What an instance of a fleet knows about the event partitions it owns or owned: the ownership epoch it last
/// held, and how far into the state topic its local state already reflects (a partition that comes back is
/// restored from there on, not from the beginning).
public struct PartitionOwnerRecord: Sendable, Hashable {
    public var epoch: Int64
    /// Offset in the partition's state-topic partition after the last record this state reflects.
    public var stateNextOffset: Int64
    /// Output marks valid for the partition when this instance stopped owning it (released, or found owned
    /// at start-up after a crash); nil while it is owned. The instance-wide marks move on without it.
    public var marks: [TopicPartition: Int64]?

    public init(epoch: Int64, stateNextOffset: Int64, marks: [TopicPartition: Int64]? = nil) {
        self.epoch = epoch
        self.stateNextOffset = stateNextOffset
        self.marks = marks
    }
}

/// A state-topic record (`published_batch`) the owner deletes once it is no longer needed: when `deleteAfterMs`
/// (its dedupe entries' time; 0 without entries) is before the dedupe horizon and, for a batch record
/// (`coveredAt`, its offset), once a checkpoint of the owner at or past it has been acknowledged.
public struct DeletableStateRecord: Sendable, Hashable {
    public var partition: TopicPartition
    public var key: String
    public var deleteAfterMs: Int64
    public var coveredAt: Int64?

    public init(partition: TopicPartition, key: String, deleteAfterMs: Int64, coveredAt: Int64?) {
        self.partition = partition
        self.key = key
        self.deleteAfterMs = deleteAfterMs
        self.coveredAt = coveredAt
    }
}

/// An output mark named as a fleet's state records name it: "topic/partition" (`TopicPartition.name`).
public struct NamedOutputMark: Sendable, Hashable {
    public var name: String
    public var offset: Int64

    public init(name: String, offset: Int64) {
        self.name = name
        self.offset = offset
    }
}

/// Output marks in the byte order of their names, with a checksum (the sum of each mark's low 32 bits, which SQLite
/// adds up without overflowing): what `StateStore` knows of its marks table.
struct KnownOutputMarks: Sendable, Equatable {
    private(set) var marks: [NamedOutputMark]
    private(set) var sum: Int64

    init(_ marks: [NamedOutputMark]) {
        self.marks = marks
        sum = marks.reduce(0) { $0 + Self.lowBits($1.offset) }
    }

    static func lowBits(_ offset: Int64) -> Int64 { offset & 0xFFFF_FFFF }

    /// As the marks table's upsert sets them: each one's mark replaced, or added in its place.
    mutating func apply(_ written: [TopicPartition: Int64]) {
        for (partition, offset) in written {
            let name = partition.name
            var low = 0
            var high = marks.count
            while low < high {
                let middle = (low + high) / 2
                if marks[middle].name.precedesInByteOrder(name) { low = middle + 1 } else { high = middle }
            }
            if low < marks.count, marks[low].name == name {
                sum += Self.lowBits(offset) - Self.lowBits(marks[low].offset)
                marks[low].offset = offset
            } else {
                marks.insert(NamedOutputMark(name: name, offset: offset), at: low)
                sum += Self.lowBits(offset)
            }
        }
    }
}

/// A state record of a committed batch that the state topic has not acknowledged yet: the record without its marks
/// (`value`), and the marks of its batch's commit, which the batch's records share and are stored once.
public struct UnwrittenStateRecord: Sendable, Hashable {
    public var id: Int64
    /// The event partition it is about.
    public var partition: TopicPartition
    public var value: [UInt8]
    public var marks: [UInt8]

    /// A committed batch's records to store with its commit: each record's value, and their shared marks.
    public struct Batch: Sendable {
        public var marks: [UInt8]
        public var records: [(partition: TopicPartition, value: [UInt8])]

        public init(marks: [UInt8], records: [(partition: TopicPartition, value: [UInt8])]) {
            self.marks = marks
            self.records = records
        }

        /// The records as one value, stored with the commit as one row (`unwritten_state_batch`): each record's
        /// topic length (2 bytes), topic, partition (4), value length (4) and value, big-endian.
        var packedRecords: [UInt8] {
            var bytes: [UInt8] = []
            bytes.reserveCapacity(records.reduce(0) { $0 + 10 + $1.partition.topic.utf8.count + $1.value.count })
            func append<T: FixedWidthInteger>(_ value: T) {
                withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
            }
            for (partition, value) in records {
                append(UInt16(partition.topic.utf8.count))
                bytes.append(contentsOf: partition.topic.utf8)
                append(partition.partition)
                append(UInt32(value.count))
                bytes.append(contentsOf: value)
            }
            return bytes
        }

        /// The records of `packedRecords`; nil if `bytes` are not such a value.
        static func unpack(_ bytes: [UInt8]) -> [(partition: TopicPartition, value: [UInt8])]? {
            var records: [(partition: TopicPartition, value: [UInt8])] = []
            var at = 0
            func take(_ count: Int) -> ArraySlice<UInt8>? {
                guard count <= bytes.count - at else { return nil }
                defer { at += count }
                return bytes[at..<at + count]
            }
            func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
                take(MemoryLayout<T>.size).map { $0.reduce(T.zero) { $0 << 8 | T($1) } }
            }
            while at < bytes.count {
                guard let topicLength = integer(UInt16.self), let topic = take(Int(topicLength)),
                    let partition = integer(UInt32.self), let valueLength = integer(UInt32.self), let value = take(Int(valueLength))
                else { return nil }
                records.append(
                    (TopicPartition(topic: String(decoding: topic, as: UTF8.self), partition: Int32(bitPattern: partition)), Array(value)))
            }
            return records
        }
    }
}

/// A partition's state as restored from the state topic, to be written over the local state in one transaction.
public struct RestoredPartition: Sendable {
    public var partition: TopicPartition
    /// Next event offset to process.
    public var offset: Int64
    /// Where recovery starts reading back each output partition for this partition's unfinished batches.
    public var outputMarks: [TopicPartition: Int64]
    /// Dedupe entries: key → processed at (ms).
    public var processedEmails: [String: Int64]
    public var owner: PartitionOwnerRecord

    public init(
        partition: TopicPartition, offset: Int64, outputMarks: [TopicPartition: Int64], processedEmails: [String: Int64],
        owner: PartitionOwnerRecord
    ) {
        self.partition = partition
        self.offset = offset
        self.outputMarks = outputMarks
        self.processedEmails = processedEmails
        self.owner = owner
    }
}

extension StateStore {
    static func registerFleetMigration(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v4-fleet") { db in
            try db.execute(
                sql: """
                    CREATE TABLE partition_owner (
                        topic TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
                        state_next_offset INTEGER NOT NULL, marks TEXT, PRIMARY KEY (topic, partition)) WITHOUT ROWID;
                    CREATE TABLE instance_identity (id INTEGER PRIMARY KEY CHECK (id = 1), instance_id TEXT NOT NULL);
                    CREATE TABLE published_batch (
                        topic TEXT NOT NULL, partition INTEGER NOT NULL, record_key TEXT NOT NULL,
                        processed_at_ms INTEGER NOT NULL, PRIMARY KEY (topic, partition, record_key)) WITHOUT ROWID;
                    CREATE TABLE fleet_replay (
                        replay_id TEXT NOT NULL, partition INTEGER NOT NULL, local_id INTEGER NOT NULL,
                        PRIMARY KEY (replay_id, partition)) WITHOUT ROWID;
                    """)
        }
        // Every batch record is deleted in the end, also one without dedupe entries, but only once a checkpoint
        // of the owner reaches it (a restore that lost it to compaction continues from that checkpoint instead).
        migrator.registerMigration("v5-state-record-deletion") { db in
            try db.execute(sql: "ALTER TABLE published_batch ADD COLUMN covered_at INTEGER")
        }
        // A committed batch's state records until the state topic acknowledged them: a crash between the commit
        // and that acknowledgement no longer loses the batch's dedupe entries for the partition's next owners.
        migrator.registerMigration("v6-unwritten-state-records") { db in
            try db.execute(
                sql: """
                    CREATE TABLE unwritten_state_marks (id INTEGER PRIMARY KEY, marks BLOB NOT NULL);
                    CREATE TABLE unwritten_state_record (
                        id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL,
                        marks_id INTEGER NOT NULL REFERENCES unwritten_state_marks (id), value BLOB NOT NULL);
                    CREATE INDEX unwritten_state_record_by_marks ON unwritten_state_record (marks_id);
                    """)
        }
        // A batch's records stored with its commit as one row, not one per record: a row per event partition the
        // batch touched (about 60 under load) made the commit, which the next batch waits for, about 2.7% of the p50
        // longer (docs/performance.md, sessions 29 and 30). Rows of their own remain for records set aside and for batches
        // a crash left (`splitUnwrittenBatches`).
        migrator.registerMigration("v7-unwritten-state-batches") { db in
            try db.execute(sql: "CREATE TABLE unwritten_state_batch (id INTEGER PRIMARY KEY, marks BLOB NOT NULL, records BLOB NOT NULL)")
        }
    }

    /// This state directory's identity in a fleet, made on first use: the owner named in the state topic.
    public func instanceId() throws(StateError) -> String {
        try wrap("reading the instance id") {
            try pool.write { db in
                if let id = try String.fetchOne(db, sql: "SELECT instance_id FROM instance_identity WHERE id = 1") { return id }
                let id = UUID().uuidString.lowercased()
                try db.execute(sql: "INSERT INTO instance_identity (id, instance_id) VALUES (1, ?)", arguments: [id])
                return id
            }
        }
    }

    public func partitionOwners() throws(StateError) -> [TopicPartition: PartitionOwnerRecord] {
        try wrap("reading partition owners") {
            try pool.read { db in
                var result: [TopicPartition: PartitionOwnerRecord] = [:]
                for row in try Row.fetchAll(db, sql: "SELECT topic, partition, epoch, state_next_offset, marks FROM partition_owner") {
                    result[TopicPartition(topic: row[0], partition: row[1])] = PartitionOwnerRecord(
                        epoch: row[2], stateNextOffset: row[3], marks: (row[4] as String?).map(Self.decodeMarks))
                }
                return result
            }
        }
    }

    public func setPartitionOwner(_ partition: TopicPartition, _ owner: PartitionOwnerRecord) throws(StateError) {
        try wrap("recording a partition owner") {
            try pool.write { db in try Self.storeOwner(db, partition, owner) }
        }
    }

    /// Writes restored partitions over the local state: each one's offset, its dedupe entries (added; an entry kept
    /// locally stays), and output marks lowered to the restored ones where those are lower (a mark may only be
    /// too old, never past an output of an unfinished batch), with the ownership, all in one transaction (a
    /// takeover's partitions are applied together: one transaction each took about 2 ms, most of a restart
    /// that resumed 128 partitions).
    public func applyRestored(_ partitions: [RestoredPartition]) throws(StateError) {
        guard !partitions.isEmpty else { return }
        try wrap("applying restored partitions") {
            try pool.write { db in
                let offset = try db.cachedStatement(
                    sql:
                        "INSERT INTO input_offset (topic, partition, next_offset) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET next_offset = excluded.next_offset"
                )
                let entry = try db.cachedStatement(
                    sql: """
                        INSERT INTO processed_email (email_key, processed_at_ms) VALUES (?, ?)
                        ON CONFLICT DO UPDATE SET processed_at_ms = max(processed_at_ms, excluded.processed_at_ms)
                        """)
                let mark = try db.cachedStatement(
                    sql: """
                        INSERT INTO output_mark (topic, partition, scan_from) VALUES (?, ?, ?)
                        ON CONFLICT DO UPDATE SET scan_from = min(scan_from, excluded.scan_from)
                        """)
                knownOutputMarks.withLock { $0 = nil }
                for restored in partitions {
                    try offset.execute(arguments: [restored.partition.topic, restored.partition.partition, restored.offset])
                    for (key, at) in restored.processedEmails { try entry.execute(arguments: [key, at]) }
                    for (output, scanFrom) in restored.outputMarks {
                        try mark.execute(arguments: [output.topic, output.partition, scanFrom])
                    }
                    try Self.storeOwner(db, restored.partition, restored.owner)
                }
            }
        }
    }

    /// At start-up of a fleet member: the partitions it owned when it last stopped without releasing them
    /// keep today's marks (valid for their unfinished batches, which lie after them), before the marks move on.
    public func keepMarksOfUnreleasedPartitions() throws(StateError) {
        try wrap("keeping the marks of unreleased partitions") {
            try pool.write { db in
                try db.execute(
                    sql: "UPDATE partition_owner SET marks = ? WHERE marks IS NULL", arguments: [Self.encodeMarks(try Self.outputMarks(db))]
                )
            }
        }
    }

    /// The local replay request executing fleet replay `replayId` for `partition`, if any.
    public func fleetReplayLocalId(replayId: String, partition: Int32) throws(StateError) -> Int64? {
        try wrap("reading fleet replays") {
            try pool.read { db in
                try Int64.fetchOne(
                    db, sql: "SELECT local_id FROM fleet_replay WHERE replay_id = ? AND partition = ?", arguments: [replayId, partition])
            }
        }
    }

    /// The fleet replay (id and partition) a local replay request executes, if it is one.
    public func fleetReplay(localId: Int64) throws(StateError) -> (replayId: String, partition: Int32)? {
        try wrap("reading fleet replays") {
            try pool.read { db in
                try Row.fetchOne(db, sql: "SELECT replay_id, partition FROM fleet_replay WHERE local_id = ?", arguments: [localId]).map {
                    ($0[0], $0[1])
                }
            }
        }
    }

    /// The event partitions with a fleet replay recorded here and not finished.
    public func partitionsWithPendingFleetReplays() throws(StateError) -> Set<Int32> {
        try wrap("reading fleet replays") {
            try pool.read { db in
                Set(
                    try Int32.fetchAll(
                        db,
                        sql: """
                            SELECT DISTINCT f.partition FROM fleet_replay f JOIN replay_request r ON r.id = f.local_id
                            WHERE r.status = 'pending'
                            """))
            }
        }
    }

    /// The `mailpush-replay` header value of a local replay request's outputs: its fleet replay's id, or
    /// `request-N`.
    public func replayTag(localId: Int64) -> String {
        ((try? fleetReplay(localId: localId))??.replayId) ?? "request-\(localId)"
    }

    /// Records a fleet replay's part for `partition` as a local replay request (replacing an older one), with the
    /// mapping, in one transaction. `done`: what the part's earlier owners read and wrote before `next`, so that
    /// the progress this instance publishes counts the part from its start.
    public func submitFleetReplay(
        replayId: String, eventsTopic: String, partition: Int32, next: Int64, end: Int64, force: Bool, nowMs: Int64,
        done: ReplayRequest.Counts = .init()
    ) throws(StateError) -> Int64 {
        try wrap("recording a fleet replay") {
            try pool.write { db in
                let local = try Self.insertReplay(
                    db, eventsTopic: eventsTopic, cursors: [ReplayRequest.Cursor(partition: partition, next: next, end: end)],
                    force: force, nowMs: nowMs, done: done)
                try db.execute(
                    sql:
                        "INSERT INTO fleet_replay (replay_id, partition, local_id) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET local_id = excluded.local_id",
                    arguments: [replayId, partition, local])
                return local
            }
        }
    }

    /// The unwritten state records of their own (set aside when their write was given up, or split from the
    /// batches a crash left) for the partitions not in `except`, oldest first. A batch waiting in this process for
    /// its write is not among them.
    public func unwrittenStateRecords(except: Set<TopicPartition>) throws(StateError) -> [UnwrittenStateRecord] {
        try wrap("reading unwritten state records") {
            try pool.read { db in
                try Row.fetchAll(
                    db,
                    sql: """
                        SELECT r.id, r.topic, r.partition, r.value, m.marks
                        FROM unwritten_state_record r JOIN unwritten_state_marks m ON m.id = r.marks_id ORDER BY r.id
                        """
                ).compactMap { row in
                    let record = UnwrittenStateRecord(
                        id: row[0], partition: TopicPartition(topic: row[1], partition: row[2]), value: [UInt8](row[3] as Data),
                        marks: [UInt8](row[4] as Data))
                    return except.contains(record.partition) ? nil : record
                }
            }
        }
    }

    /// Unwritten records of their own (`unwrittenStateRecords`) the state topic acknowledged: no longer unwritten
    /// (nor the marks no record needs any more), and their keys remembered for deletion (`deletable`), in one
    /// transaction.
    public func stateRecordsWritten(_ ids: [Int64], deletable: [DeletableStateRecord]) throws(StateError) {
        guard !ids.isEmpty || !deletable.isEmpty else { return }
        try wrap("recording written state records") {
            try pool.write { db in
                try Self.inStatementSizedPieces(ids) { ids, _ in
                    try db.execute(
                        sql: "DELETE FROM unwritten_state_record WHERE id IN (\(ids.map { _ in "?" }.joined(separator: ", ")))",
                        arguments: StatementArguments(Array(ids)))
                }
                if !ids.isEmpty {
                    try db.execute(
                        sql: """
                            DELETE FROM unwritten_state_marks
                            WHERE NOT EXISTS (SELECT 1 FROM unwritten_state_record WHERE marks_id = unwritten_state_marks.id)
                            """)
                }
                try Self.storeDeletableStateRecords(db, deletable)
            }
        }
    }

    /// Stores a committed batch's records as one row; returns its id (nil: no records).
    static func storeUnwrittenStateBatch(_ db: Database, _ batch: UnwrittenStateRecord.Batch) throws -> Int64? {
        guard !batch.records.isEmpty else { return nil }
        try db.cachedStatement(sql: "INSERT INTO unwritten_state_batch (marks, records) VALUES (?, ?)").execute(
            arguments: [Data(batch.marks), Data(batch.packedRecords)])
        return db.lastInsertedRowID
    }

    /// The records of stored batches (`commitEventBatch`) that are no longer waiting in this process: `batches`
    /// leave the state directory, their records each written or set aside; the records of `setAside` (of those
    /// batches or of others) stay as unwritten records of their own, which a takeover or release writes
    /// (`unwrittenStateRecords`); `deletable`: the keys of batch records written, remembered for their deletion.
    /// In one transaction.
    public func stateBatchesResolved(
        _ batches: [Int64], setAside: [Int64: Set<TopicPartition>], deletable: [DeletableStateRecord]
    ) throws(StateError) {
        guard !batches.isEmpty || !setAside.isEmpty || !deletable.isEmpty else { return }
        try wrap("recording written state records") {
            try pool.write { db in
                for (batch, partitions) in setAside.sorted(by: { $0.key < $1.key }) {
                    try Self.splitUnwrittenBatch(db, batch, keeping: partitions)
                }
                try Self.inStatementSizedPieces(batches) { ids, _ in
                    try db.execute(
                        sql: "DELETE FROM unwritten_state_batch WHERE id IN (\(ids.map { _ in "?" }.joined(separator: ", ")))",
                        arguments: StatementArguments(Array(ids)))
                }
                try Self.storeDeletableStateRecords(db, deletable)
            }
        }
    }

    /// Makes every stored batch's records unwritten records of their own: at the start, before anything reads
    /// them, for the batches a crash (or a stop with writes failing) left. Some of their records may have been
    /// written; written again, a record changes nothing. Returns how many batches there were.
    @discardableResult
    public func splitUnwrittenBatches() throws(StateError) -> Int {
        try wrap("splitting unwritten state batches") {
            try pool.write { db in
                let batches = try Int64.fetchAll(db, sql: "SELECT id FROM unwritten_state_batch ORDER BY id")
                for batch in batches { try Self.splitUnwrittenBatch(db, batch, keeping: nil) }
                try db.execute(sql: "DELETE FROM unwritten_state_batch")
                return batches.count
            }
        }
    }

    /// Copies the records of stored batch `id` (`keeping`: only those of these partitions) to unwritten records of
    /// their own, with its marks.
    private static func splitUnwrittenBatch(_ db: Database, _ id: Int64, keeping partitions: Set<TopicPartition>?) throws {
        guard let row = try Row.fetchOne(db, sql: "SELECT marks, records FROM unwritten_state_batch WHERE id = ?", arguments: [id])
        else { return }
        guard let records = UnwrittenStateRecord.Batch.unpack([UInt8](row[1] as Data)) else {
            throw StateError("unwritten state batch \(id) is not one this version reads")
        }
        let kept = records.filter { partitions?.contains($0.partition) ?? true }
        guard !kept.isEmpty else { return }
        try db.execute(sql: "INSERT INTO unwritten_state_marks (marks) VALUES (?)", arguments: [row[0] as Data])
        let marksId = db.lastInsertedRowID
        for record in kept {
            try db.execute(
                sql: "INSERT INTO unwritten_state_record (topic, partition, marks_id, value) VALUES (?, ?, ?, ?)",
                arguments: [record.partition.topic, record.partition.partition, marksId, Data(record.value)])
        }
    }

    /// Records of the state topic to delete (tombstone) once they are no longer needed, so that a compacted state
    /// topic keeps about one dedupe window of them: see `DeletableStateRecord`.
    public func recordDeletableStateRecords(_ records: [DeletableStateRecord]) throws(StateError) {
        guard !records.isEmpty else { return }
        try wrap("recording deletable state records") {
            try pool.write { db in try Self.storeDeletableStateRecords(db, records) }
        }
    }

    static func storeDeletableStateRecords(_ db: Database, _ records: [DeletableStateRecord]) throws {
        guard !records.isEmpty else { return }
        let insert = try db.cachedStatement(
            sql: """
                INSERT INTO published_batch (topic, partition, record_key, processed_at_ms, covered_at) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT DO UPDATE SET processed_at_ms = max(processed_at_ms, excluded.processed_at_ms), covered_at = excluded.covered_at
                """)
        for record in records {
            try insert.execute(
                arguments: [record.partition.topic, record.partition.partition, record.key, record.deleteAfterMs, record.coveredAt])
        }
    }

    /// Up to `limit` records of the partitions in `checkpoints` that may be deleted now: their time is before
    /// `beforeMs`, and a batch record lies at or before the partition's acknowledged checkpoint (-1: none yet).
    /// `progress` selects replay progress records or the others: a finished replay's request is deleted before
    /// its progress (a request whose last progress was deleted first would be replayed again).
    public func deletableStateRecords(checkpoints: [TopicPartition: Int64], beforeMs: Int64, progress: Bool, limit: Int)
        throws(StateError) -> [(partition: TopicPartition, key: String)]
    {
        guard !checkpoints.isEmpty else { return [] }
        return try wrap("reading deletable state records") {
            try pool.read { db in
                var result: [(TopicPartition, String)] = []
                for (partition, checkpoint) in checkpoints.sorted(by: { $0.key < $1.key }) {
                    let rows = try Row.fetchAll(
                        db,
                        sql: """
                            SELECT record_key FROM published_batch WHERE topic = ? AND partition = ? AND processed_at_ms < ?
                            AND (covered_at IS NULL OR covered_at <= ?) AND (instr(record_key, '/progress/') > 0) = ? LIMIT ?
                            """,
                        arguments: [partition.topic, partition.partition, beforeMs, checkpoint, progress, limit - result.count])
                    result += rows.map { (partition, $0[0] as String) }
                    if result.count >= limit { break }
                }
                return result.map { (partition: $0.0, key: $0.1) }
            }
        }
    }

    public func forgetDeletableStateRecords(_ keys: [(partition: TopicPartition, key: String)]) throws(StateError) {
        try wrap("forgetting deleted state records") {
            try pool.write { db in
                for entry in keys {
                    try db.execute(
                        sql: "DELETE FROM published_batch WHERE topic = ? AND partition = ? AND record_key = ?",
                        arguments: [entry.partition.topic, entry.partition.partition, entry.key])
                }
            }
        }
    }

    private static func storeOwner(_ db: Database, _ partition: TopicPartition, _ owner: PartitionOwnerRecord) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO partition_owner (topic, partition, epoch, state_next_offset, marks) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT DO UPDATE SET epoch = excluded.epoch, state_next_offset = excluded.state_next_offset, marks = excluded.marks
                """
        ).execute(arguments: [partition.topic, partition.partition, owner.epoch, owner.stateNextOffset, owner.marks.map(encodeMarks)])
    }

    static func encodeMarks(_ marks: [TopicPartition: Int64]) -> String {
        marks.sorted { $0.key < $1.key }.map { "\($0.key.name)=\($0.value)" }.joined(separator: ",")
    }

    static func decodeMarks(_ text: String) -> [TopicPartition: Int64] {
        var result: [TopicPartition: Int64] = [:]
        for item in text.split(separator: ",") {
            guard let equals = item.lastIndex(of: "="), let partition = TopicPartition(name: item[..<equals]),
                let offset = Int64(item[item.index(after: equals)...])
            else { continue }
            result[partition] = offset
        }
        return result
    }
}
