import MailpushPartition

/// Folds a partition's state records, in log order, into the state a new owner continues from.
struct PartitionRestore: Sendable {
    /// The epoch whose owner's records are being followed; -1 before any.
    private(set) var epoch: Int64 = -1
    private(set) var owner: String?
    private(set) var host: String?
    private(set) var offset: Int64?
    private(set) var marks: [TopicPartition: Int64] = [:]
    /// Every email a record says was processed (its outputs all written), whoever wrote it.
    private(set) var emails: [String: Int64] = [:]
    /// The followed owner's last record was a release: nothing of it can still be in flight.
    private(set) var released = false
    /// A batch record of the followed epoch was missing (one that never landed): later ones are not followed,
    /// their events are read again from `offset` (their outputs are found by the read-back).
    private(set) var broken = false
    private(set) var records = 0
    /// Batch records seen, by key: when their dedupe entries were processed (0: none) and the offset they reach.
    /// The new owner deletes each once its entries expired and a checkpoint of its own covers it.
    private(set) var batchRecords: [String: (processedAtMs: Int64, offset: Int64)] = [:]

    struct KeyAt: Sendable {
        var key: String
        /// When it was written.
        var atMs: Int64
        /// When its dedupe entries were processed; 0 without any.
        var entriesAtMs: Int64
    }
    /// The last `position` request (`mailpush offsets --set`) no claim has taken up (one restored past it): the claim
    /// that follows this restore takes it up (`takeUpPosition`).
    private(set) var pendingPosition: PartitionStateRecord?
    /// Where `pendingPosition` landed in the state partition, when the records' offsets were given.
    private var pendingPositionAt: Int64?
    /// The position request taken up: the partition continues at its offset.
    private(set) var position: PartitionStateRecord?

    /// Progress records of replays whose request was deleted (finished ones).
    private(set) var orphanProgress: [KeyAt] = []

    private func entriesAt(_ record: PartitionStateRecord) -> Int64 {
        (record.emails ?? []).isEmpty ? 0 : record.processedAtMs ?? 0
    }

    /// Replays requested for this partition (by `mailpush replay` in a fleet), by id.
    private(set) var replays: [String: FleetReplay] = [:]

    struct FleetReplay: Sendable, Equatable {
        var id: String
        var from: Int64
        var end: Int64
        var force: Bool
        /// How far an owner has replayed, and what was read and written from `from` up to there.
        var next: Int64
        var counts = PartitionStateRecord.ReplayCounts()

        static func == (a: FleetReplay, b: FleetReplay) -> Bool {
            a.id == b.id && a.from == b.from && a.end == b.end && a.force == b.force && a.next == b.next && a.counts == b.counts
        }
        var isDone: Bool { next >= end }
        /// Keys of its progress records by epoch, in log order, with when each was written.
        var progressKeys: [Int64: [KeyAt]] = [:]
        var requestKey: String
    }

    /// The records are the partition's from the beginning of its state partition (not those after what a local
    /// state already reflects).
    private let readFromStart: Bool

    init() { readFromStart = true }

    /// Starts from what this instance's local state says it last had (a partition coming back to it).
    init(epoch: Int64, owner: String, offset: Int64, marks: [TopicPartition: Int64]) {
        readFromStart = false
        self.epoch = epoch
        self.owner = owner
        self.offset = offset
        self.marks = marks
    }

