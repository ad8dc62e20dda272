import Foundation
import GRDB

/// Which Kafka cluster a state directory's positions (event and config offsets, output marks, partition owners)
/// are positions in, as `mailpush run` last recorded it.
public enum StateCluster: String, Sendable {
    /// The development broker `mailpush run` embeds without `--brokers`: a new, empty cluster every run.
    case embedded
    /// A cluster named by `--brokers` (or `MAILPUSH_BROKERS`).
    case external
}

extension StateStore {
    static func registerClusterMigration(_ migrator: inout DatabaseMigrator) {
        migrator.registerMigration("v8-kafka-cluster") { db in
            try db.execute(sql: "CREATE TABLE kafka_cluster (id INTEGER PRIMARY KEY CHECK (id = 1), kind TEXT NOT NULL)")
        }
    }

    /// The cluster recorded by the last `recordCluster`; nil for a new state directory or one of an earlier version.
    public func recordedCluster() throws(StateError) -> StateCluster? {
        try wrap("reading the state's Kafka cluster") {
            try pool.read { db in
                try String.fetchOne(db, sql: "SELECT kind FROM kafka_cluster WHERE id = 1").flatMap(StateCluster.init(rawValue:))
            }
        }
    }

    public func recordCluster(_ cluster: StateCluster) throws(StateError) {
        try wrap("recording the state's Kafka cluster") {
            try pool.write { db in
                try db.execute(
                    sql: "INSERT INTO kafka_cluster (id, kind) VALUES (1, ?) ON CONFLICT DO UPDATE SET kind = excluded.kind",
                    arguments: [cluster.rawValue])
            }
        }
    }

    /// Empties every table, as a new state directory: for a state whose cluster is gone (an earlier run's embedded
    /// development broker), whose offsets, config, dedupe window and fleet state describe a log that no longer exists.
    public func discardEverything() throws(StateError) {
        try wrap("discarding the state") {
            try pool.write { db in
                let tables = try String.fetchAll(
                    db,
                    sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'grdb_%'")
                for table in tables { try db.execute(sql: "DELETE FROM \(table.quotedDatabaseIdentifier)") }
            }
        }
    }
}
