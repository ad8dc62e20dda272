import Foundation
import MailpushCore
import MailpushKafka
import MailpushMultiBufferRSA
import Synchronization

/// An output record together with the identity recovery uses to recognise it in the output topic.
///
/// A class: outputs are handed from the renderer through assembly, delivery and recovery in arrays that are
/// filtered, zipped and mapped, and copying a struct of a dozen strings and arrays at each step measured as
/// the largest part of the service's reference counting.
final class Output: Sendable {
    enum Kind: Sendable, Hashable {
        case job(jobId: String, platform: String)
        /// `detail` is the `mailpush-error` header: one line a person can act on.
        case deadLetter(DeadLetterReason, detail: String)
    }

    let kind: Kind
    let source: SourceRef
    let record: OutgoingRecord

    init(kind: Kind, source: SourceRef, record: OutgoingRecord) {
        self.kind = kind
        self.source = source
        self.record = record
    }

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
    /// On outputs written by a replay: which replay (a fleet replay's id, or `request-N` for a local one), so a
    /// read-back tells an interrupted replay batch's outputs from the original ones of the same events.
    static let replay = "mailpush-replay"
}

extension [Output] {
    /// The same outputs, marked as written by replay `tag`.
    func taggedAsReplay(_ tag: String) -> [Output] {
        let value = [UInt8](tag.utf8)
        return map { output in
            var record = output.record
            record.headers.append(KafkaHeader(key: Header.replay, value: value))
            return Output(kind: output.kind, source: output.source, record: record)
        }
    }
}

/// What a batch of `email.received` records turns into.
struct ProcessedBatch: Sendable {
    var outputs: [Output] = []
    /// Dedupe keys of the emails this batch processed (jobs produced or nobody wanted them).
    var processedEmails: [String] = []
    /// The event partition of each of `processedEmails`, in the same order: a fleet hands each partition's
    /// dedupe entries over with it.
    var processedEmailPartitions: [Int32] = []
    var duplicates = 0
    var filteredNotifications = 0
    var webhookWithoutEndpoint = 0
    /// Decoding, dedupe and filtering; then rendering and sealing the jobs (for the debug log).
    var configTime: Duration = .zero
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

/// An email whose devices and key are settled, waiting to be rendered. A class, for the same reason as
/// `Output`: it travels through the plan, its slices and the render tasks.
///
/// `devices` shares its storage with the other emails of the batch that want the same devices, and with the
/// email's slices: a batch of 2,000 emails for an owner with 1,000 devices holds the list once, not 2,000 times.
final class RenderWork: Sendable {
    let source: SourceRef
    let event: EmailReceived
    let dedupeKey: String
    let devices: ArraySlice<DeviceRegistration>
    let key: AddressKey?

    init(source: SourceRef, event: EmailReceived, dedupeKey: String, devices: ArraySlice<DeviceRegistration>, key: AddressKey?) {
        self.source = source
        self.event = event
        self.dedupeKey = dedupeKey
        self.devices = devices
        self.key = key
    }

    /// The same email for a part of its devices (`range` counts from its first device).
    func slice(_ range: Range<Int>) -> RenderWork {
        let start = devices.startIndex
        return RenderWork(
            source: source, event: event, dedupeKey: dedupeKey, devices: devices[start + range.lowerBound..<start + range.upperBound],
            key: key)
    }
}

/// The devices that want an event, and those that were left out.
struct DeviceWants: Sendable {
    var devices: [DeviceRegistration] = []
    var filtered = 0
    var webhookWithoutEndpoint = 0

    /// About what the devices take in memory: their ids and push targets (a slim device keeps no filter).
    var bytes: Int {
        devices.reduce(0) { total, device in
            let target =
                switch device.target {
                case .apns(let token), .fcm(let token): token.utf8.count
                case .webhook(let details): details.utf8.count
                }
            return total + 128 + device.deviceId.utf8.count + device.owner.utf8.count + (device.bundleId?.utf8.count ?? 0) + target
        }
    }

