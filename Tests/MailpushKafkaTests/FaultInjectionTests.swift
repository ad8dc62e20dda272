import MailpushKafka
import MailpushPartition
import Testing

@Suite struct FaultInjectionTests {
    /// Values 0..<count on a one-partition topic, so order and duplicates are easy to check.
    static func numbered(_ topic: String, _ range: Range<Int>) -> [OutgoingRecord] {
        range.map { OutgoingRecord(topic: topic, key: nil, value: bytes("\($0)"), headers: [KafkaHeader(key: "n", value: bytes("\($0)"))]) }
    }

    static func readAll(_ mock: MockKafkaCluster, _ topic: String, count: Int) async throws -> [String] {
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: topic, partition: 0): .beginning])
        return try await consume(consumer, count: count).map { String(decoding: $0.value ?? [], as: UTF8.self) }
    }

    @Test(arguments: [Int32(6), 7]) // NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT
    func retriableProduceErrorsAreRetriedWithoutDuplicates(code: Int32) async throws {
        let mock = try makeMock()
        try mock.createTopic("retry", partitions: 1)
        let lines = Collected<String>()
        var configuration = config(mock, ["debug": "msg"])
        configuration.logHandler = { _, _, message in lines.append(message) }
        let producer = try KafkaProducer(configuration: configuration)
        // Warm up (InitProducerId, metadata) so the injected errors hit Produce requests carrying our batch.
        _ = try await producer.send(Self.numbered("retry", 0..<1), timeout: .seconds(10))

        mock.pushRequestErrors(apiKey: KafkaApiKey.produce, errors: [code, code, code])
        let results = try await producer.send(Self.numbered("retry", 1..<101), timeout: .seconds(20))
        #expect(results.allSatisfy { $0.error == nil })
        #expect(results.map(\.offset) == Array(1..<101))

        #expect(try await Self.readAll(mock, "retry", count: 101) == (0..<101).map { "\($0)" })
        // All three injected errors hit our batch and were retried (librdkafka's "msg" debug lines say so).
        let text = code == 6 ? "Not leader for partition" : "Request timed out"
        #expect(lines.all.filter { $0.contains("encountered error: Broker: \(text)") }.count == 3)
    }

    @Test func permanentProduceErrorIsReportedPerRecord() async throws {
        let mock = try makeMock()
        try mock.createTopic("reject", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(Self.numbered("reject", 0..<1), timeout: .seconds(10))

        mock.pushRequestErrors(apiKey: KafkaApiKey.produce, errors: [10]) // MSG_SIZE_TOO_LARGE
        let results = try await producer.send(Self.numbered("reject", 1..<4), timeout: .seconds(10))
        #expect(results.count == 3)
        #expect(results.allSatisfy { $0.error?.name == "MSG_SIZE_TOO_LARGE" && $0.offset == -1 })
    }

    /// A consumer assigned at offset 50 of `topic`, which holds three records: outside the log. The cluster
    /// must outlive the consumer's use.
    static func consumerOutsideTheLog(_ topic: String) async throws -> (MockKafkaCluster, KafkaConsumer) {
        let mock = try makeMock()
        try mock.createTopic(topic, partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(Self.numbered(topic, 0..<3), timeout: .seconds(10))
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: topic, partition: 0): .offset(50)])
        return (mock, consumer)
    }

    @Test func startOffsetOutsideTheLogThrows() async throws {
        let (mock, consumer) = try await Self.consumerOutsideTheLog("range")
        defer { withExtendedLifetime(mock) {} }
        let error = await #expect(throws: KafkaError.self) {
            let deadline = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < deadline { _ = try await consumer.poll(maxRecords: 10, timeout: .milliseconds(200)) }
        }
        #expect(error?.code == KafkaError.Code.autoOffsetReset)
        #expect(error?.message.contains("range[0]") == true, "\(String(describing: error))")
    }

    /// The lookahead polls with `pollKeepingFailures`: a failure it meets must reach the batch loop's `poll`.
    @Test func aFailureMetWhileKeepingFailuresIsThrownByTheNextPoll() async throws {
        let (mock, consumer) = try await Self.consumerOutsideTheLog("kept")
        defer { withExtendedLifetime(mock) {} }
        let deadline = ContinuousClock.now + .seconds(10)
        var kept = false
        while ContinuousClock.now < deadline {
            guard let records = await consumer.pollKeepingFailures(maxRecords: 10, timeout: .milliseconds(200)) else {
                kept = true
                break
            }
            #expect(records.isEmpty)
        }
        #expect(kept, "pollKeepingFailures never stopped at the failure")
        let error = await #expect(throws: KafkaError.self) { _ = try await consumer.poll(maxRecords: 10, timeout: .zero) }
        #expect(error?.code == KafkaError.Code.autoOffsetReset)
    }
}
