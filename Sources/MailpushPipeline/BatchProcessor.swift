import Foundation
import MailpushCore
import MailpushKafka

/// An output record together with the identity recovery uses to recognise it in the output topic.
struct Output: Sendable {
    enum Kind: Sendable, Hashable {
        case job(jobId: String, platform: String)
        /// `detail` is the `mailpush-error` header: one line a person can act on.
        case deadLetter(DeadLetterReason, detail: String)
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
    /// Decoding, dedupe and filtering; then rendering and sealing the jobs (for the debug log).
    var prepareTime: Duration = .zero
    var renderTime: Duration = .zero
}

/// What becomes of one event of a batch.
enum EventDecision: Sendable {
    /// The event cannot be used, or no device wanting it can be served: its original bytes go to the
    /// dead-letter topic.
    case deadLetter(DeadLetterReason, detail: String)
    /// Processed inside the dedupe window already, or earlier in the same batch: nothing happens.
    case duplicate
    /// Processed, and no device wants a notification: nothing is produced.
    case skip(dedupeKey: String)
    /// One job per device; all of them, or a dead letter if one cannot be rendered.
    case render(RenderWork)
}

/// An email whose devices and key are settled, waiting to be rendered.
struct RenderWork: Sendable {
    var source: SourceRef
    var event: EmailReceived
    var dedupeKey: String
    var devices: [DeviceRegistration]
    var key: AddressKey?
}

/// Turns records into outputs. Pure given its inputs: no Kafka, no SQLite.
struct BatchProcessor: Sendable {
    var topics: Topics
    var renderer: JobRenderer
    var sponsorWebhookURL: String?
    var parallelism = max(1, ProcessInfo.processInfo.activeProcessorCount)

    /// - Parameters:
    ///   - nowMs: the job creation time.
    ///   - alreadyProcessed: given the batch's dedupe keys, those processed inside the window (one state read per batch).
    func process(
        _ records: [KafkaRecord], directory: ConfigDirectory, nowMs: Int64,
        alreadyProcessed: ([String]) throws -> Set<String>
    ) async rethrows -> ProcessedBatch {
        let started = ContinuousClock.now
        var batch = ProcessedBatch()
        let decoded = records.map { record in Result { () throws(InputError) in try EmailReceived.decode(record.value ?? []) } }
        let processedBefore = try alreadyProcessed(decoded.compactMap { try? DedupeKey.of($0.get()) })

        var seenInBatch = Set<String>()
        var decisions: [EventDecision] = []
        decisions.reserveCapacity(records.count)
        for (record, event) in zip(records, decoded) {
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            switch event {
            case .failure(let error):
                decisions.append(.deadLetter(error.category, detail: error.reason))
            case .success(let event):
                decisions.append(decide(event, source: source, directory: directory, processedBefore: processedBefore,
                                        seenInBatch: &seenInBatch, batch: &batch))
            }
        }

        let prepared = ContinuousClock.now
        let rendered = await render(decisions, nowMs: nowMs)
        batch.prepareTime = prepared - started
        batch.renderTime = ContinuousClock.now - prepared
        for (index, (record, decision)) in zip(records, decisions).enumerated() {
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            switch decision {
            case .duplicate:
                batch.duplicates += 1
            case .skip(let dedupeKey):
                batch.processedEmails.append(dedupeKey)
            case .deadLetter(let reason, let detail):
                batch.outputs.append(deadLetter(record, source, reason, detail: detail))
            case .render(let work):
                switch rendered[index]! {
                case .success(let jobs):
                    batch.outputs.append(contentsOf: jobs)
                    batch.processedEmails.append(work.dedupeKey)
                case .failure(let error):
                    // Not processed: a replay after a fix may still deliver it.
                    batch.outputs.append(deadLetter(record, source, error == .payloadTooLarge ? .tooLarge : .renderFailed, detail: error.reason))
                }
            }
        }
        return batch
    }