    /// Adds those of `devices` that want `meta`; `slim` keeps them without their filter (nothing after this
    /// needs it), so an owner read page by page holds only what its jobs need.
    mutating func add(_ devices: [DeviceRegistration], for meta: FilterMeta, renderer: JobRenderer, slim: Bool = false) {
        for device in devices {
            guard device.filter.wantsNotification(for: meta) else {
                filtered += 1
                continue
            }
            if case .webhook = device.target, renderer.options.sponsorWebhookURL == nil {
                webhookWithoutEndpoint += 1
                continue
            }
            self.devices.append(
                slim
                    ? DeviceRegistration(
                        deviceId: device.deviceId, owner: device.owner, bundleId: device.bundleId, target: device.target,
                        filter: NotificationFilter(items: []))
                    : device)
        }
    }
}

/// Turns records into outputs. Pure given its inputs: no Kafka, and SQLite only behind the config view (an owner
/// too large to hold whole is read page by page).
struct BatchProcessor: Sendable {
    var topics: Topics
    var renderer: JobRenderer
    /// The largest record the producer takes: a dead letter is kept below it (`deadLetter`).
    var maxRecordBytes: Int
    var parallelism = max(1, ProcessInfo.processInfo.activeProcessorCount)

    init(topics: Topics, configuration: PipelineConfiguration) {
        self.topics = topics
        renderer = JobRenderer(options: configuration.render)
        maxRecordBytes = configuration.maxOutputRecordBytes
    }

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
    /// to `emit` (in record order): what is held at once is two rounds (the one being emitted and the next,
    /// rendered meanwhile), however many devices one owner has. `batch.outputs` stays empty.
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
        var plan = try self.plan(records, nowMs: nowMs, config: config, alreadyProcessed: alreadyProcessed)
        try await renderAndEmit(&plan, roundDevices: roundDevices) { outputs, _ in try await emit(outputs) }
        return plan.batch
    }

    /// Renders the plan's remaining rounds and hands each one's outputs to `emit`, rendering the next round
    /// while `emit` delivers the current one: sealing (CPU) overlaps delivery (waiting for the broker).
    /// With the last round, `emit` also gets the batch as it ends (`finished`; nil before): what its commit stores,
    /// known before that round is delivered.
    func renderAndEmit(
        _ plan: inout BatchPlan, roundDevices: Int, emit: (_ outputs: [Output], _ finished: ProcessedBatch?) async throws -> Void
    ) async throws {
        var next = plan.firstRound ?? plan.takeRound(devices: roundDevices).map { range in RoundToRender(range: range, rendered: nil) }
        plan.firstRound = nil
        while let round = next {
            let rendered: [Result<[Output], RenderError>?]
            if let done = round.rendered {
                rendered = done
            } else {
                let (results, took) = await timedRender(Array(plan.units[round.range]), nowMs: plan.nowMs)
                rendered = results
                plan.batch.renderTime += took
            }
            let outputs = assemble(&plan, round: round.range, rendered: rendered)
            guard let following = plan.takeRound(devices: roundDevices) else {
                try await emit(outputs, plan.batch)
                return
            }
            let units = Array(plan.units[following])
            let nowMs = plan.nowMs
            async let renderedNext = timedRender(units, nowMs: nowMs)
            try await emit(outputs, nil)
            let (results, took) = await renderedNext
            next = RoundToRender(range: following, rendered: results)
            plan.batch.renderTime += took
        }
    }

    private func timedRender(
        _ units: [RenderSlice], nowMs: Int64, betweenSlices: ((RenderBoard) -> Void)? = nil
    ) async -> ([Result<[Output], RenderError>?], Duration) {
        let started = ContinuousClock.now
        let results = await render(units, nowMs: nowMs, betweenSlices: betweenSlices)
        return (results, ContinuousClock.now - started)
    }

