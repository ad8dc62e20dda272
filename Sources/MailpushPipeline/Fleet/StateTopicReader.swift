import MailpushKafka
import MailpushPartition

/// Reads ranges of the state topic and decodes its records: what a takeover's restore, a lease renewal, and
/// `mailpush offsets` / `mailpush replay` (`FleetView`) read. A record that does not decode, or whose event
/// partition is not the state partition it lies in, is skipped (another writer's, or damaged).
struct StateTopicReader: Sendable {
    let stateTopic: String
    let kafka: KafkaConfiguration
    let cluster: KafkaCluster
    let requestTimeout: Duration

    /// What a read found: each event partition's records in log order, and the bytes read.
    struct Found {
        var records: [Int32: [(offset: Int64, record: PartitionStateRecord)]] = [:]
        var bytes = 0
    }

    func statePartition(_ partition: Int32) -> TopicPartition { TopicPartition(topic: stateTopic, partition: partition) }

    /// The records of event partitions' state partitions in [from, to).
    func read(_ ranges: [Int32: (from: Int64, to: Int64)]) async throws -> Found {
        let wanted = ranges.filter { $0.value.from < $0.value.to }
        guard !wanted.isEmpty else { return Found() }
        let consumer = try KafkaConsumer(configuration: kafka)
        defer { consumer.close() }
        let reader = PartitionReader(consumer: consumer, cluster: cluster, requestTimeout: requestTimeout, giveUpAfter: .seconds(10))
        var starts: [TopicPartition: Int64] = [:]
        var ends: [TopicPartition: Int64] = [:]
        for (partition, range) in wanted {
            starts[statePartition(partition)] = range.from
            ends[statePartition(partition)] = range.to
        }
        var found = Found()
        try await reader.read(from: starts, to: ends) { batch in
            for record in batch {
                guard let end = ends[record.topicPartition], record.offset < end else { continue }
                found.bytes += (record.value?.count ?? 0) + (record.key?.count ?? 0)
                guard let decoded = PartitionStateRecord.decode(record.value), decoded.partition == record.partition else { continue }
                found.records[record.partition, default: []].append((record.offset, decoded))
            }
        }
        return found
    }

    /// Every record of `partitions`' state partitions, from their beginning to their end now.
    func readAll(_ partitions: [Int32]) async throws -> Found {
        let ends = try await cluster.endOffsets(partitions.map(statePartition), timeout: requestTimeout)
        return try await read(
            Dictionary(uniqueKeysWithValues: partitions.map { ($0, (from: Int64(0), to: ends[statePartition($0)] ?? 0)) }))
    }
}
