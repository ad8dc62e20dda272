import MailpushKafka
import MailpushState

/// Where a replay request stands while it is being executed: what is left to read per partition.
struct ReplayProgressTracker: Sendable {
    private(set) var request: ReplayRequest
    /// Per partition, the offset to stop before, for the partitions not finished yet.
    private(set) var ends: [Int32: Int64]

    init(_ request: ReplayRequest) {
        self.request = request
        ends = Dictionary(uniqueKeysWithValues: request.remaining.map { ($0.partition, $0.end) })
    }

    var isFinished: Bool { ends.isEmpty }

    /// Where reading starts: each unfinished partition's cursor.
    var starts: [Int32: Int64] {
        Dictionary(uniqueKeysWithValues: request.remaining.filter { ends[$0.partition] != nil }.map { ($0.partition, $0.next) })
    }

    /// Keeps the records inside the request's ranges (a poll may return more).
    func inRange(_ records: [KafkaRecord]) -> [KafkaRecord] {
        records.filter { record in
            guard record.topic == request.eventsTopic, let end = ends[record.partition] else { return false }
            let start = request.cursors.first { $0.partition == record.partition }?.next ?? 0
            return record.offset >= start && record.offset < end
        }
    }

    /// The cursors `records` (in range, all processed) move to.
    func cursors(after records: [KafkaRecord]) -> [Int32: Int64] {
        var cursors: [Int32: Int64] = [:]
        for record in records { cursors[record.partition] = max(cursors[record.partition] ?? 0, record.offset + 1) }
        return cursors
    }

    /// Records a committed replay batch.
    mutating func advance(to cursors: [Int32: Int64], counts: ReplayRequest.Counts) {
        for (partition, next) in cursors {
            if let index = request.cursors.firstIndex(where: { $0.partition == partition }) {
                request.cursors[index].next = max(request.cursors[index].next, next)
            }
            if let end = ends[partition], next >= end { ends[partition] = nil }
        }
        request.counts += counts
    }

    /// Gives up on partitions whose remaining records no longer exist (retention), so the request can end.
    mutating func abandon(partitions: [Int32]) {
        for partition in partitions { ends[partition] = nil }
    }

    /// The source ranges of this request still to replay, for the read-back to collect outputs of an
    /// interrupted replay batch.
    static func unsettledSources(of requests: [ReplayRequest], tag: (ReplayRequest) -> String) -> [SourceRange] {
        requests.flatMap { request in
            let tag = tag(request)
            return request.remaining.map {
                SourceRange(topic: request.eventsTopic, partition: $0.partition, offsets: $0.next..<$0.end, tag: tag)
            }
        }
    }
}

/// A range of source offsets of one event partition.
struct SourceRange: Sendable, Hashable {
    var topic: String
    var partition: Int32
    var offsets: Range<Int64>
    /// The replay's `mailpush-replay` header value: only outputs carrying it are that replay's.
    var tag: String
}

/// What a replay would do, counted without writing anything (`replay --dry-run`).
public struct ReplayDryRunSummary: Sendable, CustomStringConvertible {
    public var events = 0
    public var jobsByPlatform: [String: Int] = [:]
    public var filtered = 0
    public var deadLetters = 0
    public var skipped = 0

    public var jobs: Int { jobsByPlatform.values.reduce(0, +) }

    public var description: String {
        let platforms = jobsByPlatform.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", ")
        return "\(events) events: \(jobs) jobs (\(platforms.isEmpty ? "none" : platforms)), \(filtered) notifications filtered, "
            + "\(deadLetters) dead letters, \(skipped) skipped as already processed"
    }

    mutating func add(_ batch: ProcessedBatch, events: Int) {
        self.events += events
        filtered += batch.filteredNotifications
        skipped += batch.duplicates
        for output in batch.outputs {
            switch output.kind {
            case .job(_, let platform): jobsByPlatform[platform, default: 0] += 1
            case .deadLetter: deadLetters += 1
            }
        }
    }
}

extension ReplayRequest.Counts {
    /// What one replay batch of `events` records did.
    init(_ batch: ProcessedBatch, events: Int) {
        self.init()
        eventsRead = events
        duplicates = batch.duplicates
        for output in batch.outputs {
            if case .job = output.kind { jobs += 1 } else { deadLetters += 1 }
        }
    }
}