    /// The first round of a plan, rendered ahead of its delivery (the service prepares the next batch while
    /// it delivers the current one).
    ///
    /// `offer`, when given, is handed the round's outputs while the rest of it renders: whenever the whole
    /// emails rendered since the last piece it took come to `unitsPerPiece(of:)` units or more, their outputs
    /// as the delivery will assemble them, and the event partitions they are of. It answers whether it took
    /// them; a piece it did not take is offered again later, grown. What follows the last piece taken is the
    /// caller's (`outputsOfWholeFirstRound`, without the outputs taken).
    func renderFirstRound(
        _ plan: inout BatchPlan, roundDevices: Int,
        offer: ((_ outputs: [Output], _ eventPartitions: Set<Int32>) -> Bool)? = nil
    ) async {
        guard plan.firstRound == nil, let range = plan.takeRound(devices: roundDevices) else { return }
        let offerPieces = offer.map { offer in
            let planned = plan
            let piece = Self.unitsPerPiece(of: range.count)
            var taken = range.lowerBound
            var offeredUpTo = range.lowerBound
            return { (board: RenderBoard) in
                let done = range.lowerBound + board.donePrefix
                guard done - offeredUpTo >= piece, let end = planned.endOfLastEmail(in: taken..<done), end - taken >= piece
                else { return }
                offeredUpTo = end
                var copy = planned
                let outputs = assemble(
                    &copy, round: taken..<end, rendered: board.results(in: (taken - range.lowerBound)..<(end - range.lowerBound)))
                if offer(outputs, planned.eventPartitions(of: taken..<end)) { taken = end }
            }
        }
        let (results, took) = await timedRender(Array(plan.units[range]), nowMs: plan.nowMs, betweenSlices: offerPieces)
        plan.firstRound = RoundToRender(range: range, rendered: results)
        plan.batch.renderTime += took
    }

    /// A round's outputs go out in pieces of about a sixteenth of it, and of at least 8 units (about 24 jobs, half
    /// a millisecond of sealing on one core): small enough that the first events of a large chunk need not wait
    /// for its last, large enough that a backlog's chunk costs a few writes, not one per email. (An eighth and 16
    /// units measured 1.16× this one's p99 under the steady load, docs/performance.md, session 21.)
    static func unitsPerPiece(of units: Int) -> Int { max(8, units / 16) }

    /// A plan's outputs as its delivery will assemble them, when its first round is all of it (nil otherwise);
    /// the plan itself is left as it is.
    func outputsOfWholeFirstRound(_ plan: BatchPlan) -> [Output]? {
        guard let round = plan.firstRound else { return plan.units.isEmpty ? [] : nil }
        guard round.range == 0..<plan.units.count, let rendered = round.rendered else { return nil }
        var copy = plan
        return assemble(&copy, round: round.range, rendered: rendered)
    }

