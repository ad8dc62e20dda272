import MailpushKafka
import MailpushPartition
import Testing

@Suite struct RoundTripTests {
    /// Keys, null and empty values, repeated / null / empty header values, across 3 partitions.
    static func batch(topic: String) -> [OutgoingRecord] {
        (0..<60).map { (i: Int) -> OutgoingRecord in
            let key: [UInt8]? = i % 10 == 9 ? nil : bytes("key-\(i % 7)")
            let value: [UInt8]?
            switch i % 5 {
            case 0: value = nil
            case 1: value = []
            default: value = bytes("value-\(i)") + [0, 255, UInt8(i)]
            }
            var headers = [
                KafkaHeader(key: "mailpush-source", value: bytes("src-\(i)")),
                KafkaHeader(key: "mailpush-job-id", value: bytes("job-\(i)")),
            ]
            if i % 4 != 0 {
                headers += [
                    KafkaHeader(key: "dup", value: [1]), KafkaHeader(key: "dup", value: [2]),
                    KafkaHeader(key: "null", value: nil), KafkaHeader(key: "empty", value: []),
                ]
            }
            return OutgoingRecord(topic: topic, key: key, value: value, headers: headers)
        }
    }

    @Test func producedRecordsReadBackIdentically() async throws {
        let mock = try makeMock()
        try mock.createTopic("rt", partitions: 3)
        let producer = try KafkaProducer(configuration: config(mock))
        let sent = Self.batch(topic: "rt")
        let results = try await producer.send(sent, timeout: .seconds(10))

        #expect(results.count == sent.count)
        #expect(results.allSatisfy { $0.error == nil })
        // Real offsets: per partition, 0,1,2,… in send order.
        for partition in Set(results.map(\.partition)) {
            let offsets = results.filter { $0.partition == partition }.map(\.offset)
            #expect(offsets == Array(0..<Int64(offsets.count)), "partition \(partition)")
        }
        #expect(Set(results.map(\.partition)).count > 1, "keys should spread over partitions")

        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign(Dictionary(uniqueKeysWithValues: allPartitions("rt", 3).map { ($0, StartOffset.beginning) }))
        let received = try await consume(consumer, count: sent.count)

        for partition: Int32 in 0..<3 {
            let got = received.filter { $0.partition == partition }
            let expected = zip(sent, results).filter { $0.1.partition == partition }
            #expect(got.map(\.offset) == expected.map(\.1.offset))
            for (record, (original, _)) in zip(got, expected) {
                #expect(record.topic == "rt")
                #expect(record.key == original.key)
                #expect(record.value == original.value)
                #expect(record.headers == original.headers)
                #expect(record.timestampMs != nil)
            }
        }
        // Null and empty values stay distinct.
        #expect(received.contains { $0.value == nil })
        #expect(received.contains { $0.value == [] })
    }

