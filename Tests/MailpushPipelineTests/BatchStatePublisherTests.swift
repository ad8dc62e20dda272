import Logging
import MailpushKafka
import MailpushPartition
import Testing

@testable import MailpushPipeline

/// The publisher against a mock cluster: what lands in the state topic is what a restore follows.
struct BatchStatePublisherTests {
    /// Batches are submitted by the batch loop while checkpoints are asked for beside it (the expiry run, the
    /// checkpoint timer): per state partition the batch records still land in batch order, and each checkpoint
    /// holds the state of the batch record before it. (A drain that went on after letting go ran beside the next
    /// one, and a takeover found a chain broken at offset 4,000 of 100,000.)
    @Test func batchRecordsAndCheckpointsLandInOrderPerPartition() async throws {
        let mock = try MockKafkaCluster(brokers: 1)
        defer { mock.close() }
        try mock.createTopic("state", partitions: 2)
        let kafka = KafkaConfiguration(bootstrapServers: mock.bootstrapServers, properties: [:])
        let writer = StateWriter(
            stateTopic: "state", instanceId: "me", producer: try KafkaProducer(configuration: kafka),
            cluster: try KafkaCluster(configuration: kafka), readerKafka: kafka, requestTimeout: .seconds(10),
            deliveryTimeout: .seconds(10), messageTimeout: .milliseconds(100), leaseDuration: .milliseconds(500))
        let publisher = BatchStatePublisher(writer: writer, logger: Logger(label: "test"))
        let jobs = TopicPartition(topic: "jobs", partition: 0)
        for partition in Int32(0)..<2 {
            let claim = PartitionStateRecord(
                kind: .claim, topic: "events", partition: partition, epoch: 1, owner: "me", offset: 0,
                marks: PartitionStateRecord.encodeMarks([jobs: 0]))
            let leaseFrom = ContinuousClock.now
            let at = try await writer.publishClaim(claim)
            writer.adopt(partition, epoch: 1, claimOffset: at, knownEnd: at, leaseFrom: leaseFrom)
            publisher.began(claim)
        }
        let renewals = Task { await writer.renewContinually(onFenced: { _ in }, log: { _ in }) }
        defer { renewals.cancel() }
        try await Task.sleep(for: writer.takeoverWait)

        let checkpoints = Task {
            var acknowledged: [Int32: Int64] = [:]
            while !Task.isCancelled {
                acknowledged = await publisher.checkpoint()
                try? await Task.sleep(for: .milliseconds(3))
            }
            return acknowledged
        }
        var offsets: [Int32: Int64] = [0: 0, 1: 0]
        for batch in Int64(1)...400 {
            var records: [PartitionStateRecord] = []
            for partition in Int32(0)..<2 where (batch + Int64(partition)) % 3 != 0 {
                let from = offsets[partition]!
                offsets[partition] = from + 5
                records.append(
                    PartitionStateRecord(
                        kind: .batch, topic: "events", partition: partition, epoch: 1, owner: "me", from: from, offset: from + 5,
                        marks: PartitionStateRecord.encodeMarks([jobs: batch * 7]), processedAtMs: batch,
                        emails: batch % 4 == 0 ? [] : ["m\(batch)"]))
            }
            publisher.submit(records)
            if batch % 10 == 0 { try await Task.sleep(for: .milliseconds(1)) }
        }
        await publisher.settle()
        checkpoints.cancel()
        let acknowledged = await checkpoints.value
        _ = await publisher.checkpoint()

        let ends = try await KafkaCluster(configuration: kafka).endOffsets(
            [TopicPartition(topic: "state", partition: 0), TopicPartition(topic: "state", partition: 1)], timeout: .seconds(10))
        let written = try await writer.readRecords([0: (0, ends[writer.statePartition(0)]!), 1: (0, ends[writer.statePartition(1)]!)])
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
}
