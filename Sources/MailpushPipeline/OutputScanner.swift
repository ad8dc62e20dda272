import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

/// Reads back what the output topics already hold, to tell which outputs of an unfinished batch
/// reached Kafka before a crash or a failed delivery.
struct OutputScanner: Sendable {
    var kafka: KafkaConfiguration
    var cluster: KafkaCluster
    var requestTimeout: Duration
    /// Told how far a read-back got: on a long history it keeps liveness beating and says so in the log.
    var progress: ProgressReporter?

    struct Scan: Sendable {
        var found: Set<OutputIdentity> = []
        /// Outputs whose source lies in the remaining range of a pending replay (an interrupted replay batch).
        var replayFound: Set<OutputIdentity> = []
        /// Per event partition, the highest source offset in `found` (the recovery horizon).
        var horizon: [TopicPartition: Int64] = [:]
        /// Where each scanned output partition ended.
        var ends: [TopicPartition: Int64] = [:]
        /// Output records read.
        var recordsRead: Int64 = 0
    }

    /// Reads each output partition from its mark to its current end, keeping the outputs whose source is
    /// one of `eventsTopic`'s owned partitions at or after the committed offset in `committed`, and those whose
    /// source lies in one of `replays` (what pending replays have not committed yet). `floors`: per event
    /// partition, where in each output partition its outputs may lie (earlier ones are not its batches').
    func scan(
        from marks: [TopicPartition: Int64], outputPartitions: [TopicPartition], eventsTopic: String,
        committed: [TopicPartition: Int64], owned: (Int32) -> Bool, replays: [SourceRange] = [],
        floors: [Int32: [TopicPartition: Int64]] = [:]
    ) async throws -> Scan {
        var scan = Scan()
        let ends = try await cluster.endOffsets(outputPartitions, timeout: requestTimeout)
        var starts: [TopicPartition: Int64] = [:]
        for partition in outputPartitions {
            let key = partition
            scan.ends[key] = ends[partition] ?? 0
            starts[partition] = marks[key] ?? 0
        }
        guard starts.contains(where: { $0.value < ends[$0.key] ?? 0 }) else { return scan }
        let consumer = try KafkaConsumer(configuration: kafka)
        defer { consumer.close() }
        let reader = PartitionReader(consumer: consumer, cluster: cluster, requestTimeout: requestTimeout, giveUpAfter: .seconds(10))
        let total = starts.reduce(Int64(0)) { sum, start in sum + max(0, (ends[start.key] ?? 0) - start.value) }
        var read: Int64 = 0
        progress?.start(total: total)
        do {
            try await reader.read(from: starts, to: ends) { records in
                read += Int64(records.count)
                progress?.report(read: min(read, total), of: total)
                for record in records {
                    guard let source = record.headers.first(where: { $0.key == Header.source })?.value,
                        let sourceText = String(validating: source, as: UTF8.self),
                        let parsed = Self.parseSource(sourceText)
                    else { continue }
                    let eventPartition = TopicPartition(topic: parsed.topic, partition: parsed.partition)
                    let unfinishedBatch =
                        parsed.topic == eventsTopic && owned(parsed.partition)
                        && parsed.offset >= committed[eventPartition] ?? 0
                        && record.offset >= floors[parsed.partition]?[record.topicPartition] ?? 0
                    let replayTag = record.headers.first(where: { $0.key == Header.replay })?.value
                    let unfinishedReplay =
                        replayTag != nil
                        && replays.contains {
                            $0.topic == parsed.topic && $0.partition == parsed.partition && $0.offsets.contains(parsed.offset)
                                && replayTag == Array($0.tag.utf8)
                        }
                    guard unfinishedBatch || unfinishedReplay else { continue }
                    let jobId = record.headers.first(where: { $0.key == Header.jobId })?.value.flatMap {
                        String(validating: $0, as: UTF8.self)
                    }
                    let identity = OutputIdentity(topic: record.topic, source: sourceText, jobId: jobId)
                    if unfinishedBatch {
                        scan.found.insert(identity)
                        scan.horizon[eventPartition] = max(scan.horizon[eventPartition] ?? -1, parsed.offset)
                    } else {
                        scan.replayFound.insert(identity)
                    }
                }
            }
        } catch let stalled as PartitionReader.Stalled {
            let names = stalled.partitions.map { "\($0.topic)/\($0.partition)" }.joined(separator: ", ")
            throw PipelineError.recoveryStalled("recovery could not read output partitions \(names) to their end")
        }
        progress?.finish(read: read)
        scan.recordsRead = read
        return scan
    }

    /// Parses `topic/partition/offset`; the topic itself may contain `/`.
    static func parseSource(_ text: String) -> (topic: String, partition: Int32, offset: Int64)? {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count >= 3, let offset = Int64(parts[parts.count - 1]), let partition = Int32(parts[parts.count - 2]) else {
            return nil
        }
        return (parts[..<(parts.count - 2)].joined(separator: "/"), partition, offset)
    }
}
