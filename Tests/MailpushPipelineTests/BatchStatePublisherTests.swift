import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState
import MailpushTestSupport
import Synchronization
import Testing

@testable import MailpushPipeline

/// The publisher against a mock cluster: what lands in the state topic is what a restore follows.
struct BatchStatePublisherTests {
    /// Batches are submitted by the batch loop while checkpoints are asked for beside it (the expiry run, the
    /// checkpoint timer): per state partition the batch records still land in batch order, and each checkpoint
    /// holds the state of the batch record before it. (A drain that went on after letting go ran beside the next
    /// one, and a takeover found a chain broken at offset 4,000 of 100,000.)
    /// `marksEncodedByTheCommit`: the records come as the batch loop submits them, their marks only as the commit
    /// encoded them; a checkpoint must still carry the marks of the batch record it follows.
    @Test(arguments: [false, true])
    func batchRecordsAndCheckpointsLandInOrderPerPartition(marksEncodedByTheCommit: Bool) async throws {
        // A lease short enough that checkpoints are due soon (`takeoverWait` after the claim), long enough that the
        // renewals, each a read by a new consumer while records are in flight, keep it on a loaded machine (with
        // 500 ms, reads slower than about a second in a row would drop batch records).
        let owner = try await Owner(interval: .milliseconds(250), store: nil, lease: .seconds(2))
        defer { owner.close() }
        let (kafka, writer, publisher, jobs) = (owner.kafka, owner.writer, owner.publisher, owner.jobs)
        try await Task.sleep(for: writer.leases.takeoverWait)

        let checkpointsAnswered = Counter()
        let checkpoints = Task {
            var acknowledged: [Int32: Int64] = [:]
            while !Task.isCancelled {
                acknowledged = await publisher.checkpoint()
                checkpointsAnswered.increment()
                try? await Task.sleep(for: .milliseconds(3))
            }
            return acknowledged
        }
        var offsets: [Int32: Int64] = [0: 0, 1: 0]
        for batch in Int64(1)...400 {
            var records: [PartitionStateRecord] = []
            let marks = PartitionStateRecord.encodeMarks([jobs: batch * 7])
            for partition in Int32(0)..<2 where (batch + Int64(partition)) % 3 != 0 {
                let from = offsets[partition]!
                offsets[partition] = from + 5
                records.append(
                    PartitionStateRecord(
                        kind: .batch, topic: "events", partition: partition, epoch: 1, owner: "me", from: from, offset: from + 5,
                        marks: marksEncodedByTheCommit ? [:] : marks, processedAtMs: batch,
                        emails: batch % 4 == 0 ? [] : ["m\(batch)"]))
            }
            publisher.submit(records, marksJSON: marksEncodedByTheCommit ? PartitionStateRecord.encodeMarksJSON(marks) : nil)
            if batch % 10 == 0 { try await Task.sleep(for: .milliseconds(1)) }
            // Checkpoints between the batches however slow the writes are (on a loaded machine all 400 could be
            // submitted, and joined, while one write was under way).
            if batch % 80 == 0 {
                let answered = checkpointsAnswered.value
                try await waitFor { checkpointsAnswered.value > answered }
            }
        }
        await publisher.settle()
        checkpoints.cancel()
        let acknowledged = await checkpoints.value
        _ = await publisher.checkpoint()

        let ends = try await KafkaCluster(configuration: kafka).endOffsets(
            [TopicPartition(topic: "state", partition: 0), TopicPartition(topic: "state", partition: 1)], timeout: .seconds(10))
        let written = try await writer.leases.reader.read([
            0: (0, ends[writer.statePartition(0)]!), 1: (0, ends[writer.statePartition(1)]!),
        ])
        .records
        var checkpointsSeen = 0
        for partition in Int32(0)..<2 {
            var at: Int64 = 0
            var marks: [String: Int64] = [:]
            for (_, record) in written[partition] ?? [] {
                switch record.kind {
                case .claim: marks = record.marks
                case .batch:
                    #expect(record.from == at, "partition \(partition): a batch record out of order or missing")
                    #expect(!record.marks.isEmpty, "partition \(partition): a batch record without marks")
                    at = record.offset
                    marks = record.marks
                case .checkpoint:
                    #expect(record.offset == at && record.marks == marks, "partition \(partition): a checkpoint out of order")
                    checkpointsSeen += 1
                default: Issue.record("unexpected \(record.kind)")
                }
            }
            #expect(at == offsets[partition], "partition \(partition): every batch landed")
            #expect(acknowledged[partition].map { $0 <= at } ?? false)
        }
        #expect(checkpointsSeen > 4, "checkpoints were written between batches")
    }

