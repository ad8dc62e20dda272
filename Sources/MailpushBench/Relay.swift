import ArgumentParser
import Foundation
import MailpushKafka
import MailpushPartition

/// `MailpushBench relay --brokers B --jobs-per-event N`: the floor of `make bench`'s steady-load latency.
///
/// The least a service in mailpush's place does: it reads `email.received` and writes, for each event, N
/// records of a job's size to the jobs topic, each with the `mailpush-source` header the bench's consumer
/// matches to its event. No parsing, no state, no crypto, no commit. Its consumer fetches like mailpush's
/// (`fetch.wait.max.ms` 1: the development broker holds an empty fetch for the whole wait) and its producer
/// is idempotent, does not linger, and sends one request at a time as mailpush's does on the development broker
/// (`max.in.flight` 1; with librdkafka's 5 the relay's p99 under the steady load was 150–160 ms, with 1 57–63 ms,
/// two pairs of runs), so what mailpush adds on top of it is mailpush's own doing.
///
/// Batches are sent without waiting for the previous one's acknowledgements (up to `sendsInFlight` at once):
/// with nothing to commit there is nothing to wait for, and the bench stamps a job when it is produced.
/// Records of two batches in flight may interleave; the bench reads no order.
struct Relay: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "MailpushBench relay",
        abstract: "The bare relay: email.received in, N job-sized records out per event, nothing else.")

    @Option(help: "Bootstrap servers (HOST:PORT).") var brokers: String
    @Option(help: "Records written per event.") var jobsPerEvent = 3
    /// For experiments: applied to both clients, last.
    @Option(name: .customShort("X"), help: ArgumentHelp("A librdkafka property for both clients (repeatable).", valueName: "key=value"))
    var properties: [String] = []

    var eventsTopic: String { "email.received" }
    var jobsTopic: String { "mailpush.push-jobs" }
    static let jobBytes = 1_200
    static let sendsInFlight = 8

    mutating func validate() throws {
        guard jobsPerEvent > 0 else { throw ValidationError("--jobs-per-event must be at least 1, got \(jobsPerEvent)") }
        if let bad = properties.first(where: { !$0.contains("=") }) { throw ValidationError("-X: expected key=value, got \(bad)") }
    }

    /// The `-X` properties by name (`validate` saw an `=` in each).
    var librdkafkaProperties: [String: String] {
        Dictionary(
            properties.map { property in
                let parts = property.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                return (String(parts[0]), parts.count > 1 ? String(parts[1]) : "")
            }, uniquingKeysWith: { _, last in last })
    }

    func relay() async throws {
        let cluster = try KafkaCluster(configuration: KafkaConfiguration(bootstrapServers: brokers))
        guard let partitions = try await cluster.partitionCount(topic: eventsTopic, timeout: .seconds(30)) else {
            FileHandle.standardError.write(Data("MailpushBench relay: topic \(eventsTopic) does not exist on \(brokers)\n".utf8))
            Foundation.exit(1)
        }
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(
                bootstrapServers: brokers, properties: ["fetch.wait.max.ms": "1"].merging(librdkafkaProperties) { _, explicit in explicit })
        )
        try consumer.assign(
            Dictionary(
                uniqueKeysWithValues: (0..<Int32(partitions)).map {
                    (TopicPartition(topic: eventsTopic, partition: $0), StartOffset.beginning)
                }))
        let producer = try KafkaProducer(
            configuration: KafkaConfiguration(
                bootstrapServers: brokers,
                properties: ["linger.ms": "0", "max.in.flight": "1"].merging(librdkafkaProperties) { _, explicit in explicit }))
        await producer.prepare(topics: [jobsTopic])
        FileHandle.standardOutput.write(
            Data("ready: relaying \(eventsTopic) (\(partitions) partitions) to \(jobsTopic), \(jobsPerEvent) jobs per event\n".utf8))

        let value = [UInt8](repeating: UInt8(ascii: "j"), count: Self.jobBytes)
        try await withThrowingTaskGroup(of: Void.self) { sends in
            var inFlight = 0
            while true {
                let events = try await consumer.poll(maxRecords: 2_000, timeout: .milliseconds(100))
                if events.isEmpty { continue }
                var jobs: [OutgoingRecord] = []
                jobs.reserveCapacity(events.count * jobsPerEvent)
                for event in events {
                    let source = [
                        KafkaHeader(key: "mailpush-source", value: Array("\(event.topic)/\(event.partition)/\(event.offset)".utf8))
                    ]
                    for device in 0..<jobsPerEvent {
                        jobs.append(
                            OutgoingRecord(
                                topic: jobsTopic, key: (event.key ?? []) + Array("/\(device)".utf8), value: value, headers: source))
                    }
                }
                if inFlight == Self.sendsInFlight {
                    try await sends.next()
                    inFlight -= 1
                }
                sends.addTask { try Self.check(await producer.send(jobs, timeout: .seconds(30))) }
                inFlight += 1
            }
        }
    }

    /// A job that did not land would leave the bench waiting for it: the relay stops, naming the error.
    static func check(_ results: [DeliveryResult]) throws {
        if let failed = results.first(where: { $0.error != nil }), let error = failed.error { throw error }
    }
}
