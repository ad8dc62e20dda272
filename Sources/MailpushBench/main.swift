import ArgumentParser
import ExtrasBase64
import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushMultiBufferRSA
import MailpushPartition
import MailpushPipeline
import MailpushState
import Synchronization
import _CryptoExtras

// `make bench`: how close the whole pipeline comes to the machine's sealing limit.
// Every figure is the median of --runs runs made in this one process, so they share the machine's mood.
// `MailpushBench relay …` is the bare relay that `make bench` measures beside the service (Relay.swift).

struct Options: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "MailpushBench",
        abstract: "Measures each stage of a job in-process, and the pipeline, against the machine's sealing limit.",
        discussion: "`MailpushBench relay --help`: the bare relay `make bench` measures beside the service.")

    @Option(help: "Events of the in-process pipeline runs.") var events = 40_000
    @Option(help: "Devices of each owner in the pipeline runs.") var devicesPerOwner = 2
    @Option(help: "Owners in the pipeline runs.") var owners = 200
    @Option(help: "Runs of each measurement (the median is reported).") var runs = 3
    /// A service's window fills up: the state stage is measured again with this many entries in it first.
    @Option(help: "Dedupe entries the state stage's store holds before it is measured again (0: only the empty window).")
    var dedupeEntries = 0
    /// `make bench` measures the pipeline as separate processes, and passes 0.
    @Option(help: "In-process pipeline runs (default: --runs; 0 skips them).") var pipelineRuns: Int?

    mutating func validate() throws {
        for (name, value, least) in [
            ("--events", events, 1), ("--devices-per-owner", devicesPerOwner, 1), ("--owners", owners, 1), ("--runs", runs, 1),
            ("--dedupe-entries", dedupeEntries, 0), ("--pipeline-runs", pipelineRuns ?? 0, 0),
        ] where value < least {
            throw ValidationError("\(name) must be at least \(least), got \(value)")
        }
    }
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

func measure(_ runs: Int, _ body: () async throws -> Double) async rethrows -> (median: Double, all: [Double]) {
    var results: [Double] = []
    for _ in 0..<runs { results.append(try await body()) }
    return (median(results), results)
}

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

if CommandLine.arguments.dropFirst().first == "relay" {
    try await Relay.parseOrExit(Array(CommandLine.arguments.dropFirst(2))).relay()
    exit(0)
}

let options = Options.parseOrExit()
let cores = ProcessInfo.processInfo.activeProcessorCount
LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = ProcessInfo.processInfo.environment["BENCH_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .error
    return handler
}

let privateKey = try _RSA.Encryption.PrivateKey(keySize: .bits2048)
let spki = privateKey.publicKey.derRepresentation.base64EncodedString()
func keyRecord(_ address: String, owner: String) -> String {
    #"{"emailAddressId":"\#(address)","owner":"\#(owner)","keyId":"k-\#(address)","algorithm":"RSAEncryptionOAEPAESCBC","keyFormat":"SPKI","publicKey":"\#(spki)"}"#
}
func deviceRecord(_ deviceId: String, owner: String, android: Bool) -> String {
    let target = android ? #""platform":"android","pushToken":"fcm-\#(deviceId)""# : #""platform":"ios","pushToken":"apns-\#(deviceId)""#
    return
        #"{"deviceId":"\#(deviceId)","owner":"\#(owner)","bundleId":"com.example.mail",\#(target),"filter":[{"serviceName":"emService","actionType":"DISABLE","rule":"{\"!=\":[{\"var\":\"meta.type\"},\"messageReceived\"]}"},{"serviceName":"emService","actionType":"ENABLE","rule":"{\"==\":[1,1]}"}]}"#
}
func eventRecord(_ index: Int, owner: Int) -> String {
    #"{"type":"messageReceived","owner":"user-\#(owner)","emailAddressId":"em-\#(owner)","sudoId":"sudo-\#(owner)","messageId":"msg-\#(index)","folderId":"em-\#(owner)-INBOX","encryptionStatus":"UNENCRYPTED","subject":"Quarterly report \#(index)","from":{"emailAddress":"alice@example.com","displayName":"Alice Example"},"hasAttachments":false,"sentAtEpochMs":1718330537000,"receivedAtEpochMs":1718330541336}"#
}

print(
    "mailpush benchmark: \(options.events) events × \(options.devicesPerOwner) devices, \(options.owners) owners, \(options.runs) runs, \(cores) cores"
)

