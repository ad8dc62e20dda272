import Foundation
import Glibc
import MailpushPartition
import Synchronization
import Testing

@testable import MailpushKafka

@Suite struct ClusterTests {
    @Test func watermarksMatchWhatWasProduced() async throws {
        let mock = try makeMock()
        try mock.createTopic("wm", partitions: 3)
        let cluster = try KafkaCluster(configuration: config(mock))
        let partitions = allPartitions("wm", 3)

        #expect(
            try await cluster.endOffsets(partitions, timeout: .seconds(5)) == Dictionary(uniqueKeysWithValues: partitions.map { ($0, 0) }))

        let producer = try KafkaProducer(configuration: config(mock))
        let results = try await producer.send(
            (0..<40).map { OutgoingRecord(topic: "wm", key: bytes("k\($0)"), value: []) },
            timeout: .seconds(10))
        var expectedEnd: [TopicPartition: Int64] = Dictionary(uniqueKeysWithValues: partitions.map { ($0, 0) })
        for r in results { expectedEnd[TopicPartition(topic: "wm", partition: r.partition)]! += 1 }

        #expect(try await cluster.endOffsets(partitions, timeout: .seconds(5)) == expectedEnd)
        #expect(
            try await cluster.beginningOffsets(partitions, timeout: .seconds(5))
                == Dictionary(uniqueKeysWithValues: partitions.map { ($0, 0) }))
        // Fresh from the broker, not cached: another send moves the end at once.
        let more = try await producer.send([OutgoingRecord(topic: "wm", key: bytes("k0"), value: nil)], timeout: .seconds(5))
        let tp = TopicPartition(topic: "wm", partition: more[0].partition)
        #expect(try await cluster.endOffsets([tp], timeout: .seconds(5)) == [tp: expectedEnd[tp]! + 1])
    }

    /// More partitions than one ListOffsets call asks for (`RdMetadataClient.partitionsPerCall`) are asked in several
    /// calls at once: every partition still gets its own end, none is left out or mixed up with another.
    @Test func endOffsetsOfMorePartitionsThanOneCallAsksForAreEachTheirOwn() async throws {
        let mock = try makeMock()
        let count = Int32(RdMetadataClient.partitionsPerCall) + 37
        try mock.createTopic("many-a", partitions: Int(count))
        try mock.createTopic("many-b", partitions: Int(count))
        let partitions = allPartitions("many-a", Int(count)) + allPartitions("many-b", Int(count))
        var expected: [TopicPartition: Int64] = [:]
        var records: [OutgoingRecord] = []
        for (index, tp) in partitions.enumerated() {
            let written = index % 4
            expected[tp] = Int64(written)
            for n in 0..<written {
                records.append(OutgoingRecord(topic: tp.topic, key: bytes("k\(n)"), value: [], partition: tp.partition))
            }
        }
        let producer = try KafkaProducer(configuration: config(mock))
        _ = try await producer.send(records, timeout: .seconds(20))
        let cluster = try KafkaCluster(configuration: config(mock))
        #expect(try await cluster.endOffsets(partitions, timeout: .seconds(10)) == expected)
        #expect(
            try await cluster.beginningOffsets(partitions, timeout: .seconds(10))
                == Dictionary(uniqueKeysWithValues: partitions.map { ($0, 0) }))
    }

    /// A caller about to keep every cooperative thread busy (sealing) still gets its request sent and learns the
    /// answer when it comes: the service confirms a chunk's config this way, to write its outputs while the rest
    /// of it renders.
    @Test func endOffsetsStartedNowAreAnsweredWhileEveryCooperativeThreadIsBusy() async throws {
        let mock = try makeMock()
        try mock.createTopic("busy", partitions: 2)
        let cluster = try KafkaCluster(configuration: config(mock))
        let partitions = allPartitions("busy", 2)
        _ = try await cluster.endOffsets(partitions, timeout: .seconds(5))
        mock.setRoundTripTime(broker: 1, milliseconds: 300)
        let started = ContinuousClock.now
        let answered = Flag()
        let asked = cluster.startEndOffsets(partitions, timeout: .seconds(5)) { _ in answered.set() }
        await withTaskGroup(of: Void.self) { spinners in
            // More spinners than the cooperative pool has threads (one per core; more under the test runner).
            for _ in 0..<(4 * ProcessInfo.processInfo.activeProcessorCount) {
                spinners.addTask {
                    while !answered.isSet, ContinuousClock.now - started < .seconds(10) {}
                }
            }
        }
        #expect(answered.isSet)
        #expect(ContinuousClock.now - started < .seconds(5))
        #expect(try await asked.value() == Dictionary(uniqueKeysWithValues: partitions.map { ($0, 0) }))
    }

    @Test func beginningOffsetMovesWhenTheMockDropsOldBatches() async throws {
        let mock = try makeMock()
        try mock.createTopic("retention", partitions: 1)
        // The mock keeps at most 5 MB per partition: 12 records of 600 kB (one batch each) push the first out.
        let producer = try KafkaProducer(configuration: config(mock, ["batch.size": "1"]))
        let big = [UInt8](repeating: 7, count: 600_000)
        _ = try await producer.send(
            (0..<12).map { _ in OutgoingRecord(topic: "retention", key: nil, value: big) },
            timeout: .seconds(20))
        let cluster = try KafkaCluster(configuration: config(mock))
        let tp = TopicPartition(topic: "retention", partition: 0)
        let start = try #require(try await cluster.beginningOffsets([tp], timeout: .seconds(5))[tp])
        #expect(start > 0 && start < 12)
        #expect(try await cluster.endOffsets([tp], timeout: .seconds(5)) == [tp: 12])

        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([tp: .beginning])
        let records = try await consume(consumer, count: Int(12 - start))
        #expect(records.first?.offset == start)
        #expect(records.allSatisfy { $0.value == big })
    }

    @Test func offsetsOfMissingPartitionThrow() async throws {
        let mock = try makeMock()
        try mock.createTopic("few", partitions: 1)
        let cluster = try KafkaCluster(configuration: config(mock))
        await #expect(throws: KafkaError.self) {
            _ = try await cluster.endOffsets([TopicPartition(topic: "few", partition: 5)], timeout: .seconds(2))
        }
    }

    @Test func offsetsForTimestamp() async throws {
        let mock = try makeMock()
        try mock.createTopic("ts1", partitions: 1)
        try mock.createTopic("empty", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        // ts1[0]: timestamps base+1000, base+2000, …, base+10000 at offsets 0…9; empty[0] stays empty.
        let base: Int64 = 1_700_000_000_000
        _ = try await producer.send(
            (0..<10).map {
                OutgoingRecord(topic: "ts1", key: nil, value: bytes("\($0)"), timestampMs: base + Int64($0 + 1) * 1000)
            }, timeout: .seconds(10))

        let cluster = try KafkaCluster(configuration: config(mock))
        let p0 = TopicPartition(topic: "ts1", partition: 0)
        let empty = TopicPartition(topic: "empty", partition: 0)
        func lookup(_ ts: Int64) async throws -> [TopicPartition: Int64] {
            try await cluster.offsets(forTimestampMs: ts, [p0, empty], timeout: .seconds(10))
        }
        #expect(try await lookup(0) == [p0: 0, empty: 0])
        #expect(try await lookup(base + 1000) == [p0: 0, empty: 0]) // exact match
        #expect(try await lookup(base + 1001) == [p0: 1, empty: 0]) // between → next
        #expect(try await lookup(base + 7000) == [p0: 6, empty: 0])
        #expect(try await lookup(base + 10_000) == [p0: 9, empty: 0])
        #expect(try await lookup(base + 10_001) == [p0: 10, empty: 0]) // after all → end
    }

    @Test func offsetsForTimestampWithUnorderedTimestamps() async throws {
        let mock = try makeMock()
        try mock.createTopic("unordered", partitions: 1)
        let producer = try KafkaProducer(configuration: config(mock))
        let stamps: [Int64] = [5000, 1000, 7000, 3000]
        _ = try await producer.send(
            stamps.map { OutgoingRecord(topic: "unordered", key: nil, value: nil, timestampMs: $0) },
            timeout: .seconds(10))
        let cluster = try KafkaCluster(configuration: config(mock))
        let tp = TopicPartition(topic: "unordered", partition: 0)
        // Kafka semantics: the earliest offset whose timestamp is >= ts.
        #expect(try await cluster.offsets(forTimestampMs: 2000, [tp], timeout: .seconds(10)) == [tp: 0])
        #expect(try await cluster.offsets(forTimestampMs: 6000, [tp], timeout: .seconds(10)) == [tp: 2])
        #expect(try await cluster.offsets(forTimestampMs: 8000, [tp], timeout: .seconds(10)) == [tp: 4])
    }

    @Test func partitionCountAndAutoCreation() async throws {
        let mock = try makeMock()
        try mock.createTopic("seven", partitions: 7)
        let cluster = try KafkaCluster(configuration: config(mock))
        #expect(try await cluster.partitionCount(topic: "seven", timeout: .seconds(5)) == 7)

        // Asking about a missing topic does not create it.
        #expect(try await cluster.partitionCount(topic: "missing", timeout: .seconds(5)) == nil)
        #expect(try await cluster.partitionCount(topic: "missing", timeout: .seconds(5)) == nil)

        // Producing to it does (librdkafka producers allow auto-creation; the mock uses 4 partitions).
        let producer = try KafkaProducer(configuration: config(mock))
        let results = try await producer.send([OutgoingRecord(topic: "missing", key: nil, value: bytes("x"))], timeout: .seconds(10))
        #expect(results[0].error == nil)
        #expect(try await cluster.partitionCount(topic: "missing", timeout: .seconds(5)) == 4)
        #expect(throws: KafkaError.self) { try mock.createTopic("missing", partitions: 2) }

        // Mock quirk (librdkafka 2.0.2): it speaks Metadata <= v2, which cannot say "don't auto-create", so a
        // consumer assigned to a missing topic creates it too.
        let consumer = try KafkaConsumer(configuration: config(mock))
        try consumer.assign([TopicPartition(topic: "ghost", partition: 0): .beginning])
        _ = try await consumer.poll(maxRecords: 1, timeout: .seconds(1))
        #expect(try await cluster.partitionCount(topic: "ghost", timeout: .seconds(5)) == 4)
    }

    @Test func reachability() async throws {
        let mock = try makeMock()
        try await KafkaCluster(configuration: config(mock)).waitUntilReachable(timeout: .seconds(5))

        // Nothing listens there once the mock is closed.
        let address = mock.bootstrapServers
        mock.close()
        let unreachable = try KafkaCluster(configuration: KafkaConfiguration(bootstrapServers: address))
        let start = ContinuousClock.now
        await #expect(throws: KafkaError.self) { try await unreachable.waitUntilReachable(timeout: .seconds(1)) }
        #expect(ContinuousClock.now - start < .seconds(5))
    }

    @Test func mockRejectsUnsupportedDefaultPartitions() {
        #expect(throws: KafkaError.self) { _ = try MockKafkaCluster(defaultPartitions: 8) }
        #expect(throws: KafkaError.self) { _ = try MockKafkaCluster(brokers: 0) }
    }
}