    /// Under a steady stream of batches a partition gets about one record per interval (the batches between are
    /// joined), the chain of records stays complete, the keys remembered for deletion are exactly those of the
    /// records written (not those of batches joined into later records, which never land), and the state directory
    /// keeps none of them as unwritten.
    @Test func aSteadyStreamOfBatchesIsWrittenOncePerIntervalAndEveryKeyWrittenIsRemembered() async throws {
        let directory = TestDirectories.path("mailpush-publisher")
        let store = try StateStore(directory: directory)
        let owner = try await Owner(interval: .milliseconds(200), store: store)
        defer { owner.close() }
        let (writer, publisher, jobs) = (owner.writer, owner.publisher, owner.jobs)

        let started = ContinuousClock.now
        var offset: Int64 = 0
        for batch in Int64(1)...100 {
            let record = PartitionStateRecord.batch(
                topic: "events", partition: 0, epoch: 1, owner: "me", from: offset, offset: offset + 3,
                marks: PartitionStateRecord.encodeMarks([jobs: batch * 3]), processedAtMs: batch, emails: ["m\(batch)"])
            let batch = try store.commitEventBatch(
                offsets: [TopicPartition(topic: "events", partition: 0): offset + 3], processedEmails: ["m\(batch)"],
                processedAtMs: batch, outputMarks: [jobs: batch * 3],
                stateRecords: { _ in PartitionStateRecord.unwritten(PartitionStateRecord.unwrittenValues([record]), marks: record.marks) })
            publisher.submit([record], stored: batch)
            offset += 3
            try await Task.sleep(for: .milliseconds(10))
        }
        let elapsed = ContinuousClock.now - started
        await publisher.settle()

        let end = try await owner.cluster.endOffsets([writer.statePartition(0)], timeout: .seconds(10))[writer.statePartition(0)]!
        let batches = try await writer.leases.reader.read([0: (0, end)]).records[0, default: []].map(\.record).filter { $0.kind == .batch }
        var at: Int64 = 0
        for record in batches {
            #expect(record.from == at, "a batch record out of order or missing")
            at = record.offset
        }
        #expect(at == offset, "every batch landed")
        #expect(Set(batches.flatMap { $0.emails ?? [] }).count == 100, "every dedupe entry landed")
        // The first batch is written at once, then one write per interval at most, joined.
        let allowed = Int(elapsed / .milliseconds(200)) + 2
        #expect(batches.count <= allowed, "\(batches.count) records for \(elapsed): not paced")
        #expect(batches.count >= 2)

        let remembered = try store.deletableStateRecords(
            checkpoints: [TopicPartition(topic: "events", partition: 0): .max], beforeMs: .max, progress: false, limit: 10_000)
        #expect(Set(remembered.map(\.key)) == Set(batches.map(\.key)), "the keys remembered are the keys written")
        #expect(try store.unwrittenStateRecords(except: []).isEmpty, "no written record is kept as unwritten")
    }
}

extension BatchStatePublisherTests {
    /// What must follow the batch records (a release, a claim) does not wait out the pace: `settle` writes what
    /// waits at once.
    @Test func settleWritesWhatWaitsWithoutWaitingOutThePace() async throws {
        let owner = try await Owner(interval: .seconds(30), store: nil)
        defer { owner.close() }
        let (writer, publisher, jobs) = (owner.writer, owner.publisher, owner.jobs)
        for batch in Int64(0)..<2 {
            publisher.submit([
                PartitionStateRecord.batch(
                    topic: "events", partition: 1, epoch: 1, owner: "me", from: batch * 5, offset: batch * 5 + 5,
                    marks: PartitionStateRecord.encodeMarks([jobs: batch]), processedAtMs: batch, emails: [])
            ])
            try await Task.sleep(for: .milliseconds(100))
        }
        let started = ContinuousClock.now
        await publisher.settle()
        #expect(ContinuousClock.now - started < .seconds(15), "settle waited out the pace")
        let end = try await owner.cluster.endOffsets([writer.statePartition(1)], timeout: .seconds(10))[writer.statePartition(1)]!
        let batches = try await writer.leases.reader.read([1: (0, end)]).records[1, default: []].map(\.record).filter { $0.kind == .batch }
        #expect(batches.last?.offset == 10, "the batch submitted during the pause was written by settle")
    }
}

extension BatchStatePublisherTests {
    /// Batches submitted while a write waits out the pace are joined: past `joinedOnSubmit` as they come, the rest by
    /// the next write. Either way a partition's consecutive batch records land as one, holding every dedupe entry once,
    /// in order.
    @Test func batchesSubmittedDuringThePaceAreJoinedWhateverTheirNumber() async throws {
        let owner = try await Owner(interval: .seconds(30), store: nil)
        defer { owner.close() }
        let (writer, publisher, jobs) = (owner.writer, owner.publisher, owner.jobs)
        let count = BatchStatePublisher.joinedOnSubmit + 800
        for batch in Int64(0)..<Int64(count) {
            let marks = PartitionStateRecord.encodeMarks([jobs: batch])
            // As the batch loop submits them: with their marks as its commit encoded them.
            publisher.submit(
                [
                    PartitionStateRecord.batch(
                        topic: "events", partition: 1, epoch: 1, owner: "me", from: batch * 5, offset: batch * 5 + 5,
                        marks: marks, processedAtMs: batch, emails: ["m\(batch)"])
                ], marksJSON: PartitionStateRecord.encodeMarksJSON(marks))
        }
        await publisher.settle()
        let end = try await owner.cluster.endOffsets([writer.statePartition(1)], timeout: .seconds(10))[writer.statePartition(1)]!
        let batches = try await writer.leases.reader.read([1: (0, end)]).records[1, default: []].map(\.record).filter { $0.kind == .batch }
        #expect(batches.count <= 3, "joined while the first write paced the others: \(batches.count) records")
        #expect(batches.flatMap { $0.emails ?? [] } == (0..<count).map { "m\($0)" })
        #expect(batches.first?.from == 0 && batches.last?.offset == Int64(count) * 5)
        #expect(zip(batches, batches.dropFirst()).allSatisfy { $0.offset == $1.from })
        #expect(
            batches.last?.marks == PartitionStateRecord.encodeMarks([jobs: Int64(count) - 1]), "a joined record has its last batch's marks")
    }
}

