import ArgumentParser
import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushPipeline
import MailpushState

struct ReplayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "replay",
        abstract: "Re-read a range of the events topic for backfill, with progress.",
        discussion: """
            Emails processed inside the dedupe window are skipped unless --force. Safe beside `mailpush run` on the
            same --state-dir: the replay is recorded in the state, and the one process that holds the directory
            executes it — the running service between its batches, or this command when no service runs. A replay
            interrupted by a crash resumes from its last committed batch. --dry-run writes nothing to Kafka (with no
            service running, it first brings the state's copy of the config up to date, as a service start would).
            With a fleet (instances of a --group; found from the state topic) the replay goes through the state
            topic instead: every partition's owner executes its part, a partition that moves takes its progress with
            it, and this command follows the progress until every part is done (Ctrl-C stops following, not the replay).
            Example: mailpush replay --brokers B --from-time 2024-06-14T00:00:00Z --to-time 2024-06-15T00:00:00Z
            """)

    @OptionGroup var broker: BrokerOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var topicOptions: TopicOptions
    @OptionGroup var render: RenderFlags
    @OptionGroup var logging: LogOptions

    @Option(name: .customLong("partition"), help: "An event partition to replay (repeatable; default: all).") var partitions: [Int32] = []
    @Option(help: "First offset to read (in every chosen partition).") var fromOffset: Int64?
    @Option(help: "Offset to stop before (exclusive).") var toOffset: Int64?
    @Option(help: "Start at the first event at or after this time (epoch ms or ISO 8601).") var fromTime: String?
    @Option(help: "Stop at the first event at or after this time (epoch ms or ISO 8601).") var toTime: String?
    @Flag(help: "Process emails again even inside the dedupe window.") var force = false
    @Flag(help: "Read and render the range, count what it would write, and write nothing to Kafka.") var dryRun = false
    @Option(help: "The fleet's state topic: when a fleet runs on the events topic, the replay goes through it.") var stateTopic = Topics()
        .state

    func validate() throws {
        guard broker.brokers != nil else { throw ValidationError("--brokers is required for replay") }
        guard fromOffset == nil || fromTime == nil else { throw ValidationError("give --from-offset or --from-time, not both") }
        guard toOffset == nil || toTime == nil else { throw ValidationError("give --to-offset or --to-time, not both") }
        guard fromOffset != nil || fromTime != nil else { throw ValidationError("--from-offset or --from-time is required") }
        for (flag, value) in [("--from-time", fromTime), ("--to-time", toTime)] {
            if let value, TimeArgument.epochMilliseconds(value) == nil {
                throw ValidationError("\(flag): \"\(value)\" is neither epoch milliseconds nor ISO 8601")
            }
        }
        if let fromOffset, fromOffset < 0 { throw ValidationError("--from-offset must not be negative") }
        if let fromOffset, let toOffset, toOffset < fromOffset { throw ValidationError("--to-offset is before --from-offset") }
    }

    func run() async throws {
        logging.bootstrap()
        let logger = Logger(label: "mailpush.replay")
        var configuration = PipelineConfiguration(kafka: try broker.kafkaConfiguration(bootstrap: broker.brokers!, logger: logger))
        configuration.topics = topicOptions.topics
        configuration.render = render.renderOptions
        configuration.dedupeWindowSeconds = render.dedupeWindowSeconds

        let ranges: [ReplayRange]
        do {
            ranges = try await resolveRanges(configuration)
        } catch let error as ExitCode {
            throw error
        } catch let error as KafkaError where error.code == KafkaError.Code.invalidArgument {
            throw fail("Kafka client settings (-X / MAILPUSH_KAFKA_*): \(error)", ExitStatus.usage)
        } catch {
            throw fail("broker unreachable: \(error)", ExitStatus.unavailable)
        }
        FileHandle.standardError.write(
            Data("replay: \(ranges.map { "partition \($0.partition) [\($0.from), \($0.to))" }.joined(separator: ", "))\n".utf8))
        if !dryRun {
            let fleet: Bool
            do {
                fleet = try await FleetView.isFleet(
                    kafka: configuration.kafka, eventsTopic: configuration.topics.events, stateTopic: stateTopic,
                    timeout: .seconds(broker.startupTimeoutSeconds))
            } catch {
                throw fail("broker unreachable: \(error)", ExitStatus.unavailable)
            }
            if fleet {
                try await replayThroughFleet(ranges, configuration)
                return
            }
        }
        // A replay run here skips what the state directory records as processed: on a new one (a backfill with
        // a state of its own, or a mistyped --state-dir) every email of the range is processed.
        if !state.exists {
            FileHandle.standardError.write(
                Data(
                    ("replay: no state at \(state.stateDir) yet: no email is recorded as processed there, so every email "
                        + "of the range is processed (a replay beside a service needs its --state-dir)\n").utf8))
        }
        let store = try state.open()
        let replayer = Replayer(configuration: configuration, store: store, logger: logger)
        let display = ProgressDisplay(label: "replay")
        do {
            if dryRun {
                // With no other process here, the stored config is first brought up to date, as a service start
                // would; the lock is held for that only, so a service may start while the range is read. Beside a
                // running service, the stored config is the one it keeps current.
                if case .acquired(let lock) = try StateDirectoryLock.tryAcquire(directory: state.stateDir) {
                    try await replayer.catchUpConfig()
                    withExtendedLifetime(lock) {}
                }
                let summary = try await replayer.dryRun(ranges: ranges, force: force) { done, total, detail in
                    display.update(done: done, total: total, detail: detail)
                }
                display.finish()
                print("dry run, nothing written: \(summary)")
                return
            }
            // The request is recorded first: whichever process holds the state directory executes it, and
            // a crash of that process resumes it from its last committed batch.
            let id = try store.submitReplay(
                eventsTopic: configuration.topics.events,
                cursors: ranges.map { .init(partition: $0.partition, next: $0.from, end: $0.to) },
                force: force, nowMs: Int64(Date().timeIntervalSince1970 * 1000))
            let request = try await execute(id, replayer: replayer, store: store, display: display)
            display.finish()
            let counts = request.counts
            print(
                "replayed \(counts.eventsRead) events: \(counts.jobs) jobs, \(counts.deadLetters) dead letters, \(counts.duplicates) skipped as already processed"
            )
        } catch let error as ExitCode {
            display.finish()
            throw error
        } catch PipelineError.brokerUnreachable(let detail) {
            display.finish()
            throw fail(
                "broker unreachable: \(detail); the replay is recorded and resumes at the next replay or service start",
                ExitStatus.unavailable)
        } catch PipelineError.invalidConfiguration(let detail) {
            display.finish()
            throw fail(detail, ExitStatus.usage)
        } catch {
            display.finish()
            throw fail(
                "replay failed: \(error); the replay is recorded and resumes at the next replay or service start", ExitStatus.software)
        }
    }

    /// Runs request `id` here when the state directory is free; otherwise leaves it to the process that holds
    /// the directory (the service executes it between its batches) and follows its progress.
    private func execute(_ id: Int64, replayer: Replayer, store: StateStore, display: ProgressDisplay) async throws -> ReplayRequest {
        var announced = false
        while true {
            switch try StateDirectoryLock.tryAcquire(directory: state.stateDir) {
            case .acquired(let lock):
                try await replayer.executePending { request in
                    guard request.id == id else { return }
                    display.update(done: request.counts.eventsRead, total: request.eventsTotal, detail: Self.detail(request.counts))
                }
                withExtendedLifetime(lock) {}
            case .held(let pid):
                if !announced {
                    announced = true
                    FileHandle.standardError.write(
                        Data(
                            ("replay: \(state.inUseMessage(pid)); that process executes this replay "
                                + "(request \(id)) between its batches\n").utf8))
                }
                try await Task.sleep(for: .milliseconds(250))
            }
            guard let request = try store.replay(id: id) else {
                throw fail("replay request \(id) disappeared from \(store.path)", ExitStatus.software)
            }
            display.update(
                done: request.counts.eventsRead, total: request.eventsTotal, detail: Self.detail(request.counts),
                force: request.status != .pending)
            switch request.status {
            case .done: return request
            case .failed: throw fail("replay request \(id) failed: \(request.detail ?? "no detail")", ExitStatus.software)
            case .pending: continue
            }
        }
    }

    /// Hands the replay to the fleet through the state topic and follows its progress there.
    private func replayThroughFleet(_ ranges: [ReplayRange], _ configuration: PipelineConfiguration) async throws {
        let replayId = UUID().uuidString.lowercased()
        let events = configuration.topics.events
        let timeout = Duration.seconds(broker.startupTimeoutSeconds)
        let wanted = ranges.filter { $0.from < $0.to }
        let requested: [Int32: Int64]
        do {
            requested = try await FleetView.requestReplay(
                kafka: configuration.kafka, eventsTopic: events, stateTopic: stateTopic, replayId: replayId,
                ranges: wanted.map { ($0.partition, $0.from, $0.to) }, force: force, timeout: timeout)
        } catch {
            throw fail("broker: the replay could not be requested: \(error)", ExitStatus.unavailable)
        }
        FileHandle.standardError.write(
            Data("replay \(replayId): requested from the fleet through \(stateTopic); each partition's owner executes its part\n".utf8))
        let display = ProgressDisplay(label: "replay")
        let total = wanted.reduce(0) { $0 + Int($1.to - $1.from) }
        var parts: [FleetReplayPart] = []
        var lastDone = -1
        var lastProgress = ContinuousClock.now
        var toldStalled = false
        while true {
            do {
                parts = try await FleetView.replayProgress(
                    kafka: configuration.kafka, eventsTopic: events, stateTopic: stateTopic, replayId: replayId,
                    requested: requested, timeout: timeout)
            } catch {
                display.finish()
                throw fail("broker: following the replay failed: \(error); the fleet goes on executing it", ExitStatus.unavailable)
            }
            let done = parts.reduce(0) { $0 + Int(min($1.next, $1.end) - $1.from) }
            var counts = ReplayRequest.Counts()
            for part in parts {
                counts.eventsRead += part.events
                counts.jobs += part.jobs
                counts.deadLetters += part.deadLetters
                counts.duplicates += part.duplicates
            }
            display.update(done: done, total: total, detail: Self.detail(counts))
            if done != lastDone {
                lastDone = done
                lastProgress = .now
                toldStalled = false
            } else if !toldStalled, ContinuousClock.now - lastProgress > Self.stalledNotice {
                // Nothing has moved: most likely no member of the fleet runs. The request waits in the state
                // topic; say so once rather than follow it silently.
                toldStalled = true
                let finished = Set(parts.filter(\.isDone).map(\.partition))
                let waiting = wanted.map(\.partition).filter { !finished.contains($0) }.sorted()
                FileHandle.standardError.write(
                    Data(
                        ("\nreplay \(replayId): no progress for \(Self.stalledNotice.components.seconds) s on partitions \(waiting): "
                            + "is the fleet running (mailpush run with the same --group and topics)? The request stays in "
                            + "\(stateTopic) and each partition's owner executes it when it runs; Ctrl-C stops following it, "
                            + "not the replay.\n").utf8))
            }
            if parts.count == wanted.count, parts.allSatisfy(\.isDone) {
                display.finish()
                print(
                    "replayed \(counts.eventsRead) events: \(counts.jobs) jobs, \(counts.deadLetters) dead letters, \(counts.duplicates) skipped as already processed"
                )
                return
            }
            try await Task.sleep(for: .milliseconds(500))
        }
    }

    /// How long a replay through the fleet may show no progress before the command says what it waits for.
    static let stalledNotice = Duration.seconds(30)

    static func detail(_ counts: ReplayRequest.Counts) -> String {
        "\(counts.jobs) jobs, \(counts.deadLetters) dead letters, \(counts.duplicates) skipped as already processed"
    }

    private func resolveRanges(_ configuration: PipelineConfiguration) async throws -> [ReplayRange] {
        let cluster = try KafkaCluster(configuration: configuration.kafka)
        let timeout = Duration.seconds(broker.startupTimeoutSeconds)
        try await cluster.waitUntilReachable(timeout: timeout)
        let topic = topicOptions.eventsTopic
        guard let count = try await cluster.partitionCount(topic: topic, timeout: timeout) else {
            throw fail("--events-topic: topic \(topic) does not exist", ExitStatus.usage)
        }
        // A partition named twice is replayed once (it was recorded twice, and the state database refused that).
        let chosen = partitions.isEmpty ? Array(0..<Int32(count)) : Set(partitions).sorted()
        if let bad = chosen.first(where: { $0 < 0 || $0 >= count }) {
            throw fail("--partition \(bad): \(topic) has partitions 0…\(count - 1)", ExitStatus.usage)
        }
        let topicPartitions = chosen.map { TopicPartition(topic: topic, partition: $0) }
        let ends = try await cluster.endOffsets(topicPartitions, timeout: timeout)
        let starts = try await cluster.beginningOffsets(topicPartitions, timeout: timeout)
        let fromTimes = try await fromTime.flatMap(TimeArgument.epochMilliseconds).asyncMap {
            try await cluster.offsets(forTimestampMs: $0, topicPartitions, timeout: timeout)
        }
        let toTimes = try await toTime.flatMap(TimeArgument.epochMilliseconds).asyncMap {
            try await cluster.offsets(forTimestampMs: $0, topicPartitions, timeout: timeout)
        }
        return topicPartitions.map { partition in
            let end = ends[partition] ?? 0
            let from = max(fromOffset ?? fromTimes?[partition] ?? 0, starts[partition] ?? 0)
            let to = min(toOffset ?? toTimes?[partition] ?? end, end)
            return ReplayRange(partition: partition.partition, from: from, to: max(from, to))
        }
    }
}

extension Optional {
    func asyncMap<T>(_ transform: (Wrapped) async throws -> T) async rethrows -> T? {
        guard let value = self else { return nil }
        return try await transform(value)
    }
}
