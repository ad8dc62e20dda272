import Foundation
import GRDB
import MailpushPartition

/// One change to the materialized config topics: a registration's raw bytes, or `nil` for a tombstone.
public struct ConfigChange: Sendable {
    public enum Table: Sendable { case devices, addressKeys }
    public var table: Table
    /// deviceId for devices, emailAddressId for address keys.
    public var id: String
    public var owner: String?
    public var value: [UInt8]?

    public init(table: Table, id: String, owner: String?, value: [UInt8]?) {
        self.table = table
        self.id = id
        self.owner = owner
        self.value = value
    }
}

public struct StateError: Error, CustomStringConvertible, Sendable {
    public var description: String
    public init(_ description: String) { self.description = description }
}

/// The service's durable state in one SQLite file: input offsets, the materialized config topics,
/// the dedupe window and the output scan marks used for crash recovery.
///
/// Every method that advances an input offset writes the state that offset produced in the same
/// transaction, so a crash can never separate the two.
public final class StateStore: Sendable {
    public static let fileName = "mailpush.sqlite"

    public let path: String
    /// Internal, not private: extensions in other files of this module (replay requests) use it.
    let pool: DatabasePool

    /// Opens (creating if needed) the state in `directory`.
    public init(directory: String) throws(StateError) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else {
                throw StateError("state directory \(directory) is not a directory")
            }
        } else {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            } catch {
                throw StateError("cannot create state directory \(directory): \(error.localizedDescription)")
            }
        }
        guard FileManager.default.isWritableFile(atPath: directory) else {
            throw StateError("state directory \(directory) is not writable")
        }
        path = (directory as NSString).appendingPathComponent(Self.fileName)

        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        // WAL + NORMAL: a commit survives a process crash (SIGKILL); only a power loss can drop the
        // last transactions, which recovery then redoes from Kafka.
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
            try Self.migrator.migrate(pool)
            let check = try pool.read { db in try String.fetchOne(db, sql: "PRAGMA quick_check") }
            guard check == "ok" else {
                throw StateError("state database \(path) is corrupt (quick_check: \(check ?? "no answer")); restore it from a backup or move it away to rebuild from the topics")
            }
        } catch let error as StateError {
            throw error
        } catch {
            throw StateError("cannot open state database \(path): \(error); restore it from a backup or move it away to rebuild from the topics")
        }
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE input_offset (
                    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
                    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
                CREATE TABLE device (
                    device_id TEXT PRIMARY KEY, owner TEXT NOT NULL, registration BLOB NOT NULL) WITHOUT ROWID;
                CREATE INDEX device_owner ON device(owner);
                CREATE TABLE address_key (
                    email_address_id TEXT PRIMARY KEY, owner TEXT, record BLOB NOT NULL) WITHOUT ROWID;
                CREATE TABLE processed_email (
                    email_key TEXT PRIMARY KEY, processed_at_ms INTEGER NOT NULL) WITHOUT ROWID;
                CREATE INDEX processed_email_age ON processed_email(processed_at_ms);
                CREATE TABLE output_mark (
                    topic TEXT NOT NULL, partition INTEGER NOT NULL, scan_from INTEGER NOT NULL,
                    PRIMARY KEY (topic, partition)) WITHOUT ROWID;
                """)
        }
        Self.registerReplayMigration(&migrator)
        return migrator
    }

    private func wrap<T>(_ what: String, _ body: () throws -> T) throws(StateError) -> T {
        do {
            return try body()
        } catch {
            throw StateError("state database \(path): \(what) failed: \(error)")
        }
    }

    // MARK: Offsets

    public func offsets() throws(StateError) -> [TopicPartition: Int64] {
        try wrap("reading offsets") {
            try pool.read { db in
                var result: [TopicPartition: Int64] = [:]
                for row in try Row.fetchAll(db, sql: "SELECT topic, partition, next_offset FROM input_offset") {
                    result[TopicPartition(topic: row[0], partition: row[1])] = row[2]
                }
                return result
            }
        }
    }

    /// Sets offsets directly (the `offsets` command); returns the previous values.
    @discardableResult
    public func setOffsets(_ offsets: [TopicPartition: Int64]) throws(StateError) -> [TopicPartition: Int64?] {
        try wrap("setting offsets") {
            try pool.write { db in
                var previous: [TopicPartition: Int64?] = [:]
                for (key, offset) in offsets {
                    previous[key] = try Int64.fetchOne(
                        db, sql: "SELECT next_offset FROM input_offset WHERE topic = ? AND partition = ?",
                        arguments: [key.topic, key.partition])
                    try Self.storeOffset(db, key, offset)
                }
                return previous
            }
        }
    }

    private static func storeOffset(_ db: Database, _ key: TopicPartition, _ offset: Int64) throws {
        try db.execute(
            sql: "INSERT INTO input_offset (topic, partition, next_offset) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET next_offset = excluded.next_offset",
            arguments: [key.topic, key.partition, offset])
    }

    // MARK: Config topics

    public func devices() throws(StateError) -> [(deviceId: String, registration: [UInt8])] {
        try wrap("reading devices") {
            try pool.read { db in
                try Row.fetchAll(db, sql: "SELECT device_id, registration FROM device").map { row in
                    (row[0], [UInt8](row[1] as Data))
                }
            }
        }
    }

    public func addressKeys() throws(StateError) -> [(emailAddressId: String, record: [UInt8])] {
        try wrap("reading address keys") {
            try pool.read { db in
                try Row.fetchAll(db, sql: "SELECT email_address_id, record FROM address_key").map { row in
                    (row[0], [UInt8](row[1] as Data))
                }
            }
        }
    }

    /// Applies config changes and advances the config partitions' offsets in one transaction.
    public func applyConfig(_ changes: [ConfigChange], offsets: [TopicPartition: Int64]) throws(StateError) {
        try wrap("applying config") {
            try pool.write { db in
                for change in changes {
                    switch (change.table, change.value) {
                    case (.devices, let value?):
                        try db.execute(
                            sql: "INSERT INTO device (device_id, owner, registration) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET owner = excluded.owner, registration = excluded.registration",
                            arguments: [change.id, change.owner ?? "", Data(value)])
                    case (.devices, nil):
                        try db.execute(sql: "DELETE FROM device WHERE device_id = ?", arguments: [change.id])
                    case (.addressKeys, let value?):
                        try db.execute(
                            sql: "INSERT INTO address_key (email_address_id, owner, record) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET owner = excluded.owner, record = excluded.record",
                            arguments: [change.id, change.owner, Data(value)])
                    case (.addressKeys, nil):
                        try db.execute(sql: "DELETE FROM address_key WHERE email_address_id = ?", arguments: [change.id])
                    }
                }
                for (key, offset) in offsets { try Self.storeOffset(db, key, offset) }
            }
        }
    }

    // MARK: Events

    /// The subset of `emailKeys` processed at or after `sinceMs`.
    public func processedEmails(among emailKeys: some Collection<String>, sinceMs: Int64) throws(StateError) -> Set<String> {
        guard !emailKeys.isEmpty else { return [] }
        return try wrap("reading the dedupe window") {
            try pool.read { db in
                let statement = try db.cachedStatement(
                    sql: "SELECT 1 FROM processed_email WHERE email_key = ? AND processed_at_ms >= ?")
                var found = Set<String>()
                for key in emailKeys where try Bool.fetchOne(statement, arguments: [key, sinceMs]) != nil {
                    found.insert(key)
                }
                return found
            }
        }
    }

    /// Commits one processed batch of events: the emails it processed, the offsets it reached and the
    /// new output scan marks, atomically.
    public func commitEventBatch(
        offsets: [TopicPartition: Int64], processedEmails: some Collection<String>, processedAtMs: Int64,
        outputMarks: [TopicPartition: Int64]
    ) throws(StateError) {
        try wrap("committing a batch") {
            try pool.write { db in
                let insert = try db.cachedStatement(
                    sql: "INSERT INTO processed_email (email_key, processed_at_ms) VALUES (?, ?) ON CONFLICT DO UPDATE SET processed_at_ms = excluded.processed_at_ms")
                for key in processedEmails { try insert.execute(arguments: [key, processedAtMs]) }
                for (key, offset) in offsets { try Self.storeOffset(db, key, offset) }
                try Self.storeOutputMarks(db, outputMarks)
            }
        }
    }

    /// Deletes dedupe entries older than `beforeMs`, at most `limit` at a time; returns how many went.
    public func expireProcessedEmails(beforeMs: Int64, limit: Int = 10_000) throws(StateError) -> Int {
        try wrap("expiring the dedupe window") {
            try pool.write { db in
                try db.execute(
                    sql: "DELETE FROM processed_email WHERE email_key IN (SELECT email_key FROM processed_email WHERE processed_at_ms < ? LIMIT ?)",
                    arguments: [beforeMs, limit])
                return db.changesCount
            }
        }
    }

    public func processedEmailCount() throws(StateError) -> Int {
        try wrap("counting the dedupe window") {
            try pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM processed_email") ?? 0 }
        }
    }

    // MARK: Output scan marks

    /// Where recovery starts reading each output partition: no output of an uncommitted batch lies before these.
    public func outputMarks() throws(StateError) -> [TopicPartition: Int64] {
        try wrap("reading output marks") {
            try pool.read { db in
                var result: [TopicPartition: Int64] = [:]
                for row in try Row.fetchAll(db, sql: "SELECT topic, partition, scan_from FROM output_mark") {
                    result[TopicPartition(topic: row[0], partition: row[1])] = row[2]
                }
                return result
            }
        }
    }

    public func setOutputMarks(_ marks: [TopicPartition: Int64]) throws(StateError) {
        try wrap("storing output marks") {
            try pool.write { db in try Self.storeOutputMarks(db, marks) }
        }
    }

    private static func storeOutputMarks(_ db: Database, _ marks: [TopicPartition: Int64]) throws {
        for (key, offset) in marks {
            try db.execute(
                sql: "INSERT INTO output_mark (topic, partition, scan_from) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET scan_from = excluded.scan_from",
                arguments: [key.topic, key.partition, offset])
        }
    }
}