    /// Dedupe, filter and key check for a decoded event.
    private func decide(
        _ event: EmailReceived, source: SourceRef, directory: ConfigDirectory, processedBefore: Set<String>,
        seenInBatch: inout Set<String>, batch: inout ProcessedBatch
    ) -> EventDecision {
        let dedupeKey = DedupeKey.of(event)
        guard !processedBefore.contains(dedupeKey), seenInBatch.insert(dedupeKey).inserted else { return .duplicate }

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
            if case .rejected(let why)? = keyEntry {
                return .deadLetter(.unusableKey, detail: "unusable public key for address \(event.emailAddressId): \(why)")
            }
            return .deadLetter(.noKey, detail: "no public key for address \(event.emailAddressId)")
        }
        if wanted.isEmpty { return .skip(dedupeKey: dedupeKey) }
        return .render(RenderWork(source: source, event: event, dedupeKey: dedupeKey, devices: wanted, key: usableKey))
    }

    /// Renders (and so seals) the jobs of every `.render` decision, spread over the cores: sealing is the
    /// batch's main cost. An email with many devices (one owner with 100,000) is cut into slices of
    /// `devicesPerSlice`, so it spreads over the cores too. The result is keyed by the decision's index.
    private func render(_ decisions: [EventDecision], nowMs: Int64) async -> [Int: Result<[Output], RenderError>] {
        var slices: [RenderSlice] = []
        for (index, decision) in decisions.enumerated() {
            guard case .render(let work) = decision else { continue }
            for (number, start) in stride(from: 0, to: work.devices.count, by: Self.devicesPerSlice).enumerated() {
                var part = work
                part.devices = Array(work.devices[start..<min(start + Self.devicesPerSlice, work.devices.count)])
                slices.append(RenderSlice(index: index, number: number, work: part))
            }
        }
        guard !slices.isEmpty else { return [:] }
        // Chunks of about equal device counts, one per core.
        let devices = slices.reduce(0) { $0 + $1.work.devices.count }
        let devicesPerChunk = max(1, (devices + parallelism - 1) / parallelism)
        var chunks: [ArraySlice<RenderSlice>] = []
        var chunkStart = 0
        var inChunk = 0
        for (position, slice) in slices.enumerated() {
            inChunk += slice.work.devices.count
            if inChunk >= devicesPerChunk || position == slices.count - 1 {
                chunks.append(slices[chunkStart...position])
                chunkStart = position + 1
                inChunk = 0
            }
        }

        var parts: [Int: [(number: Int, result: Result<[Output], RenderError>)]] = [:]
        await withTaskGroup(of: [(RenderSlice, Result<[Output], RenderError>)].self) { group in
            for chunk in chunks {
                group.addTask { chunk.map { ($0, self.renderAll($0.work, nowMs: nowMs)) } }
            }
            for await chunkResults in group {
                for (slice, result) in chunkResults { parts[slice.index, default: []].append((slice.number, result)) }
            }
        }
        // An email's jobs in device order; one failed slice fails the whole email.
        return parts.mapValues { emailParts in
            var outputs: [Output] = []
            for part in emailParts.sorted(by: { $0.number < $1.number }) {
                switch part.result {
                case .failure(let error): return .failure(error)
                case .success(let jobs): outputs += jobs
                }
            }
            return .success(outputs)
        }
    }

    static let devicesPerSlice = 512

    private struct RenderSlice: Sendable {
        var index: Int
        var number: Int
        var work: RenderWork
    }

    /// All of an email's jobs, or the reason none can be made: an email is never half delivered.
    private func renderAll(_ item: RenderWork, nowMs: Int64) -> Result<[Output], RenderError> {
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

    func deadLetter(_ record: KafkaRecord, _ source: SourceRef, _ reason: DeadLetterReason, detail: String) -> Output {
        // A header is one line: a reason must never smuggle a line break into a log or a header dump.
        let oneLine = detail.replacingOccurrences(of: "\n", with: " ").replacingOccurrences(of: "\r", with: " ")
        let out = OutgoingRecord(
            topic: topics.deadLetters, key: record.key, value: record.value,
            headers: [
                KafkaHeader(key: Header.source, value: Array(source.headerValue.utf8)),
                KafkaHeader(key: Header.error, value: Array(oneLine.utf8)),
            ])
        return Output(kind: .deadLetter(reason, detail: oneLine), source: source, record: out)
    }
}
