import MailpushKafka
import MailpushPartition
import Testing

@Suite struct PartitionReaderTests {
    /// Produces `count` records to partition 0 … `partitions - 1` of `topic` (round robin by key), returns the ends.
    private func fill(_ mock: MockKafkaCluster, _ topic: String, partitions: Int, count: Int) async throws -> [TopicPartition: Int64] {
        try mock.createTopic(topic, partitions: partitions)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(
            (0..<count).map { OutgoingRecord(topic: topic, key: bytes("k\($0)"), value: bytes("v\($0)")) },
            timeout: .seconds(10))
        let cluster = try KafkaCluster(configuration: config(mock))
        return try await cluster.endOffsets(allPartitions(topic, partitions), timeout: .seconds(5))
    }

    private func reader(_ mock: MockKafkaCluster, giveUpAfter: Duration? = .seconds(10)) throws -> PartitionReader {
        PartitionReader(
            consumer: try KafkaConsumer(configuration: config(mock)),
            cluster: try KafkaCluster(configuration: config(mock)),
            requestTimeout: .seconds(5), giveUpAfter: giveUpAfter)
    }

    @Test func readsEachPartitionFromItsStartToItsEndInChunks() async throws {
        let mock = try makeMock()
        let ends = try await fill(mock, "ranges", partitions: 3, count: 60)
        var reader = try reader(mock)
        reader.chunkSize = 7
        let starts = Dictionary(uniqueKeysWithValues: ends.keys.map { ($0, Int64(2)) })
        var seen: [TopicPartition: [Int64]] = [:]
        var chunks = 0
        try await reader.read(from: starts, to: ends) { records in
            chunks += 1
            #expect(records.count <= 7)
            for record in records { seen[record.topicPartition, default: []].append(record.offset) }
        }
        for (partition, end) in ends {
            #expect(seen[partition] == Array(2..<end), "\(partition)")
        }
        #expect(chunks >= 60 / 7)
    }

    @Test func aPartitionAlreadyAtItsEndDoesNotStallTheOthers() async throws {
        let mock = try makeMock()
        let ends = try await fill(mock, "partly", partitions: 2, count: 20)
        let (done, open) = (TopicPartition(topic: "partly", partition: 0), TopicPartition(topic: "partly", partition: 1))
        #expect(ends[done]! > 0 && ends[open]! > 0)
        var offsets: [Int64] = []
        // A stall would end in the give-up: finishing before it is finishing, however slow the machine.
        let giveUpAfter = Duration.seconds(10)
        let started = ContinuousClock.now
        try await reader(mock, giveUpAfter: giveUpAfter).read(from: [done: ends[done]!, open: 0], to: ends) { records in
            offsets += records.filter { $0.topicPartition == open }.map(\.offset)
        }
        #expect(offsets == Array(0..<ends[open]!))
        #expect(ContinuousClock.now - started < giveUpAfter, "finished, not stalled")
    }

    @Test func readsOnlyUpToTheEndAskedFor() async throws {
        let mock = try makeMock()
        let ends = try await fill(mock, "prefix", partitions: 1, count: 20)
        let partition = TopicPartition(topic: "prefix", partition: 0)
        #expect(ends[partition] == 20)
        var offsets: [Int64] = []
        try await reader(mock).read(from: [partition: 5], to: [partition: 9]) { records in
            offsets += records.map(\.offset)
        }
        // Records past the end may come in the last chunk; everything up to the end came, in order.
        #expect(Array(offsets.prefix(4)) == [5, 6, 7, 8])
        #expect(offsets == offsets.sorted())
    }

    @Test func nothingToReadReturnsWithoutPolling() async throws {
        let mock = try makeMock()
        let ends = try await fill(mock, "done", partitions: 2, count: 10)
        var called = false
        let started = ContinuousClock.now
        try await reader(mock).read(from: ends, to: ends) { _ in called = true }
        #expect(!called)
        #expect(ContinuousClock.now - started < .seconds(2))
    }

    @Test func retentionPastTheEndFinishesThePartition() async throws {
        let mock = try makeMock()
        try mock.createTopic("retained", partitions: 1)
        // The mock keeps at most 5 MB per partition: 12 records of 600 kB (one batch each) push the first out.
        let producer = try KafkaProducer(configuration: config(mock, ["batch.size": "1"]))
        let big = [UInt8](repeating: 7, count: 600_000)
        _ = try await producer.send((0..<12).map { _ in OutgoingRecord(topic: "retained", key: nil, value: big) }, timeout: .seconds(20))
        let partition = TopicPartition(topic: "retained", partition: 0)
        let cluster = try KafkaCluster(configuration: config(mock))
        let logStart = try #require(try await cluster.beginningOffsets([partition], timeout: .seconds(5))[partition])
        #expect(logStart > 1)

        var gone: [Int64] = []
        try await reader(mock, giveUpAfter: .seconds(3)).read(from: [partition: 0], to: [partition: 1]) { gone += $0.map(\.offset) }
        #expect(gone.isEmpty)

        // A start below the log start begins at the log start instead of failing the consumer.
        var offsets: [Int64] = []
        try await reader(mock, giveUpAfter: .seconds(10)).read(from: [partition: 0], to: [partition: 12]) { offsets += $0.map(\.offset) }
        #expect(offsets == Array(logStart..<12))
    }

    @Test func anAlreadyAssignedConsumerKeepsRecordsPastTheEnd() async throws {
        let mock = try makeMock()
        let ends = try await fill(mock, "assigned", partitions: 1, count: 10)
        let partition = TopicPartition(topic: "assigned", partition: 0)
        let reader = try reader(mock)
        try reader.consumer.assign([partition: .offset(3)])
        var offsets: [Int64] = []
        try await reader.readAssigned(at: [partition: 3], to: [partition: 6]) { offsets += $0.map(\.offset) }
        // The rest of what was polled is handed over too, and the next read carries on after it.
        try await reader.readAssigned(at: [partition: offsets.last! + 1], to: ends) { offsets += $0.map(\.offset) }
        #expect(offsets == Array(3..<10))
        #expect(reader.consumer.positions([partition]) == [partition: 10])
    }

    @Test func givesUpWhenTheEndNeverComes() async throws {
        let mock = try makeMock()
        _ = try await fill(mock, "short", partitions: 1, count: 4)
        let partition = TopicPartition(topic: "short", partition: 0)
        var offsets: [Int64] = []
        let error = await #expect(throws: PartitionReader.Stalled.self) {
            try await reader(mock, giveUpAfter: .seconds(4)).read(from: [partition: 0], to: [partition: 10]) { offsets += $0.map(\.offset) }
        }
        #expect(error?.partitions == [partition])
        #expect(offsets == [0, 1, 2, 3])
    }
}
