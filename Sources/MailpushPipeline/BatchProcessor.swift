import Crypto
import Foundation
import MailpushCore
import MailpushKafka

/// An output record together with the identity recovery uses to recognise it in the output topic.
struct Output: Sendable {
    enum Kind: Sendable, Hashable {
        case job(jobId: String, platform: String)
        case deadLetter(reason: String, category: String)
    }

    var kind: Kind
    var source: SourceRef
    var record: OutgoingRecord

    var identity: OutputIdentity {
        switch kind {
        case .job(let jobId, _): OutputIdentity(topic: record.topic, source: source.headerValue, jobId: jobId)
        case .deadLetter: OutputIdentity(topic: record.topic, source: source.headerValue, jobId: nil)
        }
    }
}

/// How an output is recognised in its topic: a job by source and jobId, a dead letter by its source.
struct OutputIdentity: Sendable, Hashable {
    var topic: String
    var source: String
    var jobId: String?
}

enum Header {
    static let source = "mailpush-source"
    static let jobId = "mailpush-job-id"
    static let error = "mailpush-error"
}

/// What a batch of `email.received` records turns into.
struct ProcessedBatch: Sendable {
    var outputs: [Output] = []
    /// Dedupe keys of the emails this batch processed (jobs produced or nobody wanted them).
    var processedEmails: [String] = []
    var duplicates = 0
    var filteredNotifications = 0
    var webhookWithoutEndpoint = 0
    /// Decode, dedupe and filter; then sealing and rendering (for the debug log).
    var prepareTime: Duration = .zero
    var renderTime: Duration = .zero
}

/// The dedupe key of an email: fixed length, so the window's index stays small whatever the ids.
func emailDedupeKey(emailAddressId: String, messageId: String) -> String {
    var hasher = SHA256()
    hasher.update(data: Array(emailAddressId.utf8))
    hasher.update(data: [0])
    hasher.update(data: Array(messageId.utf8))
    let digits = Array("0123456789abcdef".utf8)
    var hex = [UInt8]()
    hex.reserveCapacity(32)
    for byte in hasher.finalize().prefix(16) {
        hex.append(digits[Int(byte >> 4)])
        hex.append(digits[Int(byte & 0x0F)])
    }
    return String(decoding: hex, as: UTF8.self)
}

/// Turns records into outputs. Pure given its inputs: no Kafka, no SQLite.
struct BatchProcessor: Sendable {
    var topics: Topics
    var renderer: JobRenderer
    var sponsorWebhookURL: String?
    var parallelism = max(1, ProcessInfo.processInfo.activeProcessorCount)

    /// An email whose devices and key are settled, waiting to be rendered.
    private struct Work: Sendable {
        var index: Int
        var record: KafkaRecord
        var source: SourceRef
        var event: EmailReceived
        var devices: [DeviceRegistration]
        var key: AddressKey?
    }

    private enum Slot: Sendable {
        case deadLetter(Output)
        case work(Int)
        case none
    }

