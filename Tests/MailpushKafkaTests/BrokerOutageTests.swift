import MailpushKafka
import MailpushPartition
import Testing

/// Tests that start child processes or take mock brokers down never overlap: librdkafka's mock re-binds a
/// broker's port when it goes down and aborts the process if that fails, which it does while a freshly
/// spawned child still holds the inherited listening socket (see `MockKafkaCluster.setBrokerDown`).
@Suite(.serialized) struct ProcessExclusiveTests {}

extension ProcessExclusiveTests {
    @Suite struct BrokerOutageTests {
        @Test func sendWaitsForBrokerToComeBack() async throws {
            let mock = try makeMock()
            try mock.createTopic("outage", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock))
            _ = try await producer.send(FaultInjectionTests.numbered("outage", 0..<1), timeout: .seconds(10))

            mock.setBrokerDown(1)
            let sending = Task { try await producer.send(FaultInjectionTests.numbered("outage", 1..<51), timeout: .seconds(20)) }
            try await Task.sleep(for: .seconds(1))
            mock.setBrokerUp(1)
            let results = try await sending.value
            #expect(results.allSatisfy { $0.error == nil })
            #expect(try await FaultInjectionTests.readAll(mock, "outage", count: 51) == (0..<51).map { "\($0)" })
        }

        @Test func sendTimesOutWhileBrokerStaysDown() async throws {
            let mock = try makeMock()
            try mock.createTopic("down", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock))
            _ = try await producer.send(FaultInjectionTests.numbered("down", 0..<1), timeout: .seconds(10))

            mock.setBrokerDown(1)
            let start = ContinuousClock.now
            let error = await #expect(throws: KafkaError.self) {
                try await producer.send(FaultInjectionTests.numbered("down", 1..<11), timeout: .seconds(1))
            }
            #expect(error?.code == KafkaError.Code.timedOut)
            #expect(error?.description.contains("10 of 10 records") == true, "\(String(describing: error))")
            #expect(ContinuousClock.now - start < .seconds(5)) // not librdkafka's 300 s message timeout
        }

        /// A record that timed out in librdkafka's own queue never reached a broker: its result says so, and the
        /// pipeline produces it again without reading the topic back first (docs/performance.md, session 50).
        @Test func recordsTimedOutInTheQueueAreKnownNotWritten() async throws {
            let mock = try makeMock()
            try mock.createTopic("queued", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock, ["message.timeout.ms": "1000"]))
            _ = try await producer.send(FaultInjectionTests.numbered("queued", 0..<1), timeout: .seconds(10))

            mock.setBrokerDown(1)
            let results = try await producer.send(FaultInjectionTests.numbered("queued", 1..<6), timeout: .seconds(10))
            mock.setBrokerUp(1)
            let timedOut = results.allSatisfy { $0.error?.name == "_MSG_TIMED_OUT" }
            let notWritten = results.allSatisfy(\.notWritten)
            #expect(timedOut, "\(results)")
            #expect(notWritten, "\(results)")
        }

        /// A record sent whose acknowledgement did not come in time may be in the log: its result does not claim
        /// otherwise, and the pipeline reads the topic back before producing it again.
        @Test func recordsSentWithoutAnAcknowledgementMayBeWritten() async throws {
            let mock = try makeMock()
            try mock.createTopic("sent", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock, ["message.timeout.ms": "1000"]))
            _ = try await producer.send(FaultInjectionTests.numbered("sent", 0..<1), timeout: .seconds(10))

            mock.setRoundTripTime(broker: 1, milliseconds: 3000)
            let results = try await producer.send(FaultInjectionTests.numbered("sent", 1..<2), timeout: .seconds(20))
            mock.setRoundTripTime(broker: 1, milliseconds: 0)
            let failed = results.allSatisfy { $0.error != nil }
            let mayBeWritten = results.allSatisfy { !$0.notWritten }
            #expect(failed, "\(results)")
            #expect(mayBeWritten, "\(results)")
        }

        @Test func consumerRidesOutBrokerOutage() async throws {
            let mock = try makeMock()
            try mock.createTopic("blip", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock))
            _ = try await producer.send(FaultInjectionTests.numbered("blip", 0..<5), timeout: .seconds(10))

            let errors = Collected<KafkaError>()
            var configuration = config(mock)
            configuration.errorHandler = { errors.append($0) }
            let consumer = try KafkaConsumer(configuration: configuration)
            try consumer.assign([TopicPartition(topic: "blip", partition: 0): .beginning])
            #expect(try await consume(consumer, count: 5).count == 5)

            mock.setBrokerDown(1)
            // Transient trouble is reported, not thrown.
            let deadline = ContinuousClock.now + .seconds(5)
            while errors.all.isEmpty, ContinuousClock.now < deadline {
                #expect(try await consumer.poll(maxRecords: 10, timeout: .milliseconds(200)).isEmpty)
            }
            #expect(!errors.all.isEmpty)
            mock.setBrokerUp(1)

            _ = try await producer.send(FaultInjectionTests.numbered("blip", 5..<10), timeout: .seconds(20))
            let rest = try await consume(consumer, count: 5, timeout: .seconds(20))
            #expect(rest.map(\.offset) == Array(5..<10))
        }
    }
}