extension BatchStatePublisherTests {
    /// The partitions take turns: a write holds the records of one slice of them, the next slice's wait for the next
    /// write, an eighth of the interval later, and `settle` writes them at once. (Every partition's records in one
    /// write were a burst of a produce request each, once a second, and the slowest jobs of a light load came with it.)
    @Test func partitionsOfAnotherSliceWaitForTheirTurn() async throws {
        let owner = try await Owner(interval: .seconds(30), store: nil)
        defer { owner.close() }
        let (writer, publisher, jobs) = (owner.writer, owner.publisher, owner.jobs)
        #expect(BatchStatePublisher.slice(of: 0) != BatchStatePublisher.slice(of: 1))
        publisher.submit(
            (Int32(0)..<2).map { partition in
                PartitionStateRecord.batch(
                    topic: "events", partition: partition, epoch: 1, owner: "me", from: 0, offset: 5,
                    marks: PartitionStateRecord.encodeMarks([jobs: 3]), processedAtMs: 1, emails: ["m\(partition)"])
            })
        func batchRecords(_ partition: Int32) async throws -> [PartitionStateRecord] {
            let end = try await owner.cluster.endOffsets([writer.statePartition(partition)], timeout: .seconds(10))[
                writer.statePartition(partition)]!
            return try await writer.leases.reader.read([partition: (0, end)]).records[partition, default: []].map(\.record)
                .filter { $0.kind == .batch }
        }
        try await waitFor({ try await !batchRecords(0).isEmpty }, within: .seconds(10))
        #expect(try await batchRecords(1).isEmpty, "partition 1 is written in its own turn, not with partition 0")
        let started = ContinuousClock.now
        await publisher.settle()
        #expect(ContinuousClock.now - started < .seconds(3), "settle waited for partition 1's turn (30 s / 8)")
        #expect(try await batchRecords(1).map(\.emails) == [["m1"]])
        #expect(try await batchRecords(0).map(\.emails) == [["m0"]])
    }
}

private final class Counter: Sendable {
    private let count = Mutex(0)
    var value: Int { count.withLock { $0 } }
    func increment() { count.withLock { $0 += 1 } }
}

/// One instance owning event partitions 0 and 1 of a mock cluster's "state" topic, with its claims written,
/// renewing its leases.
private struct Owner {
    let mock: MockKafkaCluster
    let kafka: KafkaConfiguration
    let cluster: KafkaCluster
    let writer: StateWriter
    let publisher: BatchStatePublisher
    let renewals: Task<Void, Never>
    let jobs = TopicPartition(topic: "jobs", partition: 0)

    /// `lease`: long enough that no renewal on a loaded machine outlasts it, unless a test waits it out.
    init(interval: Duration, store: StateStore?, lease: Duration = .seconds(30)) async throws {
        mock = try MockKafkaCluster(brokers: 1)
        try mock.createTopic("state", partitions: 2)
        kafka = KafkaConfiguration(bootstrapServers: mock.bootstrapServers, properties: [:])
        cluster = try KafkaCluster(configuration: kafka)
        writer = StateWriter(
            stateTopic: "state", instanceId: "me", producer: try KafkaProducer(configuration: kafka),
            cluster: cluster, readerKafka: kafka, requestTimeout: .seconds(10),
            deliveryTimeout: .seconds(10), messageTimeout: .milliseconds(100), leaseDuration: lease)
        publisher = try BatchStatePublisher(writer: writer, store: store, interval: interval, logger: Logger(label: "test"))
        for partition in Int32(0)..<2 {
            let claim = PartitionStateRecord(
                kind: .claim, topic: "events", partition: partition, epoch: 1, owner: "me", offset: 0,
                marks: PartitionStateRecord.encodeMarks([jobs: 0]))
            let leaseFrom = ContinuousClock.now
            let at = try await writer.publishClaims([claim])[0]
            writer.leases.adopt(partition, epoch: 1, claimOffset: at, knownEnd: at, leaseFrom: leaseFrom)
            publisher.began(claim)
        }
        let writer = writer
        renewals = Task { await writer.leases.renewContinually(onFenced: { _ in }, log: { _ in }) }
    }

    func close() {
        renewals.cancel()
        mock.close()
    }
}
