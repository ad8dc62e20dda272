import Foundation
import MailpushKafka
import MailpushPartition
import Testing

/// A fresh mock cluster per test, so tests stay independent when Swift Testing runs them in parallel.
func makeMock(brokers: Int = 1) throws -> MockKafkaCluster {
    try MockKafkaCluster(brokers: brokers)
}

func config(_ mock: MockKafkaCluster, _ properties: [String: String] = [:]) -> KafkaConfiguration {
    KafkaConfiguration(bootstrapServers: mock.bootstrapServers, properties: properties)
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

/// Polls until `count` records arrived (failing the test on timeout), then briefly checks nothing more comes.
func consume(
    _ consumer: KafkaConsumer, count: Int, timeout: Duration = .seconds(10),
    sourceLocation: SourceLocation = #_sourceLocation
) async throws -> [KafkaRecord] {
    var records: [KafkaRecord] = []
    let deadline = ContinuousClock.now + timeout
    while records.count < count, ContinuousClock.now < deadline {
        records += try await consumer.poll(maxRecords: 500, timeout: .milliseconds(200))
    }
    #expect(records.count == count, "expected \(count) records, got \(records.count)", sourceLocation: sourceLocation)
    records += try await consumer.poll(maxRecords: 500, timeout: .milliseconds(300))
    #expect(records.count == count, "more records than expected", sourceLocation: sourceLocation)
    return records
}

func allPartitions(_ topic: String, _ count: Int) -> [TopicPartition] {
    (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
}

/// Collects log lines / error events from librdkafka's threads.
final class Collected<T: Sendable>: @unchecked Sendable { // items only touched under lock
    private let lock = NSLock()
    private var items: [T] = []
    func append(_ item: T) { lock.withLock { items.append(item) } }
    var all: [T] { lock.withLock { items } }
}