    /// `logOffset`: where the record lies in its state partition; nil when the reader does not say (a claim then
    /// takes any request before it up).
    mutating func apply(_ record: PartitionStateRecord, at logOffset: Int64? = nil) {
        records += 1
        if let emails = record.emails, let at = record.processedAtMs {
            for email in emails { self.emails[email] = max(self.emails[email] ?? .min, at) }
        }
        switch record.kind {
        case .replay:
            if let id = record.replayId, replays[id] == nil, let from = record.from {
                replays[id] = FleetReplay(
                    id: id, from: from, end: record.offset, force: record.force ?? false, next: from, requestKey: record.key)
            }
            return
        case .replayProgress:
            guard let id = record.replayId, replays[id] != nil else {
                // Read from the start, its request was deleted (a request lies before its progress): only its
                // entries count.
                if readFromStart {
                    orphanProgress.append(KeyAt(key: record.key, atMs: record.processedAtMs ?? 0, entriesAtMs: entriesAt(record)))
                }
                return
            }
            if var replay = replays[id] {
                // A progress record counts the part from its start, whoever read the events before: an owner continues
                // from the counts of the progress it restored. So the furthest record's counts are the part's, and a
                // stretch two owners both replayed (the previous one's progress landed after the next one restored) is
                // counted once.
                if record.offset >= replay.next, let counts = record.counts { replay.counts = counts }
                replay.next = max(replay.next, record.offset)
                replay.progressKeys[record.epoch, default: []].append(
                    KeyAt(key: record.key, atMs: record.processedAtMs ?? 0, entriesAtMs: entriesAt(record)))
                replays[id] = replay
            }
            return
        case .position:
            if record.isPositionRequest { (pendingPosition, pendingPositionAt) = (record, logOffset) }
            return
        case .batch:
            batchRecords[record.key] = ((record.emails ?? []).isEmpty ? 0 : record.processedAtMs ?? 0, record.offset)
        case .claim:
            // Its owner restored the request and claimed from its offset. A claim whose restore stopped before the
            // request (one racing it) leaves it waiting: its owner takes it up from its first renewal, and if it dies
            // first, the next claim does.
            if pendingPositionAt.map(record.hasTakenUpPosition(at:)) ?? true { (pendingPosition, pendingPositionAt) = (nil, nil) }
        case .release, .checkpoint:
            break
        }
        if record.epoch > epoch {
            // A new owner; whatever it starts from is a state its predecessor committed.
            epoch = record.epoch
            owner = record.owner
            host = record.host
            offset = record.offset
            marks = record.decodedMarks()
            released = record.kind == .release
            broken = false
            return
        }
        guard record.epoch == epoch else { return }
        if record.kind == .checkpoint {
            // A complete state of the epoch's owner at one of its commits, written after the batch records that
            // reach it: it stands for them, also where compaction removed them. Its owner is the epoch's owner
            // even when another instance's claim of the same epoch is all that compaction left of the claims (a
            // rival is fenced long before an owner's first checkpoint).
            guard record.owner != owner || (offset.map { record.offset >= $0 } ?? true) else { return }
            host = record.host ?? (record.owner == owner ? host : nil)
            owner = record.owner
            offset = record.offset
            marks = record.decodedMarks()
            released = false
            broken = false
            return
        }
        guard record.owner == owner, !broken else { return }
        switch record.kind {
        case .replay, .replayProgress, .checkpoint, .position:
            return
        case .claim:
            if host == nil { host = record.host }
        case .batch:
            guard let from = record.from, let current = offset else { return }
            if from == current {
                offset = record.offset
                marks = record.decodedMarks()
                released = false
            } else if from > current {
                broken = true
            }
        case .release:
            guard let current = offset, record.offset >= current else { return }
            offset = record.offset
            marks = record.decodedMarks()
            released = true
        }
    }

    /// Continues at `request`'s offset (the pending request if nil), whatever the records said before it: an
    /// operator's choice, made because the log there is gone or is to be skipped. The read-back starts at the
    /// request's marks, the output topics' ends when it was made: the outputs before them name offsets the
    /// request has left (of a deleted and recreated events topic, perhaps), not outputs of batches after it.
    mutating func takeUpPosition(_ request: PartitionStateRecord? = nil) {
        guard let request = request ?? pendingPosition else { return }
        offset = request.offset
        marks = request.decodedMarks()
        broken = false
        position = request
        (pendingPosition, pendingPositionAt) = (nil, nil)
    }

    /// The records a new owner may delete from the state topic (`published_batch`), once their time is
    /// before the dedupe horizon: batch records (`coveredAt`: only once a checkpoint of its own reaches their
    /// offset), progress records superseded by a later one of the same replay and owner, and a finished
    /// replay's request and progress (the request goes first: progress without a request is ignored, a request
    /// without its progress would be replayed again).
    var deletableRecords: [(key: String, atMs: Int64, coveredAt: Int64?)] {
        var result = batchRecords.map { (key: $0.key, atMs: $0.value.processedAtMs, coveredAt: Optional($0.value.offset)) }
        result += orphanProgress.map { ($0.key, $0.entriesAtMs, nil) }
        for replay in replays.values {
            let doneAt = replay.progressKeys.values.flatMap { $0.map(\.atMs) }.max() ?? 0
            if replay.isDone { result.append((replay.requestKey, doneAt, nil)) }
            for keys in replay.progressKeys.values {
                for (index, entry) in keys.enumerated() {
                    if index < keys.count - 1 {
                        result.append((entry.key, entry.entriesAtMs, nil))
                    } else if replay.isDone {
                        // An owner's last progress goes with the request, never before it.
                        result.append((entry.key, max(entry.atMs, doneAt), nil))
                    }
                }
            }
        }
        return result
    }
}
