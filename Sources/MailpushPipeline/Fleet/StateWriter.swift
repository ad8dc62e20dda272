import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import Synchronization

/// Writes this instance's records to the state topic: claims, batch records, releases, checkpoints, replay
/// progress and tombstones. Every write is told to `leases` (what is in flight, where our records landed), so
/// that a renewal knows which records of the state partition are ours.
final class StateWriter: Sendable {
    let stateTopic: String
    let instanceId: String
    /// The leases on the partitions this instance claimed, and the fence.
    let leases: PartitionLeases
    private let producer: KafkaProducer
    private let deliveryTimeout: Duration
    /// Per partition and fleet replay, the key of the last progress record this owner wrote, and when its dedupe
    /// entries were processed (0: none).
    private let progress = Mutex<[String: (key: String, entriesAtMs: Int64)]>([:])

    init(
        stateTopic: String, instanceId: String, producer: KafkaProducer, cluster: KafkaCluster, readerKafka: KafkaConfiguration,
        requestTimeout: Duration, deliveryTimeout: Duration, messageTimeout: Duration, leaseDuration: Duration,
        leaseWaited: @escaping @Sendable (Duration) -> Void = { _ in }, logger: Logger? = nil
    ) {
        self.stateTopic = stateTopic
        self.instanceId = instanceId
        self.producer = producer
        self.deliveryTimeout = deliveryTimeout
        leases = PartitionLeases(
            instanceId: instanceId,
            reader: StateTopicReader(
                stateTopic: stateTopic, kafka: readerKafka, cluster: cluster, requestTimeout: requestTimeout, logger: logger),
            messageTimeout: messageTimeout, leaseDuration: leaseDuration, leaseWaited: leaseWaited)
    }

    func statePartition(_ partition: Int32) -> TopicPartition { leases.statePartition(partition) }

    /// Remembers the last progress record of a fleet replay on `partition`; returns the one before.
    func replaceLastProgress(partition: Int32, replayId: String, with record: (key: String, entriesAtMs: Int64)) -> (
        key: String, entriesAtMs: Int64
    )? {
        progress.withLock { lastProgress in
            let slot = "\(partition)/\(replayId)"
            defer { lastProgress[slot] = record }
            return lastProgress[slot]
        }
    }

    // MARK: Writing

    /// Writes `records` (all of owned partitions) and waits for their acknowledgements. Throws if one failed;
    /// writing the same records again is harmless (a repeated record changes nothing in a restore).
    func publish(_ records: [PartitionStateRecord]) async throws {
        try await publish(records.map { ($0, nil) })
    }

    /// `publish`, each record with its marks as `PartitionStateRecord.encodeMarksJSON` writes them when known (a
    /// batch's commit encoded them once for all its records).
    func publish(_ records: [(record: PartitionStateRecord, marksJSON: [UInt8]?)]) async throws {
        guard !records.isEmpty else { return }
        let partitions = records.map(\.record.partition)
        leases.beganWriting(partitions)
        defer { leases.endedWriting(partitions) }
        // Records of one batch carry the same marks (every output partition): encoded once, not once per record.
        var encodedMarks: [[String: Int64]: [UInt8]] = [:]
        let outgoing = records.map { record, known in
            let marks: [UInt8]
            if let known {
                marks = known
            } else if let encoded = encodedMarks[record.marks] {
                marks = encoded
            } else {
                marks = PartitionStateRecord.encodeMarksJSON(record.marks)
                encodedMarks[record.marks] = marks
            }
            return OutgoingRecord(
                topic: stateTopic, key: Array(record.key.utf8), value: record.encoded(marksJSON: marks), partition: record.partition)
        }
        let results = try await producer.send(outgoing, timeout: deliveryTimeout)
        if let failed = results.first(where: { $0.error != nil }), let error = failed.error { throw error }
        leases.wrote(zip(records, results).map { ($0.record.partition, $1.offset) })
    }

    /// Deletes records (tombstones, for compaction) of owned partitions' state partitions.
    func publishTombstones(_ keys: [(partition: Int32, key: String)]) async throws {
        guard !keys.isEmpty else { return }
        leases.beganWriting(keys.map(\.partition))
        defer { leases.endedWriting(keys.map(\.partition)) }
        let results = try await producer.send(
            keys.map { OutgoingRecord(topic: stateTopic, key: Array($0.key.utf8), value: nil, partition: $0.partition) },
            timeout: deliveryTimeout)
        if let error = results.compactMap(\.error).first { throw error }
        leases.wrote(zip(keys, results).map { ($0.partition, $1.offset) })
    }

    /// Writes claims (one per event partition) in one send and returns the offset each landed at, in order: a
    /// claim's offset starts our knowledge of its partition. Throws if one failed (the others may have landed:
    /// claims of ours that nothing adopted, which a retried takeover restores and claims past).
    func publishClaims(_ records: [PartitionStateRecord]) async throws -> [Int64] {
        let outgoing = records.map { record in
            OutgoingRecord(topic: stateTopic, key: Array(record.key.utf8), value: record.encoded(), partition: record.partition)
        }
        let results = try await producer.send(outgoing, timeout: deliveryTimeout)
        if let error = results.compactMap(\.error).first { throw error }
        return results.map(\.offset)
    }
}
