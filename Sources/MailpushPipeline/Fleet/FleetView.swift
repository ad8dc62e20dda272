import MailpushKafka
import MailpushPartition

/// A fleet's partitions as the state topic tells them: where each one stands and who owns it
/// (`mailpush offsets`). Reads the state topic from its beginning; nothing is written.
public struct FleetPartition: Sendable, Hashable {
    public var partition: Int32
    /// The next offset the owner's last committed state records; nil when no instance ever processed it.
    public var offset: Int64?
    /// Instance id (the state directory's identity) and host name of the owner, nil when none yet.
    public var owner: String?
    public var host: String?
    public var epoch: Int64
    /// The owner released it (a graceful handover or stop) and nobody claimed it since.
    public var released: Bool
    public var dedupeEntries: Int
    /// `mailpush offsets --set` asked the fleet to continue at `offset`; the partition's next claim takes it up.
    public var moving: Bool
    /// A newer mailpush claimed the partition after this version's last claim, with records of this format version,
    /// which this one cannot read: it is that owner's now (`owner` and `host` are its), and `offset` is stale.
    public var newerFormat: Int?
}

public enum FleetView {
    /// Each partition's state from the last `tail` records of its state partition: a checkpoint every 30 s while the
    /// partition changes, and a claim or release at each handover, stand for everything before them. Under load a
    /// partition gets about one batch record a second, each of a few KB (a mark per output partition), so 256 hold
    /// several minutes and several checkpoints: some 60 MB over 64 partitions, where 4,096 were a gigabyte for one
    /// look. A partition whose last records name no owner is read from the beginning.
    public static func read(
        kafka: KafkaConfiguration, eventsTopic: String, stateTopic: String, timeout: Duration, tail: Int64 = 256
    ) async throws -> [FleetPartition] {
        let cluster = try KafkaCluster(configuration: kafka)
        guard let events = try await cluster.partitionCount(topic: eventsTopic, timeout: timeout),
            let states = try await cluster.partitionCount(topic: stateTopic, timeout: timeout)
        else { return [] }
        let partitions = Array(0..<Int32(min(events, states)))
        var folds = try await fold(
            kafka: kafka, cluster: cluster, eventsTopic: eventsTopic, stateTopic: stateTopic, partitions: partitions,
            timeout: timeout, tail: tail)
        let ownerless = partitions.filter { folds[$0].map { $0.restore.epoch < 0 && $0.newer == nil } ?? true }
        if !ownerless.isEmpty {
            folds.merge(
                try await fold(
                    kafka: kafka, cluster: cluster, eventsTopic: eventsTopic, stateTopic: stateTopic, partitions: ownerless,
                    timeout: timeout)
            ) { _, whole in whole }
        }
        return (0..<Int32(events)).map { partition in
            var fold = folds[partition]?.restore ?? PartitionRestore()
            let moving = fold.pendingPosition != nil
            fold.takeUpPosition()
            if let newer = folds[partition]?.newer {
                return FleetPartition(
                    partition: partition, offset: fold.offset, owner: newer.owner ?? "(unnamed)", host: newer.host,
                    epoch: newer.epoch ?? -1, released: false, dedupeEntries: fold.emails.count, moving: false, newerFormat: newer.v)
            }
            return FleetPartition(
                partition: partition, offset: fold.offset, owner: fold.owner, host: fold.host, epoch: fold.epoch,
                released: fold.released, dedupeEntries: fold.emails.count, moving: moving)
        }
    }
}

/// One partition's part of a fleet replay, as its owners reported it in the state topic.
public struct FleetReplayPart: Sendable, Hashable {
    public var partition: Int32
    public var from: Int64
    public var end: Int64
    public var next: Int64
    public var events: Int
    public var jobs: Int
    public var deadLetters: Int
    public var duplicates: Int
    public var isDone: Bool { next >= end }
}

extension FleetView {
    /// Whether a fleet runs on `eventsTopic`: some partition has an owner in the state topic. The last records of
    /// each state partition answer it without reading the topic from its beginning (a week of batch records on a
    /// loaded cluster); only when none of them is an owner's is the whole topic read.
    public static func isFleet(kafka: KafkaConfiguration, eventsTopic: String, stateTopic: String, timeout: Duration) async throws -> Bool {
        let cluster = try KafkaCluster(configuration: kafka)
        guard let events = try await cluster.partitionCount(topic: eventsTopic, timeout: timeout),
            let states = try await cluster.partitionCount(topic: stateTopic, timeout: timeout)
        else { return false }
        let tails = try await fold(
            kafka: kafka, cluster: cluster, eventsTopic: eventsTopic, stateTopic: stateTopic,
            partitions: Array(0..<Int32(min(events, states))), timeout: timeout, tail: 16)
        if tails.values.contains(where: { $0.restore.owner != nil || $0.newer != nil }) { return true }
        return try await read(kafka: kafka, eventsTopic: eventsTopic, stateTopic: stateTopic, timeout: timeout).contains { $0.owner != nil }
    }

