import Foundation
import GRDB
import MailpushPartition

/// A replay of ranges of the events topic, recorded in the state so that exactly one process — the one that
/// holds the state directory's lock — executes it, batch by batch, and a crash resumes it where its last
/// committed batch ended (docs/exactly-once.md, "Replays").
public struct ReplayRequest: Sendable, Equatable {
    public enum Status: String, Sendable { case pending, done, failed }

    public struct Cursor: Sendable, Equatable {
        public var partition: Int32
        /// Next offset to replay (advanced with each committed replay batch).
        public var next: Int64
        /// Offset to stop before.
        public var end: Int64
        public init(partition: Int32, next: Int64, end: Int64) {
            self.partition = partition
            self.next = next
            self.end = end
        }
    }

    public struct Counts: Sendable, Equatable {
        public var eventsRead = 0
        public var jobs = 0
        public var deadLetters = 0
        public var duplicates = 0
        public init() {}
        public static func += (lhs: inout Counts, rhs: Counts) {
            lhs.eventsRead += rhs.eventsRead
            lhs.jobs += rhs.jobs
            lhs.deadLetters += rhs.deadLetters
            lhs.duplicates += rhs.duplicates
        }
    }

    public var id: Int64
    public var eventsTopic: String
    public var force: Bool
    public var status: Status
    public var detail: String?
    public var eventsTotal: Int
    public var counts: Counts
    public var cursors: [Cursor]

    /// The ranges still to replay (empty partitions left out).
    public var remaining: [Cursor] { cursors.filter { $0.next < $0.end } }
}

extension StateStore {
    static func registerReplayMigration(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("replay-requests") { db in
            try db.execute(
                sql: """
                    CREATE TABLE replay_request (
                        id INTEGER PRIMARY KEY AUTOINCREMENT, events_topic TEXT NOT NULL, force INTEGER NOT NULL,
                        status TEXT NOT NULL, detail TEXT, requested_at_ms INTEGER NOT NULL,
                        events_total INTEGER NOT NULL, events_read INTEGER NOT NULL DEFAULT 0,
                        jobs INTEGER NOT NULL DEFAULT 0, dead_letters INTEGER NOT NULL DEFAULT 0,
                        duplicates INTEGER NOT NULL DEFAULT 0);
                    CREATE TABLE replay_cursor (
                        request_id INTEGER NOT NULL REFERENCES replay_request(id), partition INTEGER NOT NULL,
                        next_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL,
                        PRIMARY KEY (request_id, partition)) WITHOUT ROWID;
                    """)
        }
    }

    /// Records a replay to be executed by whichever process holds the state directory; returns its id.
    public func submitReplay(eventsTopic: String, cursors: [ReplayRequest.Cursor], force: Bool, nowMs: Int64) throws(StateError) -> Int64 {
        try wrap("recording a replay request") {
            try pool.write { db in
                try Self.insertReplay(db, eventsTopic: eventsTopic, cursors: cursors, force: force, nowMs: nowMs, done: .init())
            }
        }
    }

    /// Inserts a pending request whose counts start at `done` (what was read and written before its cursors).
    static func insertReplay(
        _ db: Database, eventsTopic: String, cursors: [ReplayRequest.Cursor], force: Bool, nowMs: Int64, done: ReplayRequest.Counts
    ) throws -> Int64 {
        let total = done.eventsRead + cursors.reduce(0) { $0 + max(0, Int($1.end - $1.next)) }
        try db.execute(
            sql: """
                INSERT INTO replay_request (events_topic, force, status, requested_at_ms, events_total, events_read, jobs,
                    dead_letters, duplicates)
                VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?)
                """,
            arguments: [eventsTopic, force, nowMs, total, done.eventsRead, done.jobs, done.deadLetters, done.duplicates])
        let id = db.lastInsertedRowID
        for cursor in cursors {
            try db.execute(
                sql: "INSERT INTO replay_cursor (request_id, partition, next_offset, end_offset) VALUES (?, ?, ?, ?)",
                arguments: [id, cursor.partition, cursor.next, cursor.end])
        }
        return id
    }

    /// Replays not finished yet, oldest first.
    public func pendingReplays() throws(StateError) -> [ReplayRequest] {
        try wrap("reading replay requests") {
            try pool.read { db in
                try Int64.fetchAll(db, sql: "SELECT id FROM replay_request WHERE status = 'pending' ORDER BY id").compactMap {
                    try Self.replay(db, id: $0)
                }
            }
        }
    }

    public func replay(id: Int64) throws(StateError) -> ReplayRequest? {
        try wrap("reading replay request \(id)") {
            try pool.read { db in try Self.replay(db, id: id) }
        }
    }

    private static func replay(_ db: Database, id: Int64) throws -> ReplayRequest? {
        guard
            let row = try Row.fetchOne(
                db,
                sql: """
                    SELECT events_topic, force, status, detail, events_total, events_read, jobs, dead_letters, duplicates
                    FROM replay_request WHERE id = ?
                    """, arguments: [id])
        else { return nil }
        var counts = ReplayRequest.Counts()
        counts.eventsRead = row[5]
        counts.jobs = row[6]
        counts.deadLetters = row[7]
        counts.duplicates = row[8]
        let cursors = try Row.fetchAll(
            db, sql: "SELECT partition, next_offset, end_offset FROM replay_cursor WHERE request_id = ? ORDER BY partition",
            arguments: [id]
        ).map { ReplayRequest.Cursor(partition: $0[0], next: $0[1], end: $0[2]) }
        return ReplayRequest(
            id: id, eventsTopic: row[0], force: row[1], status: ReplayRequest.Status(rawValue: row[2]) ?? .failed,
            detail: row[3], eventsTotal: row[4], counts: counts, cursors: cursors)
    }

    /// Commits one replay batch: its dedupe entries, the replay's cursors and counts, and output marks, atomically
    /// — the replay's counterpart of `commitEventBatch` (a crash resumes from these cursors).
    public func commitReplayBatch(
        id: Int64, cursors: [Int32: Int64], counts: ReplayRequest.Counts, processedEmails: some Collection<String>,
        processedAtMs: Int64, outputMarks: [TopicPartition: Int64]
    ) throws(StateError) {
        try wrap("committing a replay batch") {
            try pool.write { db in
                try Self.recordProcessedEmails(db, processedEmails, at: processedAtMs)
                for (partition, next) in cursors {
                    try db.execute(
                        sql: "UPDATE replay_cursor SET next_offset = max(next_offset, ?) WHERE request_id = ? AND partition = ?",
                        arguments: [next, id, partition])
                }
                try db.execute(
                    sql: """
                        UPDATE replay_request SET events_read = events_read + ?, jobs = jobs + ?,
                            dead_letters = dead_letters + ?, duplicates = duplicates + ? WHERE id = ?
                        """, arguments: [counts.eventsRead, counts.jobs, counts.deadLetters, counts.duplicates, id])
                knownOutputMarks.withLock { $0 = nil }
                try Self.storeOutputMarks(db, outputMarks)
            }
        }
    }

    /// Ends a replay: done, or failed with the reason the requester is shown.
    public func finishReplay(id: Int64, status: ReplayRequest.Status, detail: String? = nil) throws(StateError) {
        try wrap("finishing replay request \(id)") {
            try pool.write { db in
                try db.execute(
                    sql: "UPDATE replay_request SET status = ?, detail = ? WHERE id = ?",
                    arguments: [status.rawValue, detail, id])
            }
        }
    }
}