// 1. The sealing limit: one RSA-2048 OAEP encryption per job is the floor of a job's cost.
let aesKey = [UInt8](repeating: 7, count: 32)
let sealCount = 4000
let sealRate = try await measure(options.runs) {
    let start = ContinuousClock.now
    for _ in 0..<sealCount { _ = try privateKey.publicKey.encrypt(aesKey, padding: .PKCS1_OAEP) }
    return Double(sealCount) / seconds(ContinuousClock.now - start)
}
let sealingLimit = sealRate.median * Double(cores)

// 2. Rendering one job (plaintext, size budget, seal, JSON) on one core.
let addressKey = try AddressKey.decode(Array(keyRecord("em-0", owner: "user-0").utf8))
let device = try DeviceRegistration.decode(Array(deviceRecord("dev-0", owner: "user-0", android: false).utf8))
let event = try EmailReceived.decode(Array(eventRecord(0, owner: 0).utf8))
let renderer = JobRenderer(options: RenderOptions())
let source = SourceRef(topic: "email.received", partition: 0, offset: 0)
let renderRate = try await measure(options.runs) {
    let start = ContinuousClock.now
    for _ in 0..<sealCount {
        _ = try renderer.render(event: event, device: device, key: addressKey, source: source, nowMs: 1_718_330_541_336)
    }
    return Double(sealCount) / seconds(ContinuousClock.now - start)
}

// 2b. Base64 of a ~2 KB sealed payload, the hand-written encoder (appending into the job's
// buffer, as the renderer does) against Foundation and swift-extras-base64 (each returning a
// new value, then appended). Whichever wins, base64 is a few microseconds of a job whose RSA
// seal alone takes tens; the hand-written decoder stays because ExtrasBase64's accepts non-zero
// trailing bits and odd padding, which must be refused.
let sealedPayload = (0..<2_048).map { UInt8(truncatingIfNeeded: $0 &* 131 &+ 7) }
let base64Count = 50_000
func base64Rate(_ encode: (inout [UInt8]) -> Void) async -> (median: Double, all: [Double]) {
    await measure(options.runs) {
        var buffer: [UInt8] = []
        buffer.reserveCapacity(4096)
        let start = ContinuousClock.now
        for _ in 0..<base64Count {
            buffer.removeAll(keepingCapacity: true)
            encode(&buffer)
        }
        precondition(buffer.count == MailpushCore.Base64.encodedLength(sealedPayload.count))
        return Double(base64Count) / seconds(ContinuousClock.now - start)
    }
}
let base64HandWritten = await base64Rate { MailpushCore.Base64.encode(sealedPayload, into: &$0) }
let sealedData = Data(sealedPayload)
let base64Foundation = await base64Rate { $0.append(contentsOf: sealedData.base64EncodedData()) }
let base64Extras = await base64Rate { $0.append(contentsOf: ExtrasBase64.Base64.encodeToBytes(bytes: sealedPayload)) }