    /// Asks the fleet to replay `ranges` (partition → [from, to)): one replay record per partition, which the
    /// partition's owner, now or later, executes and reports on. Returns where each record landed: its progress
    /// comes after it (`replayProgress`).
    public static func requestReplay(
        kafka: KafkaConfiguration, eventsTopic: String, stateTopic: String, replayId: String,
        ranges: [(partition: Int32, from: Int64, to: Int64)], force: Bool, timeout: Duration
    ) async throws -> [Int32: Int64] {
        let producer = try KafkaProducer(configuration: kafka)
        let records = ranges.map { range in
            PartitionStateRecord(
                kind: .replay, topic: eventsTopic, partition: range.partition, epoch: -1, owner: "replay", from: range.from,
                offset: range.to, marks: [:], replayId: replayId, force: force)
        }
        let results = try await producer.send(
            records.map { OutgoingRecord(topic: stateTopic, key: Array($0.key.utf8), value: $0.encoded(), partition: $0.partition) },
            timeout: timeout)
        if let error = results.compactMap(\.error).first { throw error }
        return Dictionary(uniqueKeysWithValues: zip(records.map(\.partition), results.map(\.offset)))
    }

    /// Asks the fleet to continue event partitions at the given offsets (`mailpush offsets --set`): one position
    /// record per partition, which the partition's owner takes up within a lease renewal, or its next owner when
    /// it claims it. Marks: the output topics' ends now, where the read-back of the moved partitions starts.
    /// Returns where each request landed in its state partition (`positionsTakenUp`).
    @discardableResult
    public static func requestPositions(
        kafka: KafkaConfiguration, topics: Topics, offsets: [Int32: Int64], requestedBy: String, host: String, timeout: Duration
    ) async throws -> [Int32: Int64] {
        let cluster = try KafkaCluster(configuration: kafka)
        let ends = try await cluster.endOffsets(try await topics.outputPartitions(in: cluster, timeout: timeout), timeout: timeout)
        let records = offsets.sorted { $0.key < $1.key }.map { partition, offset in
            PartitionStateRecord.position(
                topic: topics.events, partition: partition, requestedBy: requestedBy, host: host, offset: offset, marks: ends)
        }
        let producer = try KafkaProducer(configuration: kafka)
        let results = try await producer.send(
            records.map { OutgoingRecord(topic: topics.state, key: Array($0.key.utf8), value: $0.encoded(), partition: $0.partition) },
            timeout: timeout)
        if let error = results.compactMap(\.error).first { throw error }
        return Dictionary(uniqueKeysWithValues: zip(records.map(\.partition), results.map(\.offset)))
    }

    /// Which of the position requests that landed at `landed` (`requestPositions`) a claim has taken up: only the
    /// state partitions' records after them are read, not the topic from its beginning. A claim restored before the
    /// request landed raced it, and does not count.
    public static func positionsTakenUp(
        kafka: KafkaConfiguration, stateTopic: String, eventsTopic: String, landed: [Int32: Int64], timeout: Duration
    ) async throws -> Set<Int32> {
        let cluster = try KafkaCluster(configuration: kafka)
        let reader = StateTopicReader(stateTopic: stateTopic, kafka: kafka, cluster: cluster, requestTimeout: timeout)
        let found = try await reader.readToEnd(landed.keys) { partition, _ in landed[partition]! + 1 }
        return Set(
            found.records.filter { partition, records in
                records.contains { $0.record.topic == eventsTopic && $0.record.hasTakenUpPosition(at: landed[partition]!) }
            }.keys)
    }

    /// The progress of fleet replay `replayId`, per partition: its records from where its request landed
    /// (`requestReplay`) on, not the state topic from its beginning.
    public static func replayProgress(
        kafka: KafkaConfiguration, eventsTopic: String, stateTopic: String, replayId: String, requested: [Int32: Int64],
        timeout: Duration
    ) async throws -> [FleetReplayPart] {
        let cluster = try KafkaCluster(configuration: kafka)
        let reader = StateTopicReader(stateTopic: stateTopic, kafka: kafka, cluster: cluster, requestTimeout: timeout)
        var folds: [Int32: PartitionRestore] = [:]
        for (partition, records) in try await reader.readToEnd(requested.keys, from: { partition, _ in requested[partition]! }).records {
            for (_, record) in records where record.topic == eventsTopic && record.replayId == replayId {
                folds[partition, default: PartitionRestore()].apply(record)
            }
        }
        let partitions = requested.keys.sorted()
        return partitions.compactMap { partition in
            guard let replay = folds[partition]?.replays[replayId] else { return nil }
            return FleetReplayPart(
                partition: partition, from: replay.from, end: replay.end, next: replay.next, events: replay.counts.events,
                jobs: replay.counts.jobs, deadLetters: replay.counts.deadLetters, duplicates: replay.counts.duplicates)
        }
    }

    /// One partition's records folded, and the newest owner's record of a newer format after this version's last
    /// claim, if any.
    private struct Folded {
        var restore = PartitionRestore()
        var newer: NewerStateRecord?
    }

    /// Reads `partitions` of the state topic, from their beginning or their last `tail` records, and folds each
    /// one's records in log order.
    private static func fold(
        kafka: KafkaConfiguration, cluster: KafkaCluster, eventsTopic: String, stateTopic: String, partitions: [Int32],
        timeout: Duration, tail: Int64? = nil
    ) async throws -> [Int32: Folded] {
        let reader = StateTopicReader(stateTopic: stateTopic, kafka: kafka, cluster: cluster, requestTimeout: timeout)
        let found = try await reader.readToEnd(partitions, from: { _, end in tail.map { max(0, end - $0) } ?? 0 })
        var folds: [Int32: Folded] = [:]
        for (partition, records) in found.records {
            for (offset, record) in records where record.topic == eventsTopic {
                folds[partition, default: Folded()].restore.apply(record, at: offset)
            }
        }
        for partition in found.newer.keys {
            if let newer = found.newerOwner(of: partition) { folds[partition, default: Folded()].newer = newer }
        }
        return folds
    }
}
