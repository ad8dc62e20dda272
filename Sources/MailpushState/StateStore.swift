import Foundation
import GRDB
import MailpushPartition
import Synchronization

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

    /// The output marks as the table held them after the last commit that read them (`marksAfterWriting`), or nil.
    /// Read, set and forgotten inside write transactions, which the one writer connection runs one at a time, and
    /// forgotten after a commit that failed.
    let knownOutputMarks = Mutex<KnownOutputMarks?>(nil)

    /// A second connection that only moves the write-ahead log into the database file, so that a commit of
    /// the batch loop never does (`checkpoint()`); opened on first use.
    private let checkpointer = Mutex<DatabaseQueue?>(nil)

    /// Opens (creating if needed) the state in `directory`.
    /// - Parameter checkpointsInBackground: the caller runs `checkpoint()` every second or so (the service):
    ///   commits then leave the write-ahead log alone unless it grows past `fallbackCheckpointPages`.
    public init(directory: String, checkpointsInBackground: Bool = false) throws(StateError) {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else {
                throw StateError("state directory \(directory) is not a directory")
            }
        } else {
            do {
                // The state holds every owner's registrations and push tokens: owner-only access.
                try FileManager.default.createDirectory(
                    atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            } catch {
                throw StateError("cannot create state directory \(directory): \(error.localizedDescription)")
            }
        }
        guard FileManager.default.isWritableFile(atPath: directory) else {
            throw StateError("state directory \(directory) is not writable")
        }
        path = (directory as NSString).appendingPathComponent(Self.fileName)

        try Self.restrictDatabaseFiles(path)

        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        // WAL + NORMAL: a commit survives a process crash (SIGKILL); only a power loss can drop the
        // last transactions, which recovery then redoes from Kafka.
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // The writer alone: a first start inserts a million registrations into B-trees far larger than
            // the default 2 MB page cache, and each miss is a read. Readers keep the default: a batch reads
            // little, and each reader connection would hold its own cache.
            if !db.configuration.readonly {
                try db.execute(sql: "PRAGMA cache_size = -\(Self.writerCacheKiB)")
                // A statement that enters many dedupe keys keeps the pages it changes in a statement journal, to
                // undo itself alone should it fail: in memory, that journal costs a copy; on disk (SQLite's default
                // past 64 KiB), a write per page, which doubled the state's CPU per job.
                try db.execute(sql: "PRAGMA temp_store = MEMORY")
                // A commit that checkpoints writes back and syncs every page the log holds: tens of
                // milliseconds on the batch loop's critical path. Left to `checkpoint()`, with SQLite's own as
                // a fallback should that stall.
                if checkpointsInBackground { try db.execute(sql: "PRAGMA wal_autocheckpoint = \(Self.fallbackCheckpointPages)") }
            }
        }
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
            // A state a newer mailpush migrated (a rollback after an upgrade) may mean something this version does
            // not know, and what this version wrote there the newer one would trust on its return: refused.
            let unknown = try pool.read { db in
                try Self.migrator.appliedIdentifiers(db).subtracting(Self.migrator.migrations).sorted()
            }
            guard unknown.isEmpty else {
                throw StateError(
                    "state database \(path) was migrated by a newer mailpush (\(unknown.joined(separator: ", ")) unknown to this version); run that version, restore the backup taken before the upgrade, or move the state directory away to rebuild it from the topics"
                )
            }
            try Self.migrator.migrate(pool)
            // Only the tables the exactly-once argument rests on, which stay small: a whole-file check reads
            // every registration (seconds with a million devices, on every start). A damaged page elsewhere
            // fails the read that meets it with a state error naming the file.
            let check = try pool.read { db in
                for table in Self.checkedAtOpen {
                    let answer = try String.fetchOne(db, sql: "PRAGMA quick_check(\(table))")
                    if answer != "ok" { return answer }
                }
                return "ok"
            }
            guard check == "ok" else {
                throw StateError(
                    "state database \(path) is corrupt (quick_check: \(check ?? "no answer")); restore it from a backup or move it away to rebuild from the topics"
                )
            }
        } catch let error as StateError {
            throw error
        } catch {
            // A full volume fails an open in many ways (SQLite's index of the log cannot grow: "disk I/O error"),
            // and advice to restore a backup would have an operator replace a database that is whole.
            if Self.hasNoRoom(directory) {
                throw StateError(
                    "state database \(path): disk is full (opening it failed: \(error)); free space on its volume or grow the volume, the database itself needs no restoring"
                )
            }
            throw StateError(
                "cannot open state database \(path): \(error); restore it from a backup or move it away to rebuild from the topics")
        }
    }

    /// Whether `directory`'s volume refuses 64 KiB more (ENOSPC, or EDQUOT for a quota): asked by writing them, the
    /// one answer that holds for every file system and quota.
    static func hasNoRoom(_ directory: String) -> Bool {
        let probe = (directory as NSString).appendingPathComponent(".mailpush-space-probe-\(getpid())")
        let fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { return errno == ENOSPC || errno == EDQUOT }
        defer {
            close(fd)
            unlink(probe)
        }
        let chunk = [UInt8](repeating: 0, count: 64 << 10)
        let written = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        return written < 0 ? errno == ENOSPC || errno == EDQUOT : written < chunk.count
    }

    /// The database files hold push tokens: 0600. SQLite creates the `-wal` and `-shm` files with
    /// the main file's mode, so creating that one 0600 before SQLite does covers all three;
    /// files left by an older version are tightened too.
    private static func restrictDatabaseFiles(_ path: String) throws(StateError) {
        if !FileManager.default.fileExists(atPath: path) {
            let fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0o600)
            if fd < 0, errno != EEXIST {
                throw StateError("cannot create state database \(path): \(String(cString: strerror(errno)))")
            }
            if fd >= 0 { close(fd) }
        }
        for file in [path, path + "-wal", path + "-shm"] where FileManager.default.fileExists(atPath: file) {
            if chmod(file, 0o600) != 0 {
                throw StateError("cannot restrict \(file) to mode 0600: \(String(cString: strerror(errno)))")
            }
        }
    }

    static let checkedAtOpen = ["input_offset", "output_mark"]
    /// 40 MB of log (SQLite's default is 1,000 pages).
    static let fallbackCheckpointPages = 10_000

    /// Copies what the write-ahead log holds into the database file (a passive checkpoint, on a connection of
    /// its own): commits keep going meanwhile, and the log restarts from its beginning once all is copied.
    /// Returns the log's size in pages, or -1 when this round did nothing: another connection was checkpointing,
    /// or the calling task was cancelled (the service stopping), neither of which is a failure.
    @discardableResult
    public func checkpoint() async throws(StateError) -> Int {
        do {
            let queue = try checkpointer.withLock { queue in
                if let queue { return queue }
                var configuration = Configuration()
                configuration.label = "checkpointer"
                let opened = try DatabaseQueue(path: path, configuration: configuration)
                queue = opened
                return opened
            }
            return try await queue.writeWithoutTransaction { db in try db.checkpoint(.passive).walFrameCount }
        } catch let error as DatabaseError where error.resultCode == .SQLITE_BUSY {
            // Another connection holds the checkpoint lock (SQLite's own fallback checkpoint in a commit, or a
            // `mailpush replay` beside the service): it is doing this work, and the next round goes on from there.
            return -1
        } catch is CancellationError {
            return -1
        } catch let error as DatabaseError where error.resultCode == .SQLITE_INTERRUPT {
            // The task was cancelled while the checkpoint ran (a shutdown): the copy stops, and the log stays whole.
            return -1
        } catch {
            throw StateError("checkpointing \(path): \(error)")
        }
    }
    static let writerCacheKiB = 64 * 1024

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
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
        migrator.registerMigration("v2-dedupe-horizon") { db in
            // One row: how far dedupe expiry has gone (see advanceDedupeHorizon).
            try db.execute(
                sql: """
                    CREATE TABLE dedupe_horizon (
                        id INTEGER PRIMARY KEY CHECK (id = 1), horizon_ms INTEGER NOT NULL);
                    """)
        }
        Self.registerReplayMigration(&migrator)
        Self.registerFleetMigration(&migrator)
        Self.registerClusterMigration(&migrator)
        migrator.registerMigration("v9-dedupe-key-order-expiry") { db in
            // Expiry sweeps the window in key order now (expireProcessedEmails(from:including:below:…)): an
            // index by age would turn each of its deletes into a write of a random page of the index instead.
            try db.execute(sql: "DROP INDEX IF EXISTS processed_email_age")
        }
        return migrator
    }

    /// Runs `body`, its error as a `StateError` naming the database and `what` failed.
    func wrap<T>(_ what: String, _ body: () throws -> T) throws(StateError) -> T {
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
                for key in offsets.keys {
                    previous[key] = try Int64.fetchOne(
                        db, sql: "SELECT next_offset FROM input_offset WHERE topic = ? AND partition = ?",
                        arguments: [key.topic, key.partition])
                }
                try Self.storeOffsets(db, offsets)
                return previous
            }
        }
    }

    private static func storeOffsets(_ db: Database, _ offsets: [TopicPartition: Int64]) throws {
        try upsert(db, storeOffsetsSQL, offsets)
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

    /// What `devices(owners:ownerBytes:totalBytes:)` read: whole owners, and the owners it left unread.
    public struct DevicesOfOwners: Sendable {
        /// Owner by owner, in deviceId byte order within an owner.
        public var rows: [(deviceId: String, owner: String, registration: [UInt8])] = []
        /// The registration bytes of each owner in `rows`.
        public var bytesByOwner: [String: Int] = [:]
        /// Owners with more than `ownerBytes`, or beyond `totalBytes`: read them page by page (`forEachDevicePage`).
        public var unread: [String] = []
        /// Those of `unread` with more than `ownerBytes`.
        public var tooLarge: [String] = []
    }

    /// The stored registrations of the devices of `owners`, in one read, owner by owner: an owner whose
    /// registrations come to more than `ownerBytes`, and every owner once those read come to `totalBytes`, is left
    /// unread. What one call holds is bounded however many devices one owner has (about `totalBytes` +
    /// `ownerBytes` + one registration).
    public func devices(owners: [String], ownerBytes: Int, totalBytes: Int) throws(StateError) -> DevicesOfOwners {
        /// Why a read stopped early: one owner is too large, or the read holds enough.
        enum Stop { case owner, all }
        var result = DevicesOfOwners()
        try wrap("reading devices by owner") {
            try pool.read { db in
                var total = 0
                for start in stride(from: 0, to: owners.count, by: Self.lookupChunk) {
                    var remaining = Array(owners[start..<min(start + Self.lookupChunk, owners.count)])
                    while !remaining.isEmpty {
                        if total >= totalBytes {
                            result.unread += remaining
                            break
                        }
                        let statement = try db.makeStatement(
                            sql: """
                                SELECT device_id, owner, registration FROM device WHERE owner IN (\(Self.placeholders(remaining.count)))
                                ORDER BY owner, device_id
                                """)
                        let rows = try Row.fetchCursor(statement, arguments: StatementArguments(remaining))
                        var seen = Set<String>()
                        var current: (owner: String, firstRow: Int, bytes: Int)?
                        var stop: Stop?
                        func finish() {
                            guard let done = current else { return }
                            result.bytesByOwner[done.owner] = done.bytes
                            total += done.bytes
                        }
                        while let row = try rows.next() {
                            let owner: String = row[1]
                            let registration = [UInt8](row[2] as Data)
                            if current?.owner != owner {
                                finish()
                                current = (owner, result.rows.count, 0)
                                seen.insert(owner)
                            }
                            current!.bytes += registration.count
                            result.rows.append((row[0], owner, registration))
                            if current!.bytes > ownerBytes || total + current!.bytes > totalBytes {
                                result.rows.removeSubrange(current!.firstRow...)
                                result.unread.append(owner)
                                stop = current!.bytes > ownerBytes ? .owner : .all
                                if stop == .owner { result.tooLarge.append(owner) }
                                current = nil
                                break
                            }
                        }
                        finish()
                        // Owners without a device are never named by a row: they are done too.
                        remaining = stop == nil ? [] : remaining.filter { !seen.contains($0) }
                        if stop == .all {
                            result.unread += remaining
                            remaining = []
                            total = totalBytes
                        }
                    }
                }
            }
        }
        return result
    }

    /// The stored registrations of `owner`'s devices in deviceId byte order, handed to `body` in pages of about
    /// `pageBytes` (at least one registration each), all from one snapshot of the state.
    public func forEachDevicePage(
        owner: String, pageBytes: Int, _ body: ([(deviceId: String, registration: [UInt8])]) -> Void
    ) throws(StateError) {
        try wrap("reading the devices of one owner") {
            try pool.read { db in
                let rows = try Row.fetchCursor(
                    db, sql: "SELECT device_id, registration FROM device WHERE owner = ? ORDER BY device_id", arguments: [owner])
                var page: [(deviceId: String, registration: [UInt8])] = []
                var bytes = 0
                while let row = try rows.next() {
                    let registration = [UInt8](row[1] as Data)
                    page.append((row[0], registration))
                    bytes += registration.count
                    if bytes >= pageBytes {
                        body(page)
                        page.removeAll(keepingCapacity: true)
                        bytes = 0
                    }
                }
                if !page.isEmpty { body(page) }
            }
        }
    }

    /// The stored key records of `addresses` (those that have one), in one read.
    public func addressKeys(addresses: some Collection<String>) throws(StateError) -> [(emailAddressId: String, record: [UInt8])] {
        try inChunks(Array(addresses), what: "reading address keys by address") { db, chunk in
            let statement = try db.makeStatement(
                sql: "SELECT email_address_id, record FROM address_key WHERE email_address_id IN (\(Self.placeholders(chunk.count)))")
            return try Row.fetchAll(statement, arguments: StatementArguments(chunk)).map { row in
                (row[0], [UInt8](row[1] as Data))
            }
        }
    }

    /// How many devices and address keys are stored (the owner index is the smallest thing to count).
    public func configCounts() throws(StateError) -> (devices: Int, addressKeys: Int) {
        try wrap("counting config") {
            try pool.read { db in
                (
                    try Int.fetchOne(db, sql: "SELECT count(*) FROM device") ?? 0,
                    try Int.fetchOne(db, sql: "SELECT count(*) FROM address_key") ?? 0
                )
            }
        }
    }

    /// SQLite limits the parameters of a statement; lookups bigger than this are split, in one read.
    static let lookupChunk = 500

    private static func placeholders(_ count: Int) -> String {
        String(repeating: "?,", count: count - 1) + "?"
    }

    private func inChunks<T>(
        _ values: [String], what: String, _ body: (Database, ArraySlice<String>) throws -> [T]
    ) throws(StateError) -> [T] {
        guard !values.isEmpty else { return [] }
        return try wrap(what) {
            try pool.read { db in
                var result: [T] = []
                for start in stride(from: 0, to: values.count, by: Self.lookupChunk) {
                    result += try body(db, values[start..<min(start + Self.lookupChunk, values.count)])
                }
                return result
            }
        }
    }

    /// Applies config changes and advances the config partitions' offsets in one transaction.
    public func applyConfig(_ changes: [ConfigChange], offsets: [TopicPartition: Int64]) throws(StateError) {
        // In key order, a key's own changes in their order (a stable sort): a first start's chunk of registrations
        // then lands on neighbouring B-tree pages instead of random ones. A million registrations caught up about
        // 1 s faster, into a state file 4% smaller. Sorted before the transaction, which holds the writer that
        // batch commits and dedupe lookups wait for.
        let inKeyOrder = changes.indices.sorted { a, b in
            changes[a].id == changes[b].id ? a < b : changes[a].id.precedesInByteOrder(changes[b].id)
        }
        try wrap("applying config") {
            try pool.write { db in
                // Prepared once per transaction: a first start applies a million of these.
                let upsertDevice = try db.cachedStatement(
                    sql:
                        "INSERT INTO device (device_id, owner, registration) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET owner = excluded.owner, registration = excluded.registration"
                )
                let deleteDevice = try db.cachedStatement(sql: "DELETE FROM device WHERE device_id = ?")
                let upsertKey = try db.cachedStatement(
                    sql:
                        "INSERT INTO address_key (email_address_id, owner, record) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET owner = excluded.owner, record = excluded.record"
                )
                let deleteKey = try db.cachedStatement(sql: "DELETE FROM address_key WHERE email_address_id = ?")
                for change in inKeyOrder.lazy.map({ changes[$0] }) {
                    switch (change.table, change.value) {
                    case (.devices, let value?):
                        try upsertDevice.execute(arguments: [change.id, change.owner ?? "", Data(value)])
                    case (.devices, nil):
                        try deleteDevice.execute(arguments: [change.id])
                    case (.addressKeys, let value?):
                        try upsertKey.execute(arguments: [change.id, change.owner, Data(value)])
                    case (.addressKeys, nil):
                        try deleteKey.execute(arguments: [change.id])
                    }
                }
                try Self.storeOffsets(db, offsets)
            }
        }
    }

    // MARK: Events

    /// The subset of `emailKeys` processed at or after `sinceMs`.
    public func processedEmails(among emailKeys: some Collection<String>, sinceMs: Int64) throws(StateError) -> Set<String> {
        guard !emailKeys.isEmpty else { return [] }
        return try wrap("reading the dedupe window") {
            try pool.read { db in try Self.processedEmails(db, among: emailKeys, sinceMs: sinceMs) }
        }
    }

    /// The subset of `emailKeys` inside the dedupe window at `nowMs`: processed at or after
    /// `nowMs - windowMs`, or after the expiry horizon if that is earlier (a forward wall-clock jump must not
    /// end the window of entries not yet expired). Once per batch.
    ///
    /// On the writer's connection, outside any transaction: a reader connection's page cache is dropped whenever
    /// a commit has come since its last read (SQLite's WAL mode), so every batch's lookup read its B-tree path
    /// again, while the writer's cache survives its own commits. Writes wait their turn on that connection, so
    /// none comes between the window's start and the lookup.
    public func processedEmails(among emailKeys: some Collection<String>, nowMs: Int64, windowMs: Int64) throws(StateError) -> Set<String> {
        guard !emailKeys.isEmpty else { return [] }
        return try wrap("reading the dedupe window") {
            try pool.writeWithoutTransaction { db in
                let windowStart = min(nowMs - windowMs, try Self.dedupeHorizonMs(db) ?? .max)
                return try Self.processedEmails(db, among: emailKeys, sinceMs: windowStart)
            }
        }
    }

    private static func processedEmails(_ db: Database, among emailKeys: some Collection<String>, sinceMs: Int64) throws -> Set<String> {
        var found = Set<String>()
        try inStatementSizedPieces(Array(emailKeys)) { keys, size in
            let statement = try db.cachedStatement(sql: lookupSQL[size])
            var arguments: [any DatabaseValueConvertible] = [sinceMs]
            arguments.reserveCapacity(keys.count + 1)
            for key in keys { arguments.append(key) }
            let cursor = try String.fetchCursor(statement, arguments: StatementArguments(arguments))
            while let key = try cursor.next() { found.insert(key) }
        }
        return found
    }

    // A batch's dedupe lookup and its inserts take a few statements, each naming many keys, rather than one per
    // email: running a statement through GRDB (binding, stepping, resetting) cost more than SQLite's own
    // B-tree work, about a third of the state's CPU per job. Statements name 2^k keys (?1 is the time), so
    // that every piece's statement is prepared once and comes from the statement cache after that.
    static let largestPieceLog2 = 8

    /// `body(piece, k)` over `values` cut into pieces of 2^k elements, largest first.
    static func inStatementSizedPieces<T>(_ values: [T], _ body: (ArraySlice<T>, Int) throws -> Void) rethrows {
        var start = 0
        var log2 = largestPieceLog2
        while start < values.count {
            while values.count - start < 1 << log2 { log2 -= 1 }
            try body(values[start..<start + (1 << log2)], log2)
            start += 1 << log2
        }
    }

    /// `?2, ?3, …` for `count` keys: ?1 is the statement's one other argument.
    private static func keyPlaceholders(_ count: Int, _ each: (String) -> String) -> String {
        (0..<count).map { each("?\($0 + 2)") }.joined(separator: ", ")
    }

    /// Index k: the lookup of 2^k keys (the key order need not match: the result is a set).
    private static let lookupSQL: [String] = (0...largestPieceLog2).map { log2 in
        "SELECT email_key FROM processed_email WHERE email_key IN (\(keyPlaceholders(1 << log2) { $0 })) AND processed_at_ms >= ?1"
    }

    /// Index k: entering 2^k keys at time ?1, leaving the keys already there as they are (`retimeSQL` follows).
    ///
    /// Not an upsert (`ON CONFLICT DO UPDATE`): a statement that writes many rows and may abort halfway (the upsert's
    /// NOT NULL check may) keeps a copy of every page it changes in a statement journal, to undo itself alone. In a
    /// full dedupe window every key lands on a page of its own, so that was a 4 KiB copy per event: with 1,000,000
    /// entries the state's CPU per job was 5.68 µs with the upsert and 4.87 without (MailpushBench
    /// --dedupe-entries, docs/performance.md, session 28). `OR IGNORE` cannot abort, so it keeps none.
    private static let insertSQL: [String] = (0...largestPieceLog2).map { log2 in
        "INSERT OR IGNORE INTO processed_email (email_key, processed_at_ms) VALUES \(keyPlaceholders(1 << log2) { "(\($0), ?1)" })"
    }

    /// Index k: an email processed again gets the newer time, ?1, for 2^k keys; only run when `insertSQL` left some.
    private static let retimeSQL: [String] = (0...largestPieceLog2).map { log2 in
        "UPDATE OR IGNORE processed_email SET processed_at_ms = ?1 WHERE email_key IN (\(keyPlaceholders(1 << log2) { $0 }))"
    }

    /// Commits one processed batch of events: the emails it processed, the offsets it reached and the
    /// new output scan marks, atomically; in a fleet also the batch's state records, made by `stateRecords` from
    /// the output marks after the commit (`namedOutputMarks`), stored as one batch that stays until
    /// `stateBatchesResolved` (its id is returned; nil without records).
    @discardableResult
    public func commitEventBatch(
        offsets: [TopicPartition: Int64], processedEmails: some Collection<String>, processedAtMs: Int64,
        outputMarks: [TopicPartition: Int64],
        stateRecords: ((_ marks: [NamedOutputMark]) -> UnwrittenStateRecord.Batch)? = nil
    ) throws(StateError) -> Int64? {
        try wrap("committing a batch") {
            do {
                return try pool.write { db in
                    try Self.recordProcessedEmails(db, processedEmails, at: processedAtMs)
                    try Self.storeOffsets(db, offsets)
                    try Self.storeOutputMarks(db, outputMarks)
                    guard let stateRecords else {
                        if !outputMarks.isEmpty { knownOutputMarks.withLock { $0 = nil } }
                        return nil
                    }
                    return try Self.storeUnwrittenStateBatch(db, stateRecords(try marksAfterWriting(outputMarks, db)))
                }
            } catch {
                // Rolled back: the marks the transaction kept are not the table's.
                knownOutputMarks.withLock { $0 = nil }
                throw error
            }
        }
    }

    /// The output marks after this transaction wrote `written` (`namedOutputMarks`): the ones the last commit knew
    /// with `written` applied, if the table's count and checksum of marks agree with them, else read. A group member's
    /// every commit needs them for its state records; reading, naming and sorting them there took about 100 µs of
    /// a 1 ms commit under a light load (docs/performance.md, session 54). The writes that change marks otherwise
    /// (`setOutputMarks`, a replay's commit, restored partitions) forget them; the count and checksum catch one
    /// that did not.
    private func marksAfterWriting(_ written: [TopicPartition: Int64], _ db: Database) throws -> [NamedOutputMark] {
        let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT count(*), coalesce(sum(scan_from & 4294967295), 0) FROM output_mark"))
        let count: Int = row?[0] ?? 0
        let sum: Int64 = row?[1] ?? 0
        // Applied where they are kept: a copy taken out first made every commit copy all the marks (a retain and a
        // release per name) to change the few this batch wrote.
        let applied = knownOutputMarks.withLock { known -> [NamedOutputMark]? in
            known?.apply(written)
            guard let marks = known, marks.marks.count == count, marks.sum == sum else {
                known = nil
                return nil
            }
            return marks.marks
        }
        if let applied { return applied }
        let read = KnownOutputMarks(try Self.namedOutputMarks(db))
        knownOutputMarks.withLock { $0 = read }
        return read.marks
    }

    /// Where the dedupe window starts as far as expiry has gone: entries processed before it are
    /// expired (or about to be). `nil` before the first expiry run.
    public func dedupeHorizonMs() throws(StateError) -> Int64? {
        try wrap("reading the dedupe horizon") { try pool.read { db in try Self.dedupeHorizonMs(db) } }
    }

    private static func dedupeHorizonMs(_ db: Database) throws -> Int64? {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT horizon_ms FROM dedupe_horizon WHERE id = 1"))
    }

    /// Moves the dedupe horizon toward `targetMs` (wall-clock now minus the window), but forward by
    /// at most `maxAdvanceMs`, and returns the new horizon, below which entries may be expired.
    ///
    /// Why a cap: wall-clock time can jump. Expiring at `now - window` would, after a forward jump
    /// larger than the window, drop the whole window at once, and every email re-read afterwards
    /// would be sent again. With the cap the horizon moves at about real-time speed (the caller
    /// passes a little more than the time between two runs), so a jump only delays expiry: entries
    /// live somewhat longer than the window, never shorter. Backward moves are taken at once
    /// (they only keep entries longer). Without a stored horizon (a new or older state), it starts
    /// from the newest entry minus the window, which the clock cannot have moved.
    public func advanceDedupeHorizon(towardMs targetMs: Int64, windowMs: Int64, maxAdvanceMs: Int64) throws(StateError) -> Int64 {
        try wrap("advancing the dedupe horizon") {
            try pool.write { db in
                // The newest entry is a scan of the whole window (no index by age): read only when no horizon is stored.
                let stored = try Self.dedupeHorizonMs(db)
                let previous =
                    try stored ?? Int64.fetchOne(db, sql: "SELECT max(processed_at_ms) FROM processed_email").map { $0 - windowMs }
                    ?? targetMs
                let (capped, overflow) = previous.addingReportingOverflow(maxAdvanceMs)
                let horizon = min(targetMs, overflow ? .max : capped)
                try db.execute(
                    sql:
                        "INSERT INTO dedupe_horizon (id, horizon_ms) VALUES (1, ?) ON CONFLICT DO UPDATE SET horizon_ms = excluded.horizon_ms",
                    arguments: [horizon])
                return horizon
            }
        }
    }

    /// Deletes the expired dedupe entries (processed before `beforeMs`) among the next `scanning` entries in key
    /// order from `startKey` (itself included or not) up to `belowKey` (nil: no bound). Returns the last key looked
    /// at, where the next piece goes on (nil once the range is done), how many it looked at, and how many went.
    ///
    /// Why in key order: the keys are hashes, so the entries that expire together lie on random pages of the table.
    /// Deleted by age, each took a page write of its own; swept in key order, a page is written once a pass for all of
    /// its entries expired by then. `beforeMs` should come from `advanceDedupeHorizon`, which a wall-clock jump cannot
    /// move far.
    public func expireProcessedEmails(
        from startKey: String, including: Bool, below belowKey: String?, beforeMs: Int64, scanning: Int
    ) throws(StateError) -> (lastKey: String?, scanned: Int, expired: Int) {
        try wrap("expiring the dedupe window") {
            try pool.write { db in
                let start = including ? ">=" : ">"
                let bound = belowKey == nil ? "" : " AND email_key < ?3"
                var arguments: StatementArguments = [startKey, scanning]
                if let belowKey { arguments += [belowKey] }
                let row = try Row.fetchOne(
                    db.cachedStatement(
                        sql: """
                            SELECT max(email_key), count(*) FROM (
                                SELECT email_key FROM processed_email WHERE email_key \(start) ?1\(bound) ORDER BY email_key LIMIT ?2)
                            """),
                    arguments: arguments)
                guard let row, let lastKey = row[0] as String? else { return (nil, 0, 0) }
                try db.cachedStatement(
                    sql: "DELETE FROM processed_email WHERE email_key \(start) ?1 AND email_key <= ?2 AND processed_at_ms < ?3"
                ).execute(arguments: [startKey, lastKey, beforeMs])
                return (lastKey, row[1], db.changesCount)
            }
        }
    }

    /// Deletes the expired entries (processed before `beforeMs`) of slice `slice` of `slices` of the dedupe window's
    /// keys (`dedupeSlice`), in pieces of `scanning` keys with `pause` between them; returns how many went and how
    /// many the slice kept (with hashed keys, about the window's entries divided by `slices`).
    @discardableResult
    public func expireProcessedEmails(
        slice: Int, of slices: Int, beforeMs: Int64, scanning: Int = 2_000, pause: Duration = .zero
    ) async throws -> (expired: Int, kept: Int) {
        let range = Self.dedupeSlice(slice, of: slices)
        var next = (key: range.start, including: true)
        var (expired, kept) = (0, 0)
        while true {
            let piece = try expireProcessedEmails(
                from: next.key, including: next.including, below: range.below, beforeMs: beforeMs, scanning: scanning)
            expired += piece.expired
            kept += piece.scanned - piece.expired
            guard let lastKey = piece.lastKey else { return (expired, kept) }
            next = (lastKey, false)
            if pause > .zero { try await Task.sleep(for: pause) }
        }
    }

    /// The keys of slice `slice` of `slices` (at most 4,096), one expiry run's share of a sweep: from the first key
    /// at or after `start` to the last before `below`, split at a key's first four hex digits. The first slice starts
    /// at the empty text and the last has no end, so that every key, a hash or not, lies in exactly one slice.
    public static func dedupeSlice(_ slice: Int, of slices: Int) -> (start: String, below: String?) {
        precondition(slices >= 1 && slices <= 1 << 12 && (0..<slices).contains(slice))
        func prefix(_ index: Int) -> String {
            let value = String(index * (1 << 16) / slices, radix: 16)
            return String(repeating: "0", count: 4 - value.count) + value
        }
        return (slice == 0 ? "" : prefix(slice), slice == slices - 1 ? nil : prefix(slice + 1))
    }

    /// Counts every entry: a scan of the whole table (seconds with hundreds of millions of entries), run on a
    /// reader connection without holding the caller's thread. The service estimates the count from its sweep instead.
    public func processedEmailCount() async throws(StateError) -> Int {
        do {
            return try await pool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM processed_email") ?? 0 }
        } catch {
            throw StateError("state database \(path): counting the dedupe window failed: \(error)")
        }
    }

    // MARK: Output scan marks

    /// Where recovery starts reading each output partition: no output of an uncommitted batch lies before these.
    public func outputMarks() throws(StateError) -> [TopicPartition: Int64] {
        try wrap("reading output marks") { try pool.read { db in try Self.outputMarks(db) } }
    }

    static func outputMarks(_ db: Database) throws -> [TopicPartition: Int64] {
        var result: [TopicPartition: Int64] = [:]
        for row in try Row.fetchAll(db.cachedStatement(sql: "SELECT topic, partition, scan_from FROM output_mark")) {
            result[TopicPartition(topic: row[0], partition: row[1])] = row[2]
        }
        return result
    }

    /// The output marks as a fleet's state records name them (`TopicPartition.name`), in the byte order of the
    /// names: what a record's marks are encoded from, without decoding partitions only to name them again.
    static func namedOutputMarks(_ db: Database) throws -> [NamedOutputMark] {
        var marks: [NamedOutputMark] = []
        let rows = try Row.fetchCursor(
            db.cachedStatement(sql: "SELECT topic || '/' || partition, scan_from FROM output_mark ORDER BY 1"))
        while let row = try rows.next() { marks.append(NamedOutputMark(name: row[0], offset: row[1])) }
        return marks
    }

    public func setOutputMarks(_ marks: [TopicPartition: Int64]) throws(StateError) {
        try wrap("storing output marks") {
            try pool.write { db in
                knownOutputMarks.withLock { $0 = nil }
                try Self.storeOutputMarks(db, marks)
            }
        }
    }

    /// Enters emails in the dedupe window (an email processed again gets the newer time).
    static func recordProcessedEmails(_ db: Database, _ keys: some Collection<String>, at processedAtMs: Int64) throws {
        try inStatementSizedPieces(Array(keys)) { keys, size in
            var arguments: [any DatabaseValueConvertible] = [processedAtMs]
            arguments.reserveCapacity(keys.count + 1)
            for key in keys { arguments.append(key) }
            let statementArguments = StatementArguments(arguments)
            try db.cachedStatement(sql: insertSQL[size]).execute(arguments: statementArguments)
            if db.changesCount < keys.count {
                try db.cachedStatement(sql: retimeSQL[size]).execute(arguments: statementArguments)
            }
        }
    }

    static func storeOutputMarks(_ db: Database, _ marks: [TopicPartition: Int64]) throws {
        try upsert(db, storeOutputMarksSQL, marks)
    }

    /// Index k: the upsert of 2^k partitions' values into a table keyed by (topic, partition). Cached statements:
    /// every batch commit runs these, and parsing them each time was ~5% of the service's CPU at a few thousand
    /// events/s (small batches).
    private static func upsertSQL(table: String, column: String) -> [String] {
        (0...largestPieceLog2).map { log2 in
            "INSERT INTO \(table) (topic, partition, \(column)) VALUES "
                + repeatElement("(?, ?, ?)", count: 1 << log2).joined(separator: ", ")
                + " ON CONFLICT DO UPDATE SET \(column) = excluded.\(column)"
        }
    }

    private static let storeOffsetsSQL = upsertSQL(table: "input_offset", column: "next_offset")
    private static let storeOutputMarksSQL = upsertSQL(table: "output_mark", column: "scan_from")

    /// A batch commit stores a value for each of up to a few hundred partitions: one statement per piece, not per
    /// partition. At 64 event and 65 output partitions that took 150–160 µs of a steady-load commit against 185 with
    /// a statement each (docs/performance.md, session 44): SQLite's own work per row is most of it.
    private static func upsert(_ db: Database, _ sql: [String], _ values: [TopicPartition: Int64]) throws {
        try inStatementSizedPieces(Array(values)) { piece, size in
            var arguments: [any DatabaseValueConvertible] = []
            arguments.reserveCapacity(piece.count * 3)
            for (key, value) in piece {
                arguments.append(key.topic)
                arguments.append(key.partition)
                arguments.append(value)
            }
            try db.cachedStatement(sql: sql[size]).execute(arguments: StatementArguments(arguments))
        }
    }
}
