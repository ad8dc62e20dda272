import MailpushKafka
import MailpushPartition
import Testing

/// A client's first record of a topic new to it must not wait for librdkafka's once-a-second topic scan. Before the
/// clients learned a new topic's leaders at once, a running service's first fetch and first produce each waited up
/// to 1 s, and a partition assigned at its logical beginning 0.5 s more. The clients here are connected (busy with
/// another topic) before the new topic comes, as a service's are: a client that connects afterwards asks for every
/// topic it knows on connecting, which hides the wait. The bound leaves a loaded machine many times the few ms
/// these take; the scan alone exceeds it.
@Suite struct FirstRecordTests {
    static let bound: Duration = .milliseconds(400)

    @Test(arguments: [StartOffset.beginning, .offset(0)])
    func aConsumerGetsTheFirstRecordOfANewTopicAtOnce(start: StartOffset) async throws {
        let mock = try makeMock()
        try mock.createTopic("warm", partitions: 1)
        try mock.createTopic("new", partitions: 2)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(
            [OutgoingRecord(topic: "warm", key: nil, value: bytes("w"))]
                + [0, 1].map { OutgoingRecord(topic: "new", key: nil, value: bytes("v"), partition: $0) },
            timeout: .seconds(10))
        // As the service's consumers on the development broker: an empty fetch is not held for 500 ms.
        let consumer = try KafkaConsumer(configuration: config(mock, ["fetch.wait.max.ms": "2"]))
        try consumer.assign([TopicPartition(topic: "warm", partition: 0): .offset(0)])
        _ = try await consume(consumer, count: 1)

        let assigned = ContinuousClock.now
        try consumer.assign(Dictionary(uniqueKeysWithValues: allPartitions("new", 2).map { ($0, start) }))
        var records: [KafkaRecord] = []
        while records.count < 2, ContinuousClock.now - assigned < .seconds(10) {
            records += try await consumer.poll(maxRecords: 10, timeout: .milliseconds(20))
        }
        let took = ContinuousClock.now - assigned
        #expect(records.count == 2)
        #expect(took < Self.bound, "first records \(took) after the assignment")
    }

    @Test func aPreparedProducerDeliversTheFirstRecordOfANewTopicAtOnce() async throws {
        let mock = try makeMock()
        try mock.createTopic("warm", partitions: 1)
        try mock.createTopic("new", partitions: 4)
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send([OutgoingRecord(topic: "warm", key: nil, value: bytes("w"))], timeout: .seconds(10))

        await producer.prepare(topics: ["new"])
        let started = ContinuousClock.now
        let results = try await producer.send(
            [OutgoingRecord(topic: "new", key: bytes("k"), value: bytes("v"))], timeout: .seconds(10))
        let took = ContinuousClock.now - started
        #expect(results.first?.error == nil)
        #expect(took < Self.bound, "first record delivered \(took) after it was sent")
    }
}