// 2c. Where a job's CPU goes, stage by stage (µs per job, one core, in-process), for the mix the service
// benchmark drains: one iOS and two Android devices per event. Each stage runs alone over many jobs; its
// process CPU (all threads) is divided by the jobs it stands for. Per-event stages (parse, dedupe key,
// state) are shared by an event's jobs.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}
/// CPU µs per unit of `body`, which does `units` units (median of the runs).
func cpuMicros(units: Int, _ body: () async throws -> Void) async rethrows -> Double {
    try await measure(options.runs) {
        let before = processCPUSeconds()
        try await body()
        return (processCPUSeconds() - before) * 1e6 / Double(units)
    }.median
}
let jobsPerEvent = 3.0
let stageEvents = (0..<2_000).map { Array(eventRecord($0, owner: $0 % 200).utf8) }
let decodedEvents = try stageEvents.map { try EmailReceived.decode($0) }
let iosDevice = device
let androidDevice = try DeviceRegistration.decode(Array(deviceRecord("dev-1", owner: "user-0", android: true).utf8))
let mix = [iosDevice, androidDevice, androidDevice]
let parseMicros = try await cpuMicros(units: stageEvents.count * 10) {
    for _ in 0..<10 { for bytes in stageEvents { _ = DedupeKey.of(try EmailReceived.decode(bytes)) } }
}
let filterMicros = await cpuMicros(units: decodedEvents.count * mix.count * 10) {
    var wanted = 0
    for _ in 0..<10 {
        for event in decodedEvents {
            let meta = FilterMeta(event: event, keyId: addressKey.keyId)
            for device in mix where device.filter.wantsNotification(for: meta) { wanted += 1 }
        }
    }
    precondition(wanted > 0)
}
let plaintext = notificationPlaintext(event)
// The seal as the service makes it by default: the RSA operations of 24 jobs together, eight a call, when Intel's
// libcrypto_mb loads here (`--rsa-multi-buffer auto`), else one at a time.
let multiBuffer = try? MultiBufferRSA.load().get()
var serviceRenderOptions = RenderOptions()
serviceRenderOptions.multiBufferRSA = multiBuffer
let serviceRenderer = JobRenderer(options: serviceRenderOptions)
let takeJobs = 24
let sealMicros = try await cpuMicros(units: sealCount / takeJobs * takeJobs) {
    for _ in 0..<sealCount / takeJobs {
        for encrypted in serviceRenderer.encryptFreshKeys(for: Array(repeating: addressKey, count: takeJobs)) {
            _ = try Sealer.sealRaw(plaintext, with: addressKey, encryptedKey: encrypted)
        }
    }
}
// An email's jobs are rendered together, as the service does: what they share is worked out once.
let renderMicros = try await cpuMicros(units: sealCount / takeJobs * takeJobs) {
    for take in 0..<sealCount / takeJobs {
        var encrypted = serviceRenderer.encryptFreshKeys(for: Array(repeating: addressKey, count: takeJobs))[...]
        for index in 0..<takeJobs / mix.count {
            let email = serviceRenderer.prepare(
                event: decodedEvents[(take * takeJobs / mix.count + index) % decodedEvents.count], key: addressKey)
            for device in mix {
                _ = try serviceRenderer.render(
                    email, device: device, source: source, nowMs: 1_718_330_541_336, encryptedKey: encrypted.popFirst() ?? nil)
            }
        }
    }
}
// Produce: jobs of the usual size to an in-process development broker, in batches as the service sends
// them; the broker's threads are in this process, so their CPU counts here too.
let produceMicros: Double
do {
    let cluster = try MockKafkaCluster(brokers: 1, defaultPartitions: 4)
    defer { cluster.close() }
    try cluster.createTopic("jobs", partitions: 4)
    let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
    let job = try renderer.render(event: event, device: androidDevice, key: addressKey, source: source, nowMs: 0)
    let batch = (0..<2_000).map { index in
        OutgoingRecord(
            topic: "jobs", key: Array("dev-\(index % 600)".utf8), value: job.value,
            headers: [
                KafkaHeader(key: "mailpush-source", value: Array("email.received/0/\(index)".utf8)),
                KafkaHeader(key: "mailpush-job-id", value: Array(job.jobId.utf8)),
            ])
    }
    _ = try await producer.send(batch, timeout: .seconds(30)) // connections and metadata, not counted
    produceMicros = try await cpuMicros(units: batch.count * 5) {
        for _ in 0..<5 { _ = try await producer.send(batch, timeout: .seconds(30)) }
    }
}
// State: a batch's commit (dedupe entries, offsets, marks), its dedupe lookup and the checkpoint that copies the
// log back (the service runs one every half second), per job; and the bytes it writes per event. `entries` fills the
// dedupe window first, in the order a service enters them: every new entry lands on a random leaf of the
// window's B-tree, so a full window costs more per event than the empty one of the drain. With `expiring`, the window
// is a service's older than its dedupe window, whose expiry sweeps the keys in order (`StateStore.expireProcessedEmails(slice:…)`),
// a pass every seventh of the window: an eighth of the entries are due, and each batch is followed by the sweep of
// the slice of keys that holds about as many due entries as the batch entered.
struct StateCost {
    var microsPerJob: Double
    var bytesPerEvent: Double
}
func stateCost(entries: Int, expiring: Bool = false) async throws -> StateCost {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("mailpush-bench-state-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let store = try StateStore(directory: directory, checkpointsInBackground: true)
    let nowMs: Int64 = 1_718_330_541_336
    let partition = TopicPartition(topic: "email.received", partition: 0)
    let marks = TopicPartition(topic: "mailpush.push-jobs", partition: 0)
    for start in stride(from: 0, to: entries, by: 8_000) {
        let keys = (start..<min(start + 8_000, entries)).map { DedupeKey.make(emailAddressId: "em-fill", messageId: "m-\($0)") }
        // Over the day before the measured batches.
        let processedAtMs = nowMs - 86_400_000 + Int64(start) * 86_400_000 / Int64(entries)
        try store.commitEventBatch(
            offsets: [partition: Int64(start)], processedEmails: keys, processedAtMs: processedAtMs, outputMarks: [:])
        _ = try await store.checkpoint()
    }
    let eventsPerBatch = 667 // about 2,000 jobs
    var batchNumber = 0
    let writtenBefore = bytesWritten()
    let micros = try await cpuMicros(units: eventsPerBatch * 3 * 20) {
        for _ in 0..<20 {
            let keys = (0..<eventsPerBatch).map { DedupeKey.make(emailAddressId: "em-\(batchNumber)", messageId: "m-\($0)") }
            let batchMs = nowMs + Int64(batchNumber) * 100
            _ = try store.processedEmails(among: keys, nowMs: batchMs, windowMs: 7 * 86_400_000)
            try store.commitEventBatch(
                offsets: [partition: Int64(batchNumber * eventsPerBatch)], processedEmails: keys, processedAtMs: batchMs,
                outputMarks: [marks: Int64(batchNumber)])
            batchNumber += 1
            if expiring {
                // The fill entered `entries` over a day: its oldest eighth is due.
                let slices = min(1 << 12, max(1, entries / 8 / eventsPerBatch))
                _ = try await store.expireProcessedEmails(slice: batchNumber % slices, of: slices, beforeMs: nowMs - 86_400_000 * 7 / 8)
            }
        }
        _ = try await store.checkpoint()
    }
    let written = Double(bytesWritten() - writtenBefore) / Double(eventsPerBatch * 20 * options.runs)
    return StateCost(microsPerJob: micros, bytesPerEvent: written)
}
/// Bytes this process has passed to `write` and its kind (Linux's `/proc/self/io`, `wchar`); 0 elsewhere.
func bytesWritten() -> Int {
    guard let io = try? String(contentsOfFile: "/proc/self/io", encoding: .utf8) else { return 0 }
    let line = io.split(separator: "\n").first { $0.hasPrefix("wchar:") }
    return line.flatMap { Int($0.dropFirst("wchar:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
}
let emptyWindow = try await stateCost(entries: 0)
let fullWindow = options.dedupeEntries > 0 ? try await stateCost(entries: options.dedupeEntries) : nil
let expiringWindow = options.dedupeEntries > 0 ? try await stateCost(entries: options.dedupeEntries, expiring: true) : nil
let stateMicros = emptyWindow.microsPerJob
let stages: [(String, Double)] = [
    ("parse", parseMicros / jobsPerEvent), ("filter", filterMicros), ("seal", sealMicros),
    ("render", renderMicros - sealMicros), ("produce", produceMicros), ("state", stateMicros),
]

// 3. The pipeline end to end: mock cluster, real SQLite, all cores.
func pipelineRun() async throws -> PipelineRun {
    let cluster = try MockKafkaCluster(brokers: 1, defaultPartitions: 4)
    defer { cluster.close() }
    let topics = Topics()
    for topic in topics.all { try cluster.createTopic(topic, partitions: 4) }
    let kafka = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)
    let producer = try KafkaProducer(configuration: kafka)
    var config: [OutgoingRecord] = []
    for owner in 0..<options.owners {
        config.append(
            OutgoingRecord(
                topic: topics.addressKeys, key: Array("em-\(owner)".utf8),
                value: Array(keyRecord("em-\(owner)", owner: "user-\(owner)").utf8), headers: []))
        for index in 0..<options.devicesPerOwner {
            let deviceId = "dev-\(owner)-\(index)"
            config.append(
                OutgoingRecord(
                    topic: topics.devices, key: Array(deviceId.utf8),
                    value: Array(deviceRecord(deviceId, owner: "user-\(owner)", android: index % 2 == 1).utf8), headers: []))
        }
    }
    _ = try await producer.send(config, timeout: .seconds(60))
    var events: [OutgoingRecord] = []
    for index in 0..<options.events {
        let owner = index % options.owners
        events.append(
            OutgoingRecord(
                topic: topics.events, key: Array("em-\(owner)".utf8), value: Array(eventRecord(index, owner: owner).utf8), headers: []))
    }
    for chunk in stride(from: 0, to: events.count, by: 5000) {
        _ = try await producer.send(Array(events[chunk..<min(chunk + 5000, events.count)]), timeout: .seconds(60))
    }

    let stateDir = FileManager.default.temporaryDirectory.appendingPathComponent("mailpush-bench-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: stateDir) }
    let store = try StateStore(directory: stateDir)
    var configuration = PipelineConfiguration(kafka: kafka)
    configuration.render.multiBufferRSA = multiBuffer
    let pipeline = Pipeline(configuration: configuration, store: store, logger: Logger(label: "bench"))
    let expected = Int64(options.events * options.devicesPerOwner)
    let jobPartitions = (0..<4).map { TopicPartition(topic: topics.jobs, partition: Int32($0)) }
    let metadata = try KafkaCluster(configuration: kafka)
    let stop = Atomic<Bool>(false)

    let start = ContinuousClock.now
    let task = Task { try await pipeline.run(startupTimeout: .seconds(10)) { stop.load(ordering: .relaxed) } }
    var firstJob: ContinuousClock.Instant?
    var firstCount: Int64 = 0
    while true {
        let written = try await metadata.endOffsets(jobPartitions, timeout: .seconds(10)).values.reduce(0, +)
        if firstJob == nil && written > 0 { (firstJob, firstCount) = (.now, written) }
        if written >= expected { break }
        try await Task.sleep(for: .milliseconds(10))
    }
    let end = ContinuousClock.now
    stop.store(true, ordering: .relaxed)
    try await task.value
    return PipelineRun(
        total: Double(expected) / seconds(end - start),
        steady: Double(expected - firstCount) / seconds(end - firstJob!))
}

struct PipelineRun {
    /// From start-up (state opened, config read, producer warm-up) to the last job.
    var total: Double
    /// From the first job written to the last: the rate a running service sustains.
    var steady: Double
}

var pipelineRuns: [PipelineRun] = []
for _ in 0..<(options.pipelineRuns ?? options.runs) { pipelineRuns.append(try await pipelineRun()) }

func format(_ rate: Double) -> String { String(format: "%9.0f/s", rate) }
func formatAll(_ rates: [Double]) -> String { rates.map { String(format: "%.0f", $0) }.joined(separator: ", ") }
print("")
print("                                   median      runs")
print("RSA-OAEP seal, 1 core           \(format(sealRate.median))   \(formatAll(sealRate.all))")
print("sealing limit, \(cores) cores          \(format(sealingLimit))")
print("render job (seal+JSON), 1 core  \(format(renderRate.median))   \(formatAll(renderRate.all))")
print("the service's RSA: \(multiBuffer?.description ?? "one at a time (libcrypto_mb not loaded)")")
print("base64 2 KB, hand-written       \(format(base64HandWritten.median))   \(formatAll(base64HandWritten.all))")
print("base64 2 KB, Foundation         \(format(base64Foundation.median))   \(formatAll(base64Foundation.all))")
print("base64 2 KB, ExtrasBase64       \(format(base64Extras.median))   \(formatAll(base64Extras.all))")
if !pipelineRuns.isEmpty {
    let pipelineRate = (median: median(pipelineRuns.map(\.steady)), all: pipelineRuns.map(\.steady))
    let pipelineTotal = (median: median(pipelineRuns.map(\.total)), all: pipelineRuns.map(\.total))
    print("pipeline, jobs, steady state    \(format(pipelineRate.median))   \(formatAll(pipelineRate.all))")
    print("pipeline, jobs, incl. start-up   \(format(pipelineTotal.median))   \(formatAll(pipelineTotal.all))")
    print(String(format: "pipeline (steady) / sealing limit: %.2f", pipelineRate.median / sealingLimit))
}
print(String(format: "render / seal (1 core):          %.2f", renderRate.median / sealRate.median))
print("")
print("CPU µs per job, by stage (1 iOS + 2 Android per event, one core)")
for (name, micros) in stages + [("sum", stages.reduce(0) { $0 + $1.1 })] {
    print("  " + name.padding(toLength: 9, withPad: " ", startingAt: 0) + String(format: "%6.2f", micros))
}
print(String(format: "state, empty dedupe window: %.2f µs per job, writes %.0f bytes per event", stateMicros, emptyWindow.bytesPerEvent))
for (window, label) in [(fullWindow, " before"), (expiringWindow, ", swept as it expires")] {
    guard let window else { continue }
    print(
        "state, \(options.dedupeEntries) dedupe entries\(label): "
            + String(format: "%.2f µs per job, writes %.0f bytes per event", window.microsPerJob, window.bytesPerEvent))
}
// One machine-readable line for bench/bench.py.
let rsaDescription = multiBuffer?.description ?? "one at a time (swift-crypto; libcrypto_mb not loaded)"
print(
    "json: {\"sealPerSecond\": \(sealRate.median), \"renderPerSecond\": \(renderRate.median), \"cores\": \(cores), "
        + "\"stageMicrosPerJob\": {\(stages.map { "\"\($0.0)\": \($0.1)" }.joined(separator: ", "))}, "
        + "\"stateBytesPerEvent\": \(emptyWindow.bytesPerEvent), \"rsa\": \"\(rsaDescription)\""
        + [("fullWindow", fullWindow), ("expiringWindow", expiringWindow)].compactMap { name, window in
            window.map {
                ", \"\(name)\": {\"dedupeEntries\": \(options.dedupeEntries), \"stateMicrosPerJob\": \($0.microsPerJob), "
                    + "\"stateBytesPerEvent\": \($0.bytesPerEvent)}"
            }
        }.joined() + "}")
