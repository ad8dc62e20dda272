import MailpushKafka
import MailpushPartition
import Testing

@Suite struct LifecycleTests {
    /// A poll's timeout far beyond what a close or a cancellation takes to end it: the bound the tests check is
    /// half of it, not a fixed few seconds, which a loaded machine's slow start of the polling task could outlast
    /// (a CI run measured 5.4 s against 5).
    static let pollTimeout = Duration.seconds(60)

    @Test func closedConsumerThrows() async throws {
        let mock = try makeMock()
        try mock.createTopic("closed", partitions: 1)
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "closed", partition: 0): .beginning])
        consumer.close()
        consumer.close()
        let error = await #expect(throws: KafkaError.self) { _ = try await consumer.poll(maxRecords: 1, timeout: .zero) }
        #expect(error?.code == KafkaError.Code.destroyed)
        #expect(throws: KafkaError.self) { try consumer.assign([:]) }
    }

    @Test func closeEndsAPollInProgress() async throws {
        let mock = try makeMock()
        try mock.createTopic("idle", partitions: 1)
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "idle", partition: 0): .beginning])
        let start = ContinuousClock.now
        let polling = Task { try await consumer.poll(maxRecords: 1, timeout: Self.pollTimeout) }
        try await Task.sleep(for: .milliseconds(300))
        consumer.close()
        #expect(try await polling.value.isEmpty)
        #expect(ContinuousClock.now - start < Self.pollTimeout / 2, "ended by the close, not by its timeout")
    }

    @Test func cancellingAPollReturnsPromptly() async throws {
        let mock = try makeMock()
        try mock.createTopic("cancel", partitions: 1)
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "cancel", partition: 0): .beginning])
        let start = ContinuousClock.now
        let polling = Task { try await consumer.poll(maxRecords: 1, timeout: Self.pollTimeout) }
        try await Task.sleep(for: .milliseconds(300))
        polling.cancel()
        #expect(try await polling.value.isEmpty)
        #expect(ContinuousClock.now - start < Self.pollTimeout / 2, "ended by the cancellation, not by its timeout")
    }

    @Test func emptySendAndFlush() async throws {
        let mock = try makeMock()
        let producer = try KafkaProducer(configuration: config(mock))
        #expect(try await producer.send([], timeout: .seconds(1)).isEmpty)
        await producer.flush(timeout: .seconds(1))
    }

    @Test func closedMockIgnoresFaultInjection() throws {
        let mock = try makeMock()
        mock.close()
        mock.setBrokerDown(1)
        mock.pushRequestErrors(apiKey: KafkaApiKey.fetch, errors: [6])
        #expect(mock.bootstrapServers == "")
        #expect(throws: KafkaError.self) { try mock.createTopic("late", partitions: 1) }
    }

    @Test func mockBootstrapListsEveryBroker() throws {
        let mock = try makeMock(brokers: 3)
        let addresses = mock.bootstrapServers.split(separator: ",")
        #expect(addresses.count == 3)
        #expect(addresses.allSatisfy { $0.contains(":") })
    }
}
