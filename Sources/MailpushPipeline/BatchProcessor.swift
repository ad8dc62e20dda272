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
    ///   - config: given the batch's owners and addresses, their devices and keys (one lookup per batch).
    ///   - alreadyProcessed: given the batch's dedupe keys, those processed inside the window (one state read per batch).
    func process(
        _ records: [KafkaRecord], nowMs: Int64,
        config: (_ owners: Set<String>, _ addresses: Set<String>) throws -> ConfigView,
        alreadyProcessed: ([String]) throws -> Set<String>
    ) async throws -> ProcessedBatch {
        var outputs: [Output] = []
        var batch = try await process(
            records, nowMs: nowMs, config: config, alreadyProcessed: alreadyProcessed,
            roundDevices: .max
        ) { outputs += $0 }
        batch.outputs = outputs
        return batch
    }

    /// Like `process`, but renders in rounds of about `roundDevices` devices and hands each round's outputs
    /// to `emit` (in record order) before rendering the next: what is held at once is one round, however
    /// many devices one owner has. `batch.outputs` stays empty.
    ///
    /// An email that fits in one round is all jobs or one dead letter, as always. An email spread over
    /// several rounds whose rendering fails in a later round keeps the jobs already emitted and gets a dead
    /// letter too (it is not recorded as processed).
    func process(
        _ records: [KafkaRecord], nowMs: Int64,
        config: (_ owners: Set<String>, _ addresses: Set<String>) throws -> ConfigView,
        alreadyProcessed: ([String]) throws -> Set<String>, roundDevices: Int,
        emit: ([Output]) async throws -> Void
    ) async throws -> ProcessedBatch {
        let started = ContinuousClock.now
        var batch = ProcessedBatch()
        let decoded = records.map { record in Result { () throws(InputError) in try EmailReceived.decode(record.value ?? []) } }
        let processedBefore = try alreadyProcessed(decoded.compactMap { try? DedupeKey.of($0.get()) })
        var owners = Set<String>()
        var addresses = Set<String>()
        for case .success(let event) in decoded {
            owners.insert(event.owner)
            addresses.insert(event.emailAddressId)
        }
        let directory = try config(owners, addresses)

        var seenInBatch = Set<String>()
        var decisions: [EventDecision] = []
        decisions.reserveCapacity(records.count)
        for (record, event) in zip(records, decoded) {
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            switch event {
            case .failure(let error):
                decisions.append(.deadLetter(error.category, detail: error.reason))
            case .success(let event):
                decisions.append(
                    decide(
                        event, source: source, directory: directory, processedBefore: processedBefore,
                        seenInBatch: &seenInBatch, batch: &batch))
            }
        }
        batch.prepareTime = ContinuousClock.now - started

        // Units in record order: one per non-render decision, one per slice of `devicesPerSlice` devices.
        // Emails of more than one slice go after all the others, so that one owner with many devices does
        // not hold back the other owners' emails of the same batch.
        var units: [RenderSlice] = []
        var bigEmails: [RenderSlice] = []
        for (index, decision) in decisions.enumerated() {
            guard case .render(let work) = decision else {
                units.append(RenderSlice(index: index, number: 0, isLast: true, work: nil))
                continue
            }
            let starts = Array(stride(from: 0, to: work.devices.count, by: Self.devicesPerSlice))
            for (number, start) in starts.enumerated() {
                var part = work
                part.devices = Array(work.devices[start..<min(start + Self.devicesPerSlice, work.devices.count)])
                let slice = RenderSlice(index: index, number: number, isLast: number == starts.count - 1, work: part)
                if starts.count > 1 { bigEmails.append(slice) } else { units.append(slice) }
            }
        }
        units += bigEmails

        var renderTime = Duration.zero
        var failed = Set<Int>()
        var roundStart = 0
        while roundStart < units.count {
            var roundEnd = roundStart
            var devices = 0
            while roundEnd < units.count, devices < roundDevices || roundEnd == roundStart {
                devices += units[roundEnd].work?.devices.count ?? 0
                roundEnd += 1
            }
            let round = units[roundStart..<roundEnd]
            let renderStarted = ContinuousClock.now
            let rendered = await render(Array(round), nowMs: nowMs)
            renderTime += ContinuousClock.now - renderStarted

            var outputs: [Output] = []
            // Where the current email's jobs begin in `outputs`: a failure in this round takes them back.
            var emailStart = 0
            for (unit, result) in zip(round, rendered) {
                let record = records[unit.index]
                let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
                if unit.number == 0 { emailStart = outputs.count }
                switch decisions[unit.index] {
                case .duplicate:
                    batch.duplicates += 1
                case .skip(let dedupeKey):
                    batch.processedEmails.append(dedupeKey)
                case .deadLetter(let reason, let detail):
                    outputs.append(deadLetter(record, source, reason, detail: detail))
                case .render(let work):
                    guard !failed.contains(unit.index), let result else { continue }
                    switch result {
                    case .success(let jobs):
                        outputs += jobs
                        if unit.isLast { batch.processedEmails.append(work.dedupeKey) }
                    case .failure(let error):
                        // Not processed: a replay after a fix may still deliver it.
                        failed.insert(unit.index)
                        outputs.removeSubrange(emailStart...)
                        outputs.append(
                            deadLetter(
                                record, source, error == .payloadTooLarge ? .tooLarge : .renderFailed,
                                detail: error.reason))
                    }
                }
            }
            try await emit(outputs)
            roundStart = roundEnd
        }
        batch.renderTime = renderTime
        return batch
    }

    /// Dedupe, filter and key check for a decoded event.
    private func decide(
        _ event: EmailReceived, source: SourceRef, directory: ConfigView, processedBefore: Set<String>,
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

    /// Renders (and so seals) the slices' jobs, spread over the cores: sealing is the batch's main cost.
    /// Slices of one email spread over the cores too. Results are in the order of `slices`; nil for a unit
    /// that renders nothing.
    private func render(_ slices: [RenderSlice], nowMs: Int64) async -> [Result<[Output], RenderError>?] {
        let devices = slices.reduce(0) { $0 + ($1.work?.devices.count ?? 0) }
        guard devices > 0 else { return Array(repeating: nil, count: slices.count) }
        // Chunks of about equal device counts, one per core.
        let devicesPerChunk = max(1, (devices + parallelism - 1) / parallelism)
        var chunks: [Range<Int>] = []
        var chunkStart = 0
        var inChunk = 0
        for position in slices.indices {
            inChunk += slices[position].work?.devices.count ?? 0
            if inChunk >= devicesPerChunk || position == slices.count - 1 {
                chunks.append(chunkStart..<(position + 1))
                chunkStart = position + 1
                inChunk = 0
            }
        }
        var results = [Result<[Output], RenderError>?](repeating: nil, count: slices.count)
        await withTaskGroup(of: [(Int, Result<[Output], RenderError>?)].self) { group in
            for chunk in chunks {
                group.addTask {
                    chunk.map { position in (position, slices[position].work.map { self.renderAll($0, nowMs: nowMs) }) }
                }
            }
            for await chunkResults in group {
                for (position, result) in chunkResults { results[position] = result }
            }
        }
        return results
    }

    static let devicesPerSlice = 512

    /// One unit of rendering: a slice of an email's devices, or (`work` nil) an event that renders nothing.
    private struct RenderSlice: Sendable {
        var index: Int
        var number: Int
        var isLast: Bool
        var work: RenderWork?
    }

    /// All of an email's jobs, or the reason none can be made: an email is never half delivered.
    private func renderAll(_ item: RenderWork, nowMs: Int64) -> Result<[Output], RenderError> {
        var outputs: [Output] = []
        outputs.reserveCapacity(item.devices.count)
        let sourceHeader = KafkaHeader(key: Header.source, value: Array(item.source.headerValue.utf8)) // shared by the email's jobs
        for device in item.devices {
            do {
                let job = try renderer.render(event: item.event, device: device, key: item.key, source: item.source, nowMs: nowMs)
                let record = OutgoingRecord(
                    topic: topics.jobs, key: Array(device.deviceId.utf8), value: job.value,
                    headers: [
                        sourceHeader,
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
