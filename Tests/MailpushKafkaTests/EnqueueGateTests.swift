import MailpushKafka
import MailpushPartition
import Synchronization
import Testing

/// `KafkaProducer.send`'s gate: records are enqueued only before the instant the gate gave, asked again only once
/// it has passed (a fleet's partition leases; the fence's timing rests on it).
@Suite struct EnqueueGateTests {
    static func records(_ count: Int) -> [OutgoingRecord] {
        (0..<count).map { OutgoingRecord(topic: "gated", key: bytes("key-\($0)"), value: bytes("value-\($0)")) }
    }

    /// A gate that answers `answers` in turn (nil once they are used up), counting its calls.
    final class ScriptedGate: Sendable {
        private let answers: Mutex<[@Sendable () -> ContinuousClock.Instant?]>
        private let calls = Mutex(0)

        init(_ answers: [@Sendable () -> ContinuousClock.Instant?]) { self.answers = Mutex(answers) }

        var gate: EnqueueGate {
            EnqueueGate { [self] in
                calls.withLock { $0 += 1 }
                return answers.withLock { $0.isEmpty ? nil : $0.removeFirst() }?()
            }
        }

        var callCount: Int { calls.withLock { $0 } }
    }

    func delivered(_ mock: MockKafkaCluster) async throws -> Int {
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "gated", partition: 0): .beginning])
        var count = 0
        let deadline = ContinuousClock.now + .seconds(2)
        while ContinuousClock.now < deadline {
            count += try await consumer.poll(maxRecords: 500, timeout: .milliseconds(100)).count
        }
        return count
    }

    @Test func aGateWhoseInstantLastsIsAskedOnceForTheWholeSend() async throws {
        let mock = try makeMock()
        try mock.createTopic("gated", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let gate = ScriptedGate([{ .now + .seconds(60) }])
        let results = try await producer.send(Self.records(200), timeout: .seconds(10), gate: gate.gate)
        #expect(results.allSatisfy { $0.error == nil })
        #expect(gate.callCount == 1)
        #expect(try await delivered(mock) == 200)
    }

    @Test func anInstantAlreadyPastEnqueuesNothing() async throws {
        let mock = try makeMock()
        try mock.createTopic("gated", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let gate = ScriptedGate([{ .now - .milliseconds(1) }])
        await #expect {
            _ = try await producer.send(Self.records(10), timeout: .seconds(10), gate: gate.gate)
        } throws: { ($0 as? KafkaError)?.code == KafkaError.Code.leaseExpired }
        #expect(try await delivered(mock) == 0)
    }

    /// The producer's queue holds 5 records and the broker answers after 300 ms, so the 6th waits for room until
    /// the gate's instant (100 ms) has passed: it must be asked again before that record goes, and its no stops the
    /// send. Asked only once per record, before the wait, a record would go after the instant. (With an instant of
    /// 1 ms and no delay at the broker, a loaded machine sometimes let the instant pass before the first record.)
    @Test func aRecordThatWaitedForRoomIsNotEnqueuedPastTheGatesInstant() async throws {
        let mock = try makeMock()
        try mock.createTopic("gated", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock, ["queue.buffering.max.messages": "5"]))
        let gate = ScriptedGate([{ .now + .milliseconds(100) }])
        mock.setRoundTripTime(broker: 1, milliseconds: 300)
        await #expect {
            _ = try await producer.send(Self.records(60), timeout: .seconds(10), gate: gate.gate)
        } throws: { ($0 as? KafkaError)?.code == KafkaError.Code.leaseExpired }
        mock.setRoundTripTime(broker: 1, milliseconds: 0)
        #expect(gate.callCount == 2)
        let count = try await delivered(mock)
        #expect(count >= 1 && count <= 5, "\(count) records left; the queue holds 5 and the instant passed while the 6th waited")
    }

    @Test func aGateThatWaitsHoldsTheSendUntilItAnswers() async throws {
        let mock = try makeMock()
        try mock.createTopic("gated", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let started = ContinuousClock.now
        let slowGate = EnqueueGate {
            try? await Task.sleep(for: .milliseconds(100))
            return .now + .seconds(60)
        }
        let results = try await producer.send(Self.records(20), timeout: .seconds(10), gate: slowGate)
        #expect(results.allSatisfy { $0.error == nil })
        #expect(ContinuousClock.now - started >= .milliseconds(100))
    }
}