    @Test func assignAtExactOffsets() async throws {
        let mock = try makeMock()
        try mock.createTopic("exact", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let sent = (0..<20).map { OutgoingRecord(topic: "exact", key: nil, value: bytes("v\($0)")) }
        _ = try await producer.send(sent, timeout: .seconds(10))

        let consumer = try KafkaConsumer(configuration: config(mock))
        let tp = TopicPartition(topic: "exact", partition: 0)
        try consumer.assign([tp: .offset(13)])
        let tail = try await consume(consumer, count: 7)
        #expect(tail.map(\.offset) == Array(13..<20))
        #expect(tail.map(\.value) == (13..<20).map { bytes("v\($0)") })

        // Re-assigning moves the position.
        try consumer.assign([tp: .offset(2)])
        let again = try await consume(consumer, count: 18)
        #expect(again.first?.offset == 2)
        #expect(again.last?.offset == 19)
    }

    @Test func assignAtEndSeesOnlyNewRecords() async throws {
        let mock = try makeMock()
        try mock.createTopic("tail", partitions: 2)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(
            (0..<10).map { OutgoingRecord(topic: "tail", key: bytes("k\($0)"), value: bytes("old")) },
            timeout: .seconds(10))
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign(Dictionary(uniqueKeysWithValues: allPartitions("tail", 2).map { ($0, StartOffset.end) }))

        // "End" is resolved asynchronously after assign, so keep producing new records until some arrive;
        // whichever those are, no old record may ever show up.
        var sent: [DeliveryResult] = []
        var received: [KafkaRecord] = []
        let deadline = ContinuousClock.now + .seconds(15)
        while received.isEmpty, ContinuousClock.now < deadline {
            sent += try await producer.send(
                (0..<5).map { OutgoingRecord(topic: "tail", key: bytes("k\($0)"), value: bytes("new")) },
                timeout: .seconds(10))
            received += try await consumer.poll(maxRecords: 100, timeout: .milliseconds(500))
        }
        while case let more = try await consumer.poll(maxRecords: 100, timeout: .milliseconds(500)), !more.isEmpty {
            received += more
        }
        #expect(!received.isEmpty)
        #expect(received.allSatisfy { $0.value == bytes("new") })
        // Per partition: a gapless run of new records up to the last one sent.
        for partition: Int32 in 0..<2 {
            let got = received.filter { $0.partition == partition }.map(\.offset)
            let produced = sent.filter { $0.partition == partition }.map(\.offset)
            guard let first = got.first else { continue }
            #expect(produced.contains(first))
            #expect(got == Array(first...produced.max()!))
        }
    }

    @Test func concurrentSendsEachGetTheirOwnResults() async throws {
        let mock = try makeMock()
        try mock.createTopic("many", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let perTask = try await withThrowingTaskGroup(of: (Int, [DeliveryResult]).self) { group in
            for task in 0..<4 {
                group.addTask {
                    let records = (0..<100).map { OutgoingRecord(topic: "many", key: nil, value: bytes("t\(task)-\($0)")) }
                    return (task, try await producer.send(records, timeout: .seconds(20)))
                }
            }
            return try await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "many", partition: 0): .beginning])
        let valueAt = Dictionary(uniqueKeysWithValues: try await consume(consumer, count: 400).map { ($0.offset, $0.value) })
        for (task, results) in perTask {
            #expect(results.enumerated().allSatisfy { i, result in valueAt[result.offset] == bytes("t\(task)-\(i)") })
        }
    }