/// The development broker answers without Nagle's delay: librdkafka 2.0.2's mock leaves it on, and a response
/// written while the client's delayed ACK for the previous one is pending then waits up to 40 ms.
@Suite struct DevelopmentBrokerSocketTests {
    @Test func listenersAndAcceptedConnectionsHaveNagleDisabled() async throws {
        let mock = try makeMock(brokers: 2)
        try mock.createTopic("nodelay", partitions: 2)
        let cluster = try KafkaCluster(configuration: config(mock))
        // Connects to both brokers: each partition's leader answers the offsets request.
        _ = try await cluster.endOffsets(allPartitions("nodelay", 2), timeout: .seconds(5))

        let sockets = RdMock.tcpSockets(boundTo: mock.mock.ports)
        #expect(mock.mock.ports.count == 2)
        // Two listeners, and at least one connection the mock accepted.
        #expect(sockets.count >= 3)
        for descriptor in sockets {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            #expect(getsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &value, &length) == 0)
            #expect(value != 0, "socket \(descriptor) of the development broker still delays small writes (Nagle)")
        }
    }
}

@Suite struct TopicAdminTests {
    /// The mock cluster names a controller that is none of its brokers and implements neither request: the answer
    /// says so (instead of an error after the whole timeout), and nothing is created.
    @Test func theDevelopmentBrokerAnswersThatItCannot() async throws {
        let mock = try makeMock()
        try mock.createTopic("present", partitions: 2)
        let cluster = try KafkaCluster(configuration: config(mock))
        let created = try await cluster.createTopics(
            [NewTopic(name: "absent", partitions: 3, replicationFactor: 1, configs: ["cleanup.policy": "compact"])], timeout: .seconds(30))
        guard case .unsupported(let reason) = created else {
            Issue.record("expected .unsupported, got \(created)")
            return
        }
        #expect(reason.contains("controller"))
        #expect(try await cluster.partitionCount(topic: "absent", timeout: .seconds(5)) == nil)
        let described = try await cluster.describeTopicConfigs(["present"], timeout: .seconds(30))
        guard case .unsupported = described else {
            Issue.record("expected .unsupported, got \(described)")
            return
        }
    }

    @Test func nothingToAskIsAnsweredWithoutAsking() async throws {
        let mock = try makeMock()
        let cluster = try KafkaCluster(configuration: config(mock))
        #expect(try await cluster.createTopics([], timeout: .seconds(5)) == .answered([:]))
        #expect(try await cluster.describeTopicConfigs([], timeout: .seconds(5)) == .answered([:]))
    }
}

private final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
