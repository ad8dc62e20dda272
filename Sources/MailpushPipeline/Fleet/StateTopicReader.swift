import Logging
import MailpushKafka
import MailpushPartition
import Synchronization

/// Reads ranges of the state topic and decodes its records: what a takeover's restore, a lease renewal, and
/// `mailpush offsets` / `mailpush replay` (`FleetView`) read. A record that does not decode, or whose event
/// partition is not the state partition it lies in, is skipped (another writer's, or damaged) and logged with the
/// reason; one of a newer format version is kept apart (`Found.newer`).
struct StateTopicReader: Sendable {
    let stateTopic: String
    let kafka: KafkaConfiguration
    let cluster: KafkaCluster
    let requestTimeout: Duration
    /// Where skipped records are reported (nil: not reported, for the commands that show the fleet).
    var logger: Logger? = nil

    /// What a read found: each event partition's records in log order, and the bytes read.
    struct Found {
        var records: [Int32: [(offset: Int64, record: PartitionStateRecord)]] = [:]
        /// Records of a newer format version, which this version cannot follow.
        var newer: [Int32: [(offset: Int64, record: NewerStateRecord)]] = [:]
        var bytes = 0

        /// The owner's record of the highest epoch a newer version wrote in `partition`'s range after this version's
        /// last claim there: a claim since took the partition back, and such records can stay in the compacted topic
        /// long after a rollback. A request's record (epoch -1, e.g. a replay's) is no owner's.
        func newerOwner(of partition: Int32) -> NewerStateRecord? {
            let lastClaim = records[partition]?.last { $0.record.kind == .claim }?.offset ?? -1
            return newer[partition]?.filter { $0.offset > lastClaim && ($0.record.epoch ?? 0) >= 0 }.map(\.record)
                .max { ($0.epoch ?? -1) < ($1.epoch ?? -1) }
        }
    }

    func statePartition(_ partition: Int32) -> TopicPartition { TopicPartition(topic: stateTopic, partition: partition) }

    /// The records of event partitions' state partitions in [from, to): read by `kept`'s consumer when it is free (a
    /// lease renewal's read, about once a second under load), else by a consumer of their own.
    func read(_ ranges: [Int32: (from: Int64, to: Int64)], through kept: KeptStateConsumer? = nil) async throws -> Found {
        let wanted = ranges.filter { $0.value.from < $0.value.to }
        guard !wanted.isEmpty else { return Found() }
        guard let kept else {
            let consumer = try KafkaConsumer(configuration: kafka)
            defer { consumer.close() }
            return try await read(wanted, using: consumer)
        }
        let partitions = wanted.keys.map(statePartition)
        let consumer = try await kept.take(for: partitions)
        do {
            let found = try await read(wanted, using: consumer)
            await kept.giveBack(consumer, readFrom: partitions)
            return found
        } catch {
            // Left in the middle of a read: where it stands is unknown, so it is not used again.
            kept.discard(consumer)
            throw error
        }
    }

    private func read(_ wanted: [Int32: (from: Int64, to: Int64)], using consumer: KafkaConsumer) async throws -> Found {
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
                // Only the range asked for: a record outside it was judged by an earlier read, or is the next one's.
                guard let end = ends[record.topicPartition], record.offset < end, record.offset >= starts[record.topicPartition] ?? 0
                else { continue }
                found.bytes += (record.value?.count ?? 0) + (record.key?.count ?? 0)
                if let decoded = PartitionStateRecord.decode(record.value) {
                    guard decoded.partition == record.partition else {
                        skipped(record, "it names event partition \(decoded.partition)")
                        continue
                    }
                    found.records[record.partition, default: []].append((record.offset, decoded))
                } else if let newer = NewerStateRecord.decode(record.value) {
                    guard newer.partition == record.partition else {
                        skipped(record, "it names event partition \(newer.partition)")
                        continue
                    }
                    found.newer[record.partition, default: []].append((record.offset, newer))
                } else if let value = record.value {
                    skipped(record, PartitionStateRecord.whyUnreadable(value))
                }
            }
        }
        return found
    }

    private func skipped(_ record: KafkaRecord, _ why: String) {
        logger?.warning(
            "skipped a state-topic record no instance of this version wrote",
            metadata: ["record": "\(record.topic)/\(record.partition)/\(record.offset)", "why": "\(why)"])
    }

    /// The records of `partitions`' state partitions from `start` (given each one's end now) to that end.
    func readToEnd(_ partitions: some Collection<Int32>, from start: (_ partition: Int32, _ end: Int64) -> Int64) async throws -> Found {
        let ends = try await cluster.endOffsets(partitions.map(statePartition), timeout: requestTimeout)
        var ranges: [Int32: (from: Int64, to: Int64)] = [:]
        for partition in partitions {
            let end = ends[statePartition(partition)] ?? 0
            ranges[partition] = (start(partition, end), end)
        }
        return try await read(ranges)
    }
}