    /// The producer keeps one topic handle per topic: records for several topics, mixed in one send and named by
    /// strings of their own each time, each land in their own topic, in order, and a topic first seen later works.
    @Test func recordsForSeveralTopicsEachLandInTheirOwn() async throws {
        let mock = try makeMock()
        for topic in ["left", "right", "later"] { try mock.createTopic(topic, partitions: 1) }
        let producer = try KafkaProducer(configuration: config(mock))
        let mixed = (0..<40).map { i in
            OutgoingRecord(topic: String(i % 2 == 0 ? "le" : "ri") + (i % 2 == 0 ? "ft" : "ght"), key: nil, value: bytes("m\(i)"))
        }
        let results = try await producer.send(mixed, timeout: .seconds(10))
        #expect(results.allSatisfy { $0.error == nil })
        _ = try await producer.send([OutgoingRecord(topic: "later", key: nil, value: bytes("late"))], timeout: .seconds(10))

        for (topic, parity) in [("left", 0), ("right", 1)] {
            let consumer = try KafkaConsumer(configuration: config(mock))
            try consumer.assign([TopicPartition(topic: topic, partition: 0): .beginning])
            let got = try await consume(consumer, count: 20)
            #expect(got.map(\.topic) == Array(repeating: topic, count: 20))
            #expect(got.map(\.value) == stride(from: parity, to: 40, by: 2).map { bytes("m\($0)") })
        }
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "later", partition: 0): .beginning])
        #expect(try await consume(consumer, count: 1).map(\.value) == [bytes("late")])
    }

    @Test func sendWaitsOutAFullLocalQueue() async throws {
        let mock = try makeMock()
        try mock.createTopic("full", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock, ["queue.buffering.max.messages": "10"]))
        let results = try await producer.send(
            (0..<200).map { OutgoingRecord(topic: "full", key: nil, value: bytes("\($0)")) },
            timeout: .seconds(20))
        #expect(results.map(\.offset) == Array(0..<200))
        #expect(results.allSatisfy { $0.error == nil })
    }

    @Test func pollReturnsAtMostMaxRecordsAndEmptyOnTimeout() async throws {
        let mock = try makeMock()
        try mock.createTopic("max", partitions: 1)
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "max", partition: 0): .beginning])
        let start = ContinuousClock.now
        #expect(try await consumer.poll(maxRecords: 10, timeout: .milliseconds(300)).isEmpty)
        #expect(ContinuousClock.now - start >= .milliseconds(250))

        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(
            (0..<50).map { OutgoingRecord(topic: "max", key: nil, value: [UInt8($0)]) },
            timeout: .seconds(10))
        var got: [KafkaRecord] = []
        while got.count < 50 {
            let batch = try await consumer.poll(maxRecords: 7, timeout: .seconds(5))
            #expect(!batch.isEmpty && batch.count <= 7)
            if batch.isEmpty { break }
            got += batch
        }
        #expect(got.map(\.offset) == Array(0..<50))
    }

    /// A poll stops near `maxBytes` and leaves the rest fetched for the next ones: a backlog of large records
    /// cannot fill one poll with 2,000 of them.
    @Test func pollStopsNearMaxBytesAndLeavesTheRestForTheNextPolls() async throws {
        let mock = try makeMock()
        try mock.createTopic("large", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let recordBytes = 100_000
        _ = try await producer.send(
            (0..<40).map { OutgoingRecord(topic: "large", key: nil, value: [UInt8](repeating: UInt8($0), count: recordBytes)) },
            timeout: .seconds(10))
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "large", partition: 0): .beginning])
        // Time for librdkafka to fetch all 4 MB (the mock keeps about 5 MB), so that one unbounded poll would take all 40.
        try await Task.sleep(for: .milliseconds(500))
        var got: [KafkaRecord] = []
        while got.count < 40 {
            let batch = try await consumer.poll(maxRecords: 2000, maxBytes: 1_000_000, timeout: .seconds(5))
            // 1 MB is 10 records; the consumer takes them from librdkafka 16 at a time.
            #expect(!batch.isEmpty && batch.count <= 10 + 16, "a poll took \(batch.count) records")
            if batch.isEmpty { break }
            got += batch
        }
        #expect(got.map(\.offset) == Array(0..<40))
        #expect(got.allSatisfy { $0.value == [UInt8](repeating: UInt8($0.offset), count: recordBytes) })
    }
}

extension RoundTripTests {
    /// A record librdkafka refuses at once (here: a partition the topic does not have) is a failed delivery, not
    /// a crash. With headers given one by one (`RD_KAFKA_VTYPE_HEADER`), librdkafka 2.0.2's `rd_kafka_produceva`
    /// freed them twice on that path (librdkafka issue 4627): `mailpush run` crashed with SIGSEGV instead of
    /// exiting 70 when the broker refused a topic.
    @Test func aRecordRefusedAtOnceFailsItsSendWithoutFreeingItsHeadersTwice() async throws {
        let mock = try makeMock()
        try mock.createTopic("refused", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        await producer.prepare(topics: ["refused"])
        for attempt in 0..<200 {
            let record = OutgoingRecord(
                topic: "refused", key: bytes("k"), value: bytes("v"),
                headers: [
                    KafkaHeader(key: "mailpush-source", value: bytes("src-\(attempt)")),
                    KafkaHeader(key: "mailpush-job-id", value: bytes("job-\(attempt)")),
                ], partition: 7)
            let results = try await producer.send([record], timeout: .seconds(10))
            #expect(results.count == 1 && results[0].error != nil && results[0].offset == -1)
        }
        let written = try await producer.send(
            [OutgoingRecord(topic: "refused", key: nil, value: bytes("after"), partition: 0)], timeout: .seconds(10))
        #expect(written.first?.error == nil, "the producer still works")
    }
}