    /// Decodes, dedupes and filters a batch and orders its rendering work; renders nothing yet.
    /// - Parameter inFlight: dedupe keys of a batch planned before this one and not committed yet: its
    ///   emails count as processed here (the state store does not know them yet).
    /// - Parameter plannedBefore: the same for the earlier chunks of the batch this plan will be joined to
    ///   (a set of its own, so that a chunk does not copy the ever larger union of both).
    func plan(
        _ records: [KafkaRecord], nowMs: Int64,
        config: (_ owners: Set<String>, _ addresses: Set<String>) throws -> ConfigView,
        alreadyProcessed: ([String]) throws -> Set<String>, inFlight: Set<String> = [], plannedBefore: Set<String> = []
    ) throws -> BatchPlan {
        let started = ContinuousClock.now
        var batch = ProcessedBatch()
        // Each event with its dedupe key, made once (a SHA-256): the state lookup and the decisions both need it.
        let decoded = records.map { record in
            Result { () throws(InputError) in
                let event = try EmailReceived.decode(record.value ?? [])
                return (event: event, dedupeKey: DedupeKey.of(event))
            }
        }
        let keys = decoded.compactMap { try? $0.get().dedupeKey }
        var processedBefore = try alreadyProcessed(keys)
        let countedAsInFlight =
            inFlight.isEmpty && plannedBefore.isEmpty
            ? []
            : Set(keys.filter { (inFlight.contains($0) || plannedBefore.contains($0)) && !processedBefore.contains($0) })
        processedBefore.formUnion(countedAsInFlight)
        var owners = Set<String>()
        var addresses = Set<String>()
        for case .success(let (event, _)) in decoded {
            owners.insert(event.owner)
            addresses.insert(event.emailAddressId)
        }
        let directory = try config(owners, addresses)
        // What the emails of each owner and meta want, worked out once a batch: the paged owners' from their pages
        // now, the others' as their first email comes.
        var wantsOfOwners = try wantsOfPagedOwners(decoded, directory: directory)

        var seenInBatch = Set<String>()
        var decisions: [EventDecision] = []
        decisions.reserveCapacity(records.count)
        var planned = Set<String>()
        for (record, event) in zip(records, decoded) {
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            switch event {
            case .failure(let error):
                decisions.append(.deadLetter(error.category, detail: error.reason))
            case .success(let (event, dedupeKey)):
                let decision = decide(
                    event, dedupeKey: dedupeKey, source: source, directory: directory, wantsOfOwners: &wantsOfOwners,
                    processedBefore: processedBefore, seenInBatch: &seenInBatch, batch: &batch)
                switch decision {
                case .skip(let key): planned.insert(key)
                case .render(let work): planned.insert(work.dedupeKey)
                case .deadLetter, .duplicate: break
                }
                decisions.append(decision)
            }
        }

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
                let part = starts.count == 1 ? work : work.slice(start..<min(start + Self.devicesPerSlice, work.devices.count))
                let slice = RenderSlice(index: index, number: number, isLast: number == starts.count - 1, work: part)
                if starts.count > 1 { bigEmails.append(slice) } else { units.append(slice) }
            }
        }
        units += bigEmails
        batch.prepareTime = ContinuousClock.now - started
        return BatchPlan(
            records: records, nowMs: nowMs, decisions: decisions, units: units, batch: batch,
            plannedEmails: planned, countedAsInFlight: countedAsInFlight)
    }

    /// A rendered round's outputs in record order, with the plan's counters and processed emails updated.
    private func assemble(_ plan: inout BatchPlan, round: Range<Int>, rendered: [Result<[Output], RenderError>?]) -> [Output] {
        var outputs: [Output] = []
        // Where the current email's jobs begin in `outputs`: a failure in this round takes them back.
        var emailStart = 0
        for (unit, result) in zip(plan.units[round], rendered) {
            let record = plan.records[unit.index]
            let source = SourceRef(topic: record.topic, partition: record.partition, offset: record.offset)
            if unit.number == 0 { emailStart = outputs.count }
            switch plan.decisions[unit.index] {
            case .duplicate:
                plan.batch.duplicates += 1
            case .skip(let dedupeKey):
                plan.batch.processedEmails.append(dedupeKey)
                plan.batch.processedEmailPartitions.append(record.partition)
            case .deadLetter(let reason, let detail):
                outputs.append(deadLetter(record, source, reason, detail: detail))
            case .render(let work):
                guard !plan.failed.contains(unit.index), let result else { continue }
                switch result {
                case .success(let jobs):
                    outputs += jobs
                    if unit.isLast {
                        plan.batch.processedEmails.append(work.dedupeKey)
                        plan.batch.processedEmailPartitions.append(record.partition)
                    }
                case .failure(let error):
                    // Not processed: a replay after a fix may still deliver it.
                    plan.failed.insert(unit.index)
                    outputs.removeSubrange(emailStart...)
                    outputs.append(
                        deadLetter(
                            record, source, error == .payloadTooLarge ? .tooLarge : .renderFailed,
                            detail: error.reason))
                }
            }
        }
        return outputs
    }

    /// What the events of the view's paged owners want, by owner and meta: each of those owners' devices is read
    /// a page at a time and held only while its page is matched against every meta of the owner's events in the
    /// batch, unless the directory knows what those metas want from a read since the owner's devices last changed.
    private func wantsOfPagedOwners(
        _ decoded: [Result<(event: EmailReceived, dedupeKey: String), InputError>], directory: ConfigView
    ) throws -> [OwnerMeta: DeviceWants] {
        guard !directory.pagedOwners.isEmpty else { return [:] }
        var metasByOwner: [String: Set<FilterMeta>] = [:]
        for case .success(let (event, _)) in decoded where directory.pagedOwners.contains(event.owner) {
            metasByOwner[event.owner, default: []].insert(
                FilterMeta(event: event, keyId: directory.usableKey(address: event.emailAddressId)?.keyId))
        }
        var wants: [OwnerMeta: DeviceWants] = [:]
        for (owner, metas) in metasByOwner {
            let (known, changes) = directory.knownPagedWants(owner: owner)
            var byMeta = known?.byMeta ?? [:]
            let unknown = metas.filter { byMeta[$0] == nil }
            if !unknown.isEmpty {
                var read = ConfigDirectory.PagedWants(byMeta: Dictionary(uniqueKeysWithValues: unknown.map { ($0, DeviceWants()) }))
                try directory.forEachDevicePage(owner: owner) { page in
                    read.deviceIds += page.map(\.deviceId)
                    for meta in unknown { read.byMeta[meta]?.add(page, for: meta, renderer: renderer, slim: true) }
                }
                directory.keep(read, owner: owner, ifNoChangeSince: changes)
                byMeta.merge(read.byMeta) { _, new in new }
            }
            for meta in metas { wants[OwnerMeta(owner: owner, meta: meta)] = byMeta[meta] }
        }
        return wants
    }

    /// An owner's emails with one filter meta: they want the same devices.
    private struct OwnerMeta: Hashable {
        var owner: String
        var meta: FilterMeta
    }

    /// Dedupe, filter and key check for a decoded event. `wantsOfOwners`: what the batch's emails wanted so far, by
    /// owner and meta (those of owners read page by page, all of them): the emails that want the same devices share
    /// one list of them, and their filters run once.
    private func decide(
        _ event: EmailReceived, dedupeKey: String, source: SourceRef, directory: ConfigView,
        wantsOfOwners: inout [OwnerMeta: DeviceWants], processedBefore: Set<String>, seenInBatch: inout Set<String>,
        batch: inout ProcessedBatch
    ) -> EventDecision {
        guard !processedBefore.contains(dedupeKey), seenInBatch.insert(dedupeKey).inserted else { return .duplicate }

        let keyEntry = directory.key(address: event.emailAddressId)
        let usableKey = keyEntry?.usable
        let ownerMeta = OwnerMeta(owner: event.owner, meta: FilterMeta(event: event, keyId: usableKey?.keyId))
        var wants: DeviceWants
        if let known = wantsOfOwners[ownerMeta] {
            wants = known
        } else {
            wants = DeviceWants()
            wants.add(directory.devices(owner: event.owner), for: ownerMeta.meta, renderer: renderer)
            wantsOfOwners[ownerMeta] = wants
        }
        batch.filteredNotifications += wants.filtered
        batch.webhookWithoutEndpoint += wants.webhookWithoutEndpoint
        let wanted = wants.devices
        let needsKey = wanted.contains { $0.target.isSealed }
        if needsKey && usableKey == nil {
            if case .rejected(let why)? = keyEntry {
                return .deadLetter(.unusableKey, detail: "unusable public key for address \(event.emailAddressId): \(why)")
            }
            return .deadLetter(.noKey, detail: "no public key for address \(event.emailAddressId)")
        }
        if wanted.isEmpty { return .skip(dedupeKey: dedupeKey) }
        return .render(RenderWork(source: source, event: event, dedupeKey: dedupeKey, devices: wanted[...], key: usableKey))
    }

    /// Renders (and so seals) the slices' jobs, spread over the cores: sealing is the batch's main cost.
    /// Slices of one email spread over the cores too. Results are in the order of `slices`; nil for a unit
    /// that renders nothing.
    ///
    /// The calling task renders too, and every renderer takes the next slice when it is done with one, so the
    /// round ends when the work does: with a fixed half for each core, a half whose thread was busy elsewhere
    /// (a delivery's acknowledgements, a commit, the broker on a shared machine) held the whole round back
    /// while the other core idled, and the caller always waited for a thread to start the first half.
    /// `betweenSlices` runs on the calling task after each slice it rendered, with what every renderer has
    /// finished so far.
    private func render(
        _ slices: [RenderSlice], nowMs: Int64, betweenSlices: ((RenderBoard) -> Void)? = nil
    ) async -> [Result<[Output], RenderError>?] {
        let rendering = slices.reduce(0) { $0 + ($1.work == nil ? 0 : 1) }
        guard rendering > 0 else { return Array(repeating: nil, count: slices.count) }
        let cursor = SliceCursor()
        let board = RenderBoard(count: slices.count)
        // With multi-buffer RSA a renderer takes slices until they seal about `sealingsPerTake` jobs, and makes their
        // RSA operations together, eight a call, before it renders them.
        let together = renderer.options.multiBufferRSA != nil
        let sealings = together ? slices.map { $0.work.map(Self.sealings) ?? 0 } : []
        @Sendable func renderNextSlices() -> Bool {
            guard
                let positions = together
                    ? cursor.take(sealingsAtLeast: Self.sealingsPerTake, of: sealings) : cursor.take(below: slices.count)
            else { return false }
            let encryptedKeys = together ? encryptFreshKeys(for: positions, of: slices) : [:]
            for position in positions {
                board.finish(position, slices[position].work.map { renderAll($0, nowMs: nowMs, encryptedKeys: encryptedKeys[position]) })
            }
            return true
        }
        await withTaskGroup(of: Void.self) { group in
            for _ in 1..<min(parallelism, rendering) {
                group.addTask { while renderNextSlices() {} }
            }
            while renderNextSlices() { betweenSlices?(board) }
            await group.waitForAll()
        }
        return board.takeResults()
    }

    /// Three multi-buffer calls' worth of jobs: a chunk of a steady load (tens of jobs) still spreads over two cores.
    static let sealingsPerTake = 3 * MultiBufferRSA.lanes

    /// The jobs of `work` that are sealed: its APNs and FCM devices when the address has a key.
    private static func sealings(_ work: RenderWork) -> Int {
        guard work.key != nil else { return 0 }
        return work.devices.reduce(0) { count, device in device.target.isSealed ? count + 1 : count }
    }

    /// The encrypted AES keys of the sealed jobs of `positions`' slices, made together, by slice and then by the
    /// device's place in its slice (nil for a device that seals nothing).
    private func encryptFreshKeys(for positions: Range<Int>, of slices: [RenderSlice]) -> [Int: [EncryptedAESKey?]] {
        var keys: [AddressKey] = []
        for position in positions {
            guard let work = slices[position].work, let key = work.key else { continue }
            for device in work.devices where device.target.isSealed { keys.append(key) }
        }
        guard !keys.isEmpty else { return [:] }
        var encrypted = renderer.encryptFreshKeys(for: keys)[...]
        var byPosition: [Int: [EncryptedAESKey?]] = [:]
        for position in positions {
            guard let work = slices[position].work, work.key != nil else { continue }
            byPosition[position] = work.devices.map { device in device.target.isSealed ? encrypted.popFirst() ?? nil : nil }
        }
        return byPosition
    }

    /// A round's results as its renderers finish them, and how many from its start are all finished.
    final class RenderBoard: Sendable {
        private struct State {
            var results: [Result<[Output], RenderError>?]
            var finished: [Bool]
            var prefix = 0
        }
        private let state: Mutex<State>

        init(count: Int) {
            state = Mutex(State(results: Array(repeating: nil, count: count), finished: Array(repeating: false, count: count)))
        }

        func finish(_ position: Int, _ result: Result<[Output], RenderError>?) {
            state.withLock { state in
                state.results[position] = result
                state.finished[position] = true
            }
        }

        /// How many slices from the start are finished.
        var donePrefix: Int {
            state.withLock { state in
                while state.prefix < state.finished.count, state.finished[state.prefix] { state.prefix += 1 }
                return state.prefix
            }
        }

        func results(in range: Range<Int>) -> [Result<[Output], RenderError>?] {
            state.withLock { Array($0.results[range]) }
        }

        func takeResults() -> [Result<[Output], RenderError>?] {
            state.withLock { state in
                defer { state.results = [] }
                return state.results
            }
        }
    }

    /// Hands out slice positions, each once, to whichever renderer asks next.
    private final class SliceCursor: Sendable {
        private let next = Mutex<Int>(0)

        /// The next position.
        func take(below count: Int) -> Range<Int>? {
            next.withLock { next in
                guard next < count else { return nil }
                defer { next += 1 }
                return next..<(next + 1)
            }
        }

        /// The next positions, as many as seal at least `target` jobs together (`sealings`, one count a slice), or the
        /// rest.
        func take(sealingsAtLeast target: Int, of sealings: [Int]) -> Range<Int>? {
            next.withLock { next in
                guard next < sealings.count else { return nil }
                let start = next
                var sealed = 0
                while next < sealings.count, sealed < target {
                    sealed += sealings[next]
                    next += 1
                }
                return start..<next
            }
        }
    }

    static let devicesPerSlice = 512

    /// One unit of rendering: a slice of an email's devices, or (`work` nil) an event that renders nothing.
    struct RenderSlice: Sendable {
        var index: Int
        var number: Int
        var isLast: Bool
        var work: RenderWork?
    }

    /// All of an email's jobs, or the reason none can be made: an email is never half delivered.
    /// `encryptedKeys`, if made beforehand (`encryptFreshKeys`), has one entry a device, in order.
    private func renderAll(_ item: RenderWork, nowMs: Int64, encryptedKeys: [EncryptedAESKey?]? = nil) -> Result<[Output], RenderError> {
        var outputs: [Output] = []
        outputs.reserveCapacity(item.devices.count)
        // Shared by the email's jobs.
        let sourceHeader = KafkaHeader(key: Header.source, value: Array(item.source.headerValue.utf8))
        let email = renderer.prepare(event: item.event, key: item.key)
        // By index: `for device in` would copy each registration (a retain per string, contended between the
        // render threads that share them).
        let devices = item.devices
        for index in devices.indices {
            do {
                let job = try renderer.render(
                    email, device: devices[index], source: item.source, nowMs: nowMs,
                    encryptedKey: encryptedKeys?[index - devices.startIndex])
                let record = OutgoingRecord(
                    topic: topics.jobs, key: Array(devices[index].deviceId.utf8), value: job.value,
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

    /// librdkafka's size check counts a record's framing besides its key, value and headers: at most 36 bytes for a
    /// v2 record and 10 for each header's lengths. Room, too, for a replay's `mailpush-replay` header, added later.
    static let recordFramingBytes = 160

    func deadLetter(_ record: KafkaRecord, _ source: SourceRef, _ reason: DeadLetterReason, detail: String) -> Output {
        // A header is one line with nothing hidden: a reason naming an id from the record (`no public key for
        // address …`) must never carry a line break, a right-to-left override or an invisible character into a
        // header dump. Quoted values (`quotedForError`) are escaped already, and stay as they are.
        var oneLine = detail.withInvisiblesEscaped
        var (key, value) = (record.key, record.value)
        // A dead letter the producer refuses would stop the service at this record, at every restart and on every
        // member that takes the partition over. So an event too large to copy with the headers loses its value (and
        // a key that is still too large, its key); the reason says so, and the source header says where it is.
        let framing = Self.recordFramingBytes + Header.source.utf8.count + source.headerValue.utf8.count + Header.error.utf8.count
        func fits(_ reason: String, _ key: [UInt8]?, _ value: [UInt8]?) -> Bool {
            framing + reason.utf8.count + (key?.count ?? 0) + (value?.count ?? 0) <= maxRecordBytes
        }
        if !fits(oneLine, key, value) {
            let limit = ", as the record would exceed \(maxRecordBytes) bytes (message.max.bytes): read it at \(source.headerValue)"
            var omitted = "; the event's \(value?.count ?? 0)-byte value is not copied"
            value = nil
            if !fits(oneLine + omitted + limit, key, nil) {
                omitted += ", nor its \(key?.count ?? 0)-byte key"
                key = nil
            }
            oneLine += omitted + limit
        }
        let out = OutgoingRecord(
            topic: topics.deadLetters, key: key, value: value,
            headers: [
                KafkaHeader(key: Header.source, value: Array(source.headerValue.utf8)),
                KafkaHeader(key: Header.error, value: Array(oneLine.utf8)),
            ])
        return Output(kind: .deadLetter(reason, detail: oneLine), source: source, record: out)
    }
}

/// A batch decoded, deduped and filtered, its rendering ordered in units; rendered and emitted round by round.
struct BatchPlan: Sendable {
    private(set) var records: [KafkaRecord]
    let nowMs: Int64
    private(set) var decisions: [EventDecision]
    private(set) var units: [BatchProcessor.RenderSlice]
    var batch: ProcessedBatch
    /// Dedupe keys of the emails this batch means to process: a batch planned while this one is in flight
    /// counts them as processed.
    private(set) var plannedEmails: Set<String>
    /// Emails this batch took for duplicates only because the batch before it (in flight) planned them.
    private(set) var countedAsInFlight: Set<String>
    /// Events whose rendering failed in an earlier round.
    var failed = Set<Int>()
    /// The first round, when rendered ahead of delivery.
    var firstRound: RoundToRender?
    /// The first outputs of the first round, when written ahead (`WriteAhead`), in order.
    var aheadWrites: [AheadWrite] = []
    private var nextUnit = 0

    init(
        records: [KafkaRecord], nowMs: Int64, decisions: [EventDecision], units: [BatchProcessor.RenderSlice],
        batch: ProcessedBatch, plannedEmails: Set<String>, countedAsInFlight: Set<String>
    ) {
        self.records = records
        self.nowMs = nowMs
        self.decisions = decisions
        self.units = units
        self.batch = batch
        self.plannedEmails = plannedEmails
        self.countedAsInFlight = countedAsInFlight
    }

    /// Planned emails that did not end up processed (their rendering failed).
    var unprocessedPlannedEmails: Set<String> { plannedEmails.subtracting(batch.processedEmails) }

    /// Every unit is rendered (in `firstRound`) and none failed: a plan that `joined` can extend.
    var isRenderedWithoutFailures: Bool {
        guard let round = firstRound else { return units.isEmpty }
        guard round.range == 0..<units.count, let rendered = round.rendered else { return false }
        return !rendered.contains { if case .failure? = $0 { true } else { false } }
    }

    /// Devices to render, over all units.
    var deviceCount: Int { units.reduce(0) { $0 + ($1.work?.devices.count ?? 0) } }

    /// Appends `second`'s records, as if both had been planned together: `second` must have been planned
    /// with this plan's emails counted as in flight (`plannedBefore`), and this plan must be rendered without
    /// failures (so no email `second` took for a duplicate of one of this plan's can turn out unprocessed).
    /// The extended plan's first round is everything rendered so far. In place: a batch gathered chunk by
    /// chunk copies each record once, not once per later chunk.
    mutating func extend(with second: BatchPlan) {
        precondition(isRenderedWithoutFailures, "only a plan rendered without failures can be extended")
        let shift = records.count
        let unitsBefore = units.count
        records.append(contentsOf: second.records)
        decisions.append(contentsOf: second.decisions)
        units.reserveCapacity(units.count + second.units.count)
        for var unit in second.units {
            unit.index += shift
            units.append(unit)
        }
        batch.filteredNotifications += second.batch.filteredNotifications
        batch.webhookWithoutEndpoint += second.batch.webhookWithoutEndpoint
        batch.configTime += second.batch.configTime
        batch.prepareTime += second.batch.prepareTime
        batch.renderTime += second.batch.renderTime
        plannedEmails.formUnion(second.plannedEmails)
        countedAsInFlight.formUnion(second.countedAsInFlight)
        nextUnit = unitsBefore + (second.firstRound.map { $0.range.upperBound } ?? 0)
        if nextUnit > 0 {
            var rendered = firstRound?.rendered ?? []
            firstRound = nil
            rendered += second.firstRound?.rendered ?? []
            firstRound = RoundToRender(range: 0..<nextUnit, rendered: rendered)
        }
    }

    /// Where the last email that ends among the units in `range` ends (one past its last unit); nil if none does.
    func endOfLastEmail(in range: Range<Int>) -> Int? {
        range.reversed().first { units[$0].isLast }.map { $0 + 1 }
    }

    /// The partitions of the events of the units in `range`.
    func eventPartitions(of range: Range<Int>) -> Set<Int32> {
        Set(units[range].lazy.map { records[$0.index].partition })
    }

    /// The next round's units (about `limit` devices, at least one unit); nil when every unit is taken.
    mutating func takeRound(devices limit: Int) -> Range<Int>? {
        guard nextUnit < units.count else { return nil }
        let start = nextUnit
        var devices = 0
        while nextUnit < units.count, devices < limit || nextUnit == start {
            devices += units[nextUnit].work?.devices.count ?? 0
            nextUnit += 1
        }
        return start..<nextUnit
    }
}

/// A round of units, and its rendering when done ahead.
struct RoundToRender: Sendable {
    var range: Range<Int>
    var rendered: [Result<[Output], RenderError>?]?
}