    /// - Parameters:
    ///   - nowMs: the job creation time.
    ///   - alreadyProcessed: given the batch's dedupe keys, those processed inside the window (one state read per batch).
    func process(
        _ records: [KafkaRecord], directory: ConfigDirectory, nowMs: Int64,
        alreadyProcessed: ([String]) throws -> Set<String>
    ) async rethrows -> ProcessedBatch {
        let started = ContinuousClock.now
        var batch = ProcessedBatch()
        var seenInBatch = Set<String>()
        var slots: [Slot] = []
        var work: [Work] = []
        slots.reserveCapacity(records.count)

        var decoded: [(KafkaRecord, SourceRef, Result<(EmailReceived, String), InputError>)] = []
        decoded.reserveCapacity(records.count)
        for record in records {
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            do {
                let event = try EmailReceived.decode(record.value ?? [])
                decoded.append((record, source, .success((event, emailDedupeKey(emailAddressId: event.emailAddressId, messageId: event.messageId)))))
            } catch {
                decoded.append((record, source, .failure(error)))
            }
        }
        let processedBefore = try alreadyProcessed(decoded.compactMap { try? $0.2.get().1 })

        for (record, source, result) in decoded {
            let event: EmailReceived
            let dedupeKey: String
            switch result {
            case .failure(let error):
                slots.append(.deadLetter(deadLetter(record, source, reason: error.reason, category: error.category)))
                continue
            case .success(let decodedEvent):
                (event, dedupeKey) = decodedEvent
            }
            guard !processedBefore.contains(dedupeKey), seenInBatch.insert(dedupeKey).inserted else {
                batch.duplicates += 1
                slots.append(.none)
                continue
            }

            let keyEntry = directory.key(address: event.emailAddressId)
            var usableKey: AddressKey?
            if case .usable(let key)? = keyEntry { usableKey = key }
            let meta = FilterMeta(
                type: event.type, emailAddressId: event.emailAddressId, sudoId: event.sudoId,
                folderId: event.folderId, keyId: usableKey?.keyId)

            var wanted: [DeviceRegistration] = []
            for device in directory.devices(owner: event.owner) {
                guard device.filter.wantsNotification(for: meta) else {
                    batch.filteredNotifications += 1
                    continue
                }
                if case .webhook = device.target, sponsorWebhookURL == nil {
                    batch.webhookWithoutEndpoint += 1
                    continue
                }
                wanted.append(device)
            }
            let needsKey = wanted.contains { if case .webhook = $0.target { false } else { true } }
            if needsKey && usableKey == nil {
                let reason: String
                let category: String
                switch keyEntry {
                case .rejected(let why)?:
                    (reason, category) = ("unusable public key for address \(event.emailAddressId): \(why)", "unusable_key")
                default:
                    (reason, category) = ("no public key for address \(event.emailAddressId)", "no_key")
                }
                slots.append(.deadLetter(deadLetter(record, source, reason: reason, category: category)))
                continue
            }
            batch.processedEmails.append(dedupeKey)
            if wanted.isEmpty {
                slots.append(.none)
            } else {
                slots.append(.work(work.count))
                work.append(Work(index: work.count, record: record, source: source, event: event, devices: wanted, key: usableKey))
            }
        }

        let prepared = ContinuousClock.now
        let rendered = await render(work, nowMs: nowMs)
        batch.prepareTime = prepared - started
        batch.renderTime = ContinuousClock.now - prepared
        for slot in slots {
            switch slot {
            case .none:
                break
            case .deadLetter(let output):
                batch.outputs.append(output)
            case .work(let index):
                switch rendered[index] {
                case .success(let jobs):
                    batch.outputs.append(contentsOf: jobs)
                case .failure(let error):
                    let item = work[index]
                    let category = error == .payloadTooLarge ? "too_large" : "render_failed"
                    batch.outputs.append(deadLetter(item.record, item.source, reason: error.reason, category: category))
                    // Not processed after all: a replay after a fix may still deliver it.
                    batch.processedEmails.removeAll {
                        $0 == emailDedupeKey(emailAddressId: item.event.emailAddressId, messageId: item.event.messageId)
                    }
                }
            }
        }
        return batch
    }

    /// Renders (and so seals) every job, spread over the cores: sealing is the batch's main cost.
    private func render(_ work: [Work], nowMs: Int64) async -> [Result<[Output], RenderError>] {
        guard !work.isEmpty else { return [] }
        let chunkSize = max(1, (work.count + parallelism - 1) / parallelism)
        let chunks = stride(from: 0, to: work.count, by: chunkSize).map { Array(work[$0..<min($0 + chunkSize, work.count)]) }
        var results = [Result<[Output], RenderError>?](repeating: nil, count: work.count)
        await withTaskGroup(of: [(Int, Result<[Output], RenderError>)].self) { group in
            for chunk in chunks {
                group.addTask { chunk.map { ($0.index, self.renderAll($0, nowMs: nowMs)) } }
            }
            for await chunkResults in group {
                for (index, result) in chunkResults { results[index] = result }
            }
        }
        return results.map { $0! }
    }

    /// All of an email's jobs, or the reason none can be made: an email is never half delivered.
    private func renderAll(_ item: Work, nowMs: Int64) -> Result<[Output], RenderError> {
        var outputs: [Output] = []
        outputs.reserveCapacity(item.devices.count)
        for device in item.devices {
            do {
                let job = try renderer.render(event: item.event, device: device, key: item.key, source: item.source, nowMs: nowMs)
                let record = OutgoingRecord(
                    topic: topics.jobs, key: Array(device.deviceId.utf8), value: job.value,
                    headers: [
                        KafkaHeader(key: Header.source, value: Array(item.source.headerValue.utf8)),
                        KafkaHeader(key: Header.jobId, value: Array(job.jobId.utf8)),
                    ])
                outputs.append(Output(kind: .job(jobId: job.jobId, platform: job.platform), source: item.source, record: record))
            } catch {
                return .failure(error)
            }
        }
        return .success(outputs)
    }

    private func deadLetter(_ record: KafkaRecord, _ source: SourceRef, reason: String, category: String) -> Output {
        // A header is one line: a reason must never smuggle a line break into a log or a header dump.
        let oneLine = reason.replacingOccurrences(of: "\n", with: " ").replacingOccurrences(of: "\r", with: " ")
        let out = OutgoingRecord(
            topic: topics.deadLetters, key: record.key, value: record.value,
            headers: [
                KafkaHeader(key: Header.source, value: Array(source.headerValue.utf8)),
                KafkaHeader(key: Header.error, value: Array(oneLine.utf8)),
            ])
        return Output(kind: .deadLetter(reason: oneLine, category: category), source: source, record: out)
    }
}
