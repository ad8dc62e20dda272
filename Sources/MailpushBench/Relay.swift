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
struct Relay {
    var brokers = ""
    var jobsPerEvent = 3
    var eventsTopic = "email.received"
    var jobsTopic = "mailpush.push-jobs"
    /// `-X key=value`: librdkafka properties for both clients, applied last (for experiments).
    var properties: [String: String] = [:]

    static let jobBytes = 1_200
    static let sendsInFlight = 8
    static let usage = "usage: MailpushBench relay --brokers HOST:PORT [--jobs-per-event N] [-X key=value]…"

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            guard let value = iterator.next() else { fatalError(Self.usage) }
            switch argument {
            case "--brokers": brokers = value
            case "--jobs-per-event":
                guard let count = Int(value), count > 0 else { fatalError("--jobs-per-event must be a positive number, got \(value)") }
                jobsPerEvent = count
            case "-X":
                guard let equals = value.firstIndex(of: "=") else { fatalError("-X: expected key=value, got \(value)") }
                properties[String(value[..<equals])] = String(value[value.index(after: equals)...])
            default: fatalError("unknown option \(argument)\n\(Self.usage)")
            }
        }
        if brokers.isEmpty { fatalError(Self.usage) }
    }

    func run() async throws {
        let cluster = try KafkaCluster(configuration: KafkaConfiguration(bootstrapServers: brokers))
        guard let partitions = try await cluster.partitionCount(topic: eventsTopic, timeout: .seconds(30)) else {
            fatalError("topic \(eventsTopic) does not exist on \(brokers)")
        }
        let consumer = try KafkaConsumer(
            configuration: KafkaConfiguration(
                bootstrapServers: brokers, properties: ["fetch.wait.max.ms": "1"].merging(properties) { _, explicit in explicit }))
        try consumer.assign(
            Dictionary(
                uniqueKeysWithValues: (0..<Int32(partitions)).map {
                    (TopicPartition(topic: eventsTopic, partition: $0), StartOffset.beginning)
                }))
        let producer = try KafkaProducer(
            configuration: KafkaConfiguration(
                bootstrapServers: brokers,
                properties: ["linger.ms": "0", "max.in.flight": "1"].merging(properties) { _, explicit in explicit }))
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