/// One state-topic consumer kept from one lease renewal's read to the next.
///
/// Why: a renewal reads whenever the state partitions hold records it has not seen, about once a second under a
/// steady load. A consumer of its own each time is a new Kafka client each time: new connections to the bootstrap
/// broker and the partitions' leaders (with TLS and SASL, a handshake each), a metadata request, its threads. The
/// kept one stays connected; between reads it is assigned nothing, so it fetches nothing.
///
/// One read at a time uses it: a read that finds it taken (a takeover's look beside the renewals) gets a consumer
/// of its own.
///
/// librdkafka 2.0.2 aborts the process when one partition's fetcher is stopped twice (`KafkaConsumer.reassign`).
/// A read assigns from no partitions, which stops nothing. Unassigning after it stops what the read started; it
/// could stop a partition twice only if that partition had not started since the stop before it, but librdkafka
/// starts an assignment's partitions only once every earlier stop is confirmed, so one record read proves it. A
/// read that took no record unassigns as `reassign` does, waiting if the last stop was recent.
final class KeptStateConsumer: Sendable {
    private let kafka: KafkaConfiguration
    private let slot = Mutex<(consumer: KafkaConsumer?, closed: Bool)>((nil, false))
    private let made = Atomic<Int>(0)

    /// A fetch the broker holds at a partition's end (up to `fetch.wait.max.ms`, 500 ms by default) holds the next
    /// read's first fetch behind it on the same connection: a kept consumer waits briefly, unless set with `-X`.
    static let fetchWait = ["fetch.wait.max.ms": "10"]

    init(kafka: KafkaConfiguration) { self.kafka = kafka.withDefaults(Self.fetchWait) }

    /// Consumers made so far, the kept one included.
    var consumersMade: Int { made.load(ordering: .relaxed) }

    /// The kept consumer if it is free, else a new one.
    ///
    /// A position the kept one still holds in `partitions` would mean librdkafka has not yet confirmed the last
    /// read's stop (it clears the position then): a read at once could take that position for its own and count
    /// records as read that were not. Such a stop is waited for, for up to `KafkaConsumer.assignSpacing`; a
    /// consumer still not stopped by then is let go, and a new one reads.
    func take(for partitions: [TopicPartition]) async throws(KafkaError) -> KafkaConsumer {
        let kept = slot.withLock { slot in
            defer { slot.consumer = nil }
            return slot.consumer
        }
        if let kept {
            let deadline = ContinuousClock.now + KafkaConsumer.assignSpacing
            while !kept.positions(partitions).isEmpty, ContinuousClock.now < deadline {
                do { try await Task.sleep(for: .milliseconds(5)) } catch { break }
            }
            if kept.positions(partitions).isEmpty { return kept }
            discard(kept)
        }
        made.add(1, ordering: .relaxed)
        return try KafkaConsumer(configuration: kafka)
    }

    /// Takes `consumer` back after a whole read of `partitions`: unassigned (it stops fetching), and kept unless
    /// one is kept already or `close` was called.
    func giveBack(_ consumer: KafkaConsumer, readFrom partitions: [TopicPartition]) async {
        do {
            if consumer.positions(partitions).isEmpty {
                try await consumer.reassign([:])
            } else {
                try consumer.assign([:])
            }
        } catch {
            discard(consumer)
            return
        }
        let kept = slot.withLock { slot in
            guard slot.consumer == nil, !slot.closed else { return false }
            slot.consumer = consumer
            return true
        }
        if !kept { consumer.close() }
    }

    /// Closes a consumer not kept, whatever its state: through an unassignment spaced as `reassign` spaces it (a
    /// close unassigns too), in a task of its own that a cancelled reader does not cut short.
    func discard(_ consumer: KafkaConsumer) {
        Task.detached {
            try? await consumer.reassign([:])
            consumer.close()
        }
    }

    /// Closes the kept consumer; later reads get their own.
    func close() {
        let kept = slot.withLock { slot in
            slot.closed = true
            defer { slot.consumer = nil }
            return slot.consumer
        }
        kept?.close()
    }
}
