import Foundation
import GRDB
import MailpushPartition
import MailpushTestSupport
import Testing

@testable import MailpushState

/// A state directory written by an earlier mailpush opens with today's schema, keeping what it held.
struct MigrationTests {
    /// `Fixtures/state-v4-fleet.sqlite`: the state file of a fleet member of the release before state-record
    /// deletion (schema migrations up to `v4-fleet`), after 20 events over 4 partitions and a SIGTERM.
    static func oldStateDirectory() throws -> String {
        let fixture = try #require(Bundle.module.url(forResource: "state-v4-fleet", withExtension: "sqlite", subdirectory: "Fixtures"))
        let directory = URL(fileURLWithPath: try TestDirectories.make("mailpush-migration"))
        try FileManager.default.copyItem(at: fixture, to: directory.appendingPathComponent("mailpush.sqlite"))
        return directory.path
    }

    @Test func aFleetMembersStateFromBeforeStateRecordDeletionMigratesAndKeepsItsRecords() async throws {
        let directory = try Self.oldStateDirectory()
        let store = try StateStore(directory: directory)

        let events = (0..<4).map { TopicPartition(topic: "email.received", partition: Int32($0)) }
        let offsets = try store.offsets()
        #expect(events.reduce(0) { $0 + (offsets[$1] ?? 0) } == 20, "every event offset kept")
        let owners = try store.partitionOwners()
        #expect(Set(owners.keys) == Set(events), "every partition it owned is still known")
        #expect(owners.values.allSatisfy { $0.marks?[TopicPartition(topic: "mailpush.push-jobs", partition: 1)] == 20 })
        #expect(try await store.processedEmailCount() == 20, "the dedupe window kept")

        // The records the old version remembered for deletion (keys of its own format, no checkpoint offset) are
        // deleted once expired, with no checkpoint to wait for: they predate checkpoints.
        let partition3 = TopicPartition(topic: "email.received", partition: 3)
        let deletable = try store.deletableStateRecords(checkpoints: [partition3: -1], beforeMs: .max, progress: false, limit: 10)
        #expect(Set(deletable.map(\.key)) == ["email.received/3/batch/1", "email.received/3/batch/20"])
        #expect(try store.deletableStateRecords(checkpoints: [partition3: -1], beforeMs: 0, progress: false, limit: 10).isEmpty)
        try store.forgetDeletableStateRecords(deletable)
        #expect(try store.deletableStateRecords(checkpoints: [partition3: -1], beforeMs: .max, progress: false, limit: 10).isEmpty)

        // It keeps a committed batch's state records until they are written, as a new state directory does.
        #expect(try store.unwrittenStateRecords(except: []).isEmpty)
        let batch = try store.commitEventBatch(
            offsets: [partition3: 6], processedEmails: ["after-upgrade"], processedAtMs: 1, outputMarks: [:],
            stateRecords: { marks in
                #expect(marks.contains { $0.name == "mailpush.push-jobs/1" }, "the commit's marks")
                return UnwrittenStateRecord.Batch(marks: Array("marks".utf8), records: [(partition3, Array("record".utf8))])
            })
        #expect(batch != nil)
        #expect(try store.splitUnwrittenBatches() == 1, "a batch left by a crash")
        #expect(try store.unwrittenStateRecords(except: []).map { [$0.value, $0.marks] } == [[Array("record".utf8), Array("marks".utf8)]])
        #expect(try store.unwrittenStateRecords(except: [partition3]).isEmpty)
        try store.stateRecordsWritten(try store.unwrittenStateRecords(except: []).map(\.id), deletable: [])
        #expect(try store.unwrittenStateRecords(except: []).isEmpty)

        // Its dedupe window loses the index by age (expiry sweeps the keys in order) and expires as a new one does.
        let indexes = try await store.pool.read { db in
            try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'processed_email'")
        }
        #expect(indexes.isEmpty, "no index by age: \(indexes)")
        #expect(
            try await store.expireProcessedEmails(slice: 0, of: 1, beforeMs: .max).expired == 21, "the 20 old entries and the one above")
        #expect(try await store.processedEmailCount() == 0)
    }

    /// `Fixtures/state-v6-unwritten.sqlite`: the state file of a fleet member of the release that kept a batch's
    /// state records as rows of their own (schema migrations up to `v6-unwritten-state-records`), killed (SIGKILL)
    /// under a steady load of 1,000 events/s over 4 partitions while 108 of its records waited for their write.
    @Test func recordsAnEarlierVersionLeftUnwrittenAreStillWritten() throws {
        let fixture = try #require(
            Bundle.module.url(forResource: "state-v6-unwritten", withExtension: "sqlite", subdirectory: "Fixtures"))
        let directory = URL(fileURLWithPath: try TestDirectories.make("mailpush-migration"))
        try FileManager.default.copyItem(at: fixture, to: directory.appendingPathComponent("mailpush.sqlite"))
        let store = try StateStore(directory: directory.path)

        #expect(try store.splitUnwrittenBatches() == 0)
        let unwritten = try store.unwrittenStateRecords(except: [])
        #expect(unwritten.count == 108, "the records it left unwritten are kept")
        #expect(Set(unwritten.map(\.partition.partition)) == [0, 1, 2, 3])
        for record in unwritten {
            let value = try #require(try JSONSerialization.jsonObject(with: Data(record.value)) as? [String: Any])
            #expect(value["kind"] as? String == "batch" && value["partition"] as? Int == Int(record.partition.partition))
            #expect(try JSONSerialization.jsonObject(with: Data(record.marks)) is [String: Any], "with their batch's marks")
        }
        try store.stateRecordsWritten(unwritten.map(\.id), deletable: [])
        #expect(try store.unwrittenStateRecords(except: []).isEmpty)
    }
}
