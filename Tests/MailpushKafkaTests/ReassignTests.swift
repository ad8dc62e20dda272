import MailpushKafka
import MailpushPartition
import Testing

@Suite struct ReassignTests {
    /// A fleet member changes its events consumer's assignment twice in a row after a lost partition. With
    /// `assign` back to back, librdkafka 2.0.2 stops a partition twice and aborts the process (issue 5573);
    /// `reassign` spaces the changes, and the consumer then reads each partition from where it was pointed.
    @Test func assignmentsChangedBackToBackKeepTheProcessAliveAndReadFromTheNewOffsets() async throws {
        let mock = try makeMock()
        let perPartition = try await recordsSpread(400, over: "moving", partitions: 8, in: mock)
        let consumer = try KafkaConsumer(configuration: config(mock))
        let partitions = allPartitions("moving", 8)
        try consumer.assign(Dictionary(uniqueKeysWithValues: partitions.map { ($0, StartOffset.beginning) }))
        _ = try await consumer.poll(maxRecords: 50, timeout: .seconds(5))
        for round in 0..<40 {
            // Fetching everywhere, then two changes in a row that keep most partitions.
            _ = try await consumer.poll(maxRecords: 10, timeout: .milliseconds(50))
            let kept = partitions.filter { $0.partition != Int32(round % 8) }
            try await consumer.reassign(Dictionary(uniqueKeysWithValues: kept.map { ($0, StartOffset.beginning) }))
            try await consumer.reassign(
                Dictionary(
                    uniqueKeysWithValues: partitions.map {
                        ($0, (perPartition[$0.partition] ?? 0) > 0 ? StartOffset.offset(1) : .beginning)
                    }))
        }
        let received = try await consume(consumer, count: perPartition.values.reduce(0) { $0 + $1 - 1 })
        for (partition, count) in perPartition where count > 1 {
            let offsets = received.filter { $0.partition == partition }.map(\.offset)
            #expect(offsets == Array(1..<Int64(count)), "partition \(partition) read from offset 1")
        }
    }

    /// A consumer kept between reads (the lease renewals' `KeptStateConsumer`): assigned from nothing, read until a
    /// record of the assignment came, unassigned at once, assigned again at once. An assignment from nothing stops
    /// nothing, and one record read means librdkafka started the assignment, which it does only once every earlier
    /// stop is confirmed: neither change can stop a partition twice, so neither waits, and each read starts at its
    /// own offsets.
    @Test func readsOfAKeptConsumerNeedNoSpacing() async throws {
        let mock = try makeMock()
        let perPartition = try await recordsSpread(200, over: "kept", partitions: 4, in: mock)
        let consumer = try KafkaConsumer(configuration: config(mock, ["fetch.wait.max.ms": "10"]))
        let partitions = allPartitions("kept", 4).filter { (perPartition[$0.partition] ?? 0) > 20 }
        let clock = ContinuousClock()
        let started = clock.now
        for round in 0..<30 {
            let start = Int64(round % 20)
            try await consumer.reassign(Dictionary(uniqueKeysWithValues: partitions.map { ($0, StartOffset.offset(start)) }))
            var first: [TopicPartition: Int64] = [:]
            while first.count < partitions.count {
                for record in try await consumer.poll(maxRecords: 100, timeout: .seconds(5)) where first[record.topicPartition] == nil {
                    first[record.topicPartition] = record.offset
                }
            }
            #expect(first.values.allSatisfy { $0 == start }, "round \(round) read from offset \(start): \(first)")
            #expect(!consumer.positions(partitions).isEmpty)
            try consumer.assign([:])
        }
        #expect(clock.now - started < KafkaConsumer.assignSpacing * 30, "no change waited out the spacing")
    }

    /// Makes `topic` with `partitions` partitions and writes `count` records keyed over them; the records per partition.
    private func recordsSpread(_ count: Int, over topic: String, partitions: Int, in mock: MockKafkaCluster) async throws
        -> [Int32: Int]
    {
        try mock.createTopic(topic, partitions: partitions)
        let producer = try KafkaProducer(configuration: config(mock))
        let sent = (0..<count).map { OutgoingRecord(topic: topic, key: bytes("k\($0 % partitions)"), value: bytes("v\($0)")) }
        let results = try await producer.send(sent, timeout: .seconds(10))
        return Dictionary(grouping: results, by: \.partition).mapValues(\.count)
    }
}
