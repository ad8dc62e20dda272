import ArgumentParser
import Foundation
import Logging
import MailpushKafka
import MailpushPipeline
import MailpushState
import Metrics
import Prometheus
import ServiceLifecycle
import Synchronization

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run the service: consume events and config, produce push jobs and dead letters.")

    @OptionGroup var broker: BrokerOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var topicOptions: TopicOptions
    @OptionGroup var render: RenderFlags
    @OptionGroup var logging: LogOptions

    @Option(help: "Port of /healthz, /readyz and /metrics.") var httpPort: Int = 8080
    @Option(help: "Consumer group of the fleet (group ownership, the default): instances of one group share the event partitions.")
    var group: String = "mailpush"
    @Option(
        help: """
            Static membership: this member's stable identity in the group (librdkafka's group.instance.id), e.g. \
            the pod name. A member that restarts with the same id within the session timeout gets its partitions \
            back without a rebalance (on brokers that implement static membership; the development broker does not).
            """)
    var groupInstanceId: String?
    @Option(help: "How long the group keeps the partitions of a member it does not hear from (session.timeout.ms).")
    var groupSessionTimeoutMs: Int = Int(GroupSettings(id: "-").sessionTimeout.components.seconds * 1000)
    @Option(help: "Compacted topic through which partition state moves between the fleet's instances.") var stateTopic = Topics().state
    @Option(help: "This instance's index, 0-based (static partition ownership instead of a group).") var instance: Int?
    @Option(help: "Number of instances sharing the event partitions statically (with --instance).") var instances: Int?
    @Option(
        help: .init(
            "Most events processed and committed as one batch (one poll takes at most \(PipelineConfiguration.pollRecordsLimit)"
                + ", and a batch about \(PipelineConfiguration.defaultMaxBatchBytes >> 20) MiB)."))
    var batchSize: Int = 8000
    @Option(help: "Where event partitions without a stored offset start: earliest or latest.") var startFrom: String = "earliest"
    @Option(help: "On SIGTERM/SIGINT, time to finish the batch in flight, flush and commit before exiting.") var shutdownGraceSeconds: Int =
        25
    @Option(help: "/healthz fails once the pipeline has shown no progress for this long.") var livenessTimeoutSeconds: Int = 120

    /// `--instance`/`--instances` given: static ownership instead of a group.
    var isStatic: Bool { instance != nil || instances != nil }

    func validate() throws {
        guard (0...65535).contains(httpPort) else { throw ValidationError("--http-port must be 0…65535, got \(httpPort)") }
        if isStatic {
            let instances = self.instances ?? 1
            let instance = self.instance ?? 0
            guard instances >= 1 else { throw ValidationError("--instances must be at least 1, got \(instances)") }
            guard (0..<instances).contains(instance) else {
                throw ValidationError("--instance must be in 0…\(instances - 1) for --instances \(instances), got \(instance)")
            }
        } else {
            guard !group.isEmpty, group.count <= 249, !group.contains(where: \.isNewline) else {
                throw ValidationError("--group: \"\(group)\" is not a usable consumer group id (1…249 characters, one line)")
            }
            if let groupInstanceId {
                guard TopicOptions.isKafkaName(groupInstanceId) else {
                    throw ValidationError(
                        "--group-instance-id: \"\(groupInstanceId)\" is not usable (1…249 characters of letters, digits, '.', '_', '-')")
                }
            }
            guard (1000...3_600_000).contains(groupSessionTimeoutMs) else {
                throw ValidationError("--group-session-timeout-ms must be 1000…3600000, got \(groupSessionTimeoutMs)")
            }
        }
        try TopicOptions.validateName(stateTopic, flag: "--state-topic")
        guard !topicOptions.topics.all.dropLast().contains(stateTopic) else {
            throw ValidationError("--state-topic \(stateTopic) must differ from the other topics")
        }
        guard isStatic || (1...PipelineConfiguration.maxGroupBatchSize).contains(batchSize) else {
            throw ValidationError(
                "--batch-size must be 1…\(PipelineConfiguration.maxGroupBatchSize) in a group (a batch's dedupe entries "
                    + "of one partition travel in one state record, which must stay under the producer's message.max.bytes), "
                    + "got \(batchSize)")
        }
        guard (1...100_000).contains(batchSize) else { throw ValidationError("--batch-size must be 1…100000, got \(batchSize)") }
        guard InitialPosition(rawValue: startFrom) != nil else {
            throw ValidationError("--start-from must be earliest or latest, got \"\(startFrom)\"")
        }
        guard (1...3600).contains(shutdownGraceSeconds) else {
            throw ValidationError("--shutdown-grace-seconds must be 1…3600, got \(shutdownGraceSeconds)")
        }
        guard (1...86_400).contains(livenessTimeoutSeconds) else {
            throw ValidationError("--liveness-timeout-seconds must be 1…86400, got \(livenessTimeoutSeconds)")
        }
    }

    func run() async throws {
        let signals = ShutdownSignals.install()
        logging.bootstrap()
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        let logger = Logger(label: "mailpush")
        let store = try state.open(checkpointsInBackground: true)
        // One service per state directory (CONTRACT §8): held until the process ends.
        let lock = try state.lock("one state directory serves one `mailpush run`")
        defer { withExtendedLifetime(lock) {} }

        let health = HealthState()
        let http: HTTPEndpoints
        do {
            http = try await HTTPEndpoints.listen(
                port: UInt16(httpPort), health: health, registry: registry, livenessTimeout: .seconds(livenessTimeoutSeconds))
        } catch let unavailable as HTTPPortUnavailable {
            throw fail(unavailable.description, ExitStatus.usage)
        }

        try matchStateToCluster(store, embedded: broker.brokers == nil, logger: logger)
        var devBroker: MockKafkaCluster?
        let bootstrap: String
        if let brokers = broker.brokers {
            bootstrap = brokers
        } else {
            var topics = topicOptions.topics
            topics.state = stateTopic
            let cluster = try DevBroker.start(partitions: 4, topics: topics)
            devBroker = cluster
            bootstrap = cluster.bootstrapServers
            let file = (state.stateDir as NSString).appendingPathComponent("devbroker.bootstrap")
            try DevBroker.writeBootstrap(bootstrap, to: file)
            writeLine(
                """
                embedded development broker (memory only) at \(bootstrap), written to \(file)
                try: kcat -b $(cat \(file)) -C -t \(topicOptions.topics.jobs) -f '%k %s\\n'
                """)
        }
        // After the pipeline's clients are gone: a client still shutting down would log "Connection refused".
        defer { devBroker?.close(afterOtherClientsWithin: .seconds(5)) }

        var configuration = PipelineConfiguration(kafka: try broker.kafkaConfiguration(bootstrap: bootstrap, logger: logger))
        configuration.topics = topicOptions.topics
        configuration.topics.state = stateTopic
        if isStatic {
            configuration.ownership = .fixed(Ownership(index: instance ?? 0, count: instances ?? 1))
        } else {
            var settings = GroupSettings(id: group)
            settings.instanceId = groupInstanceId
            settings.sessionTimeout = .milliseconds(groupSessionTimeoutMs)
            configuration.ownership = .group(settings)
        }
        configuration.render = render.renderOptions
        configuration.dedupeWindowSeconds = render.dedupeWindowSeconds
        configuration.maxBatchSize = batchSize
        configuration.initialPosition = InitialPosition(rawValue: startFrom)!

        let pipeline = Pipeline(configuration: configuration, store: store, logger: logger, health: health)
        let service = PipelineService(pipeline: pipeline, startupTimeout: .seconds(broker.startupTimeoutSeconds))
        var groupConfiguration = ServiceGroupConfiguration(
            services: [
                .init(
                    service: service, successTerminationBehavior: .gracefullyShutdownGroup,
                    failureTerminationBehavior: .gracefullyShutdownGroup),
                .init(
                    service: http, successTerminationBehavior: .gracefullyShutdownGroup,
                    failureTerminationBehavior: .gracefullyShutdownGroup),
            ],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .seconds(shutdownGraceSeconds)
        groupConfiguration.maximumCancellationDuration = .seconds(2)
        logger.info(
            "starting",
            metadata: [
                "brokers": "\(bootstrap)", "stateDir": "\(state.stateDir)", "httpPort": "\(http.port)",
                "ownership": "\(isStatic ? "static, instance \(instance ?? 0) of \(instances ?? 1)" : "consumer group \(group)")",
                "groupInstanceId": "\(isStatic ? "-" : groupInstanceId ?? "none (dynamic membership)")",
                "groupSessionTimeoutMs": "\(isStatic ? "-" : "\(groupSessionTimeoutMs)")",
                "stateTopic": "\(stateTopic)", "eventsTopic": "\(topicOptions.eventsTopic)",
                "devicesTopic": "\(topicOptions.devicesTopic)", "keysTopic": "\(topicOptions.keysTopic)",
                "jobsTopic": "\(topicOptions.jobsTopic)", "deadLetterTopic": "\(topicOptions.deadLetterTopic)",
                "batchSize": "\(batchSize)", "startFrom": "\(startFrom)", "shutdownGraceSeconds": "\(shutdownGraceSeconds)",
                "livenessTimeoutSeconds": "\(livenessTimeoutSeconds)",
                "startupTimeoutSeconds": "\(broker.startupTimeoutSeconds)", "ttlSeconds": "\(render.ttlSeconds)",
                "dedupeWindowSeconds": "\(render.dedupeWindowSeconds)", "librdkafka": "\(LibrdkafkaVersion.runtimeString)",
                "rsa": "\(render.rsaDescription)",
            ])
        do {
            let group = ServiceGroup(configuration: groupConfiguration)
            signals.deliver(to: { Task { await group.triggerGracefulShutdown() } }, logger: logger)
            try await group.run()
        } catch {
            // ServiceGroup wraps a service's error; the pipeline's own error is the one worth reporting.
            let cause = service.failure.value ?? error
            switch cause {
            case PipelineError.invalidConfiguration(let detail):
                throw fail(detail, ExitStatus.usage)
            case let denied as PipelineError where denied.isAccessDenied:
                throw fail(denied.description, ExitStatus.usage)
            case let denied as KafkaError where denied.isAccessDenied:
                throw fail(PipelineError.accessDenied(what: "starting", denied).description, ExitStatus.usage)
            case let port as HTTPPortUnavailable:
                throw fail(port.description, ExitStatus.usage)
            case let reset as KafkaError where reset.code == KafkaError.Code.autoOffsetReset:
                // Not an internal error: the log moved away from the stored offset, and only an operator knows
                // whether to continue at its start or at its end.
                throw fail(
                    "\(reset.message): the stored offset is outside the partition's log (the topic was recreated, or "
                        + "retention removed events before they were processed); stop the service and choose where to continue "
                        + "with `mailpush offsets --set TOPIC:PARTITION=earliest` (or latest), see docs/operations.md, \"Offsets outside the log\"",
                    ExitStatus.usage)
            case PipelineError.brokerUnreachable(let detail):
                throw fail("broker unreachable after \(broker.startupTimeoutSeconds)s: \(detail)", ExitStatus.unavailable)
            default:
                throw fail("stopped by an internal error: \(cause)", ExitStatus.software)
            }
        }
        if let failure = service.failure.value {
            throw fail("stopped by an internal error: \(failure)", ExitStatus.software)
        }
        logger.info("stopped cleanly")
    }

    /// A state's positions (offsets, marks, partition owners) are used only with the cluster they are positions in.
    /// The embedded development broker is a new, empty cluster every run: an earlier embedded run's state (its
    /// offsets lie past the new, empty logs; its config and dedupe window came from records that are gone) is
    /// discarded. A state of a cluster given with `--brokers` is never used with it, nor an embedded run's with such
    /// a cluster: its offsets would skip or repeat events there.
    private func matchStateToCluster(_ store: StateStore, embedded: Bool, logger: Logger) throws {
        // Any input offset (events or config topics) is a position in the cluster it was read from.
        let holdsPositions = try !store.offsets().isEmpty
        // An earlier version recorded no cluster; its embedded runs left the broker's address in the state directory.
        let earlierEmbeddedRun = FileManager.default.fileExists(
            atPath: (state.stateDir as NSString).appendingPathComponent("devbroker.bootstrap"))
        let recorded = try store.recordedCluster() ?? (holdsPositions ? (earlierEmbeddedRun ? .embedded : .external) : nil)
        switch (embedded, recorded) {
        case (true, .external):
            throw fail(
                "state directory \(state.stateDir) holds offsets in a Kafka cluster given with --brokers, and without --brokers "
                    + "mailpush run starts an embedded development broker, a new and empty cluster: give --brokers, or another --state-dir",
                ExitStatus.usage)
        case (false, .embedded) where holdsPositions:
            throw fail(
                "state directory \(state.stateDir) holds offsets in an earlier run's embedded development broker, which is gone; "
                    + "in the cluster given with --brokers they would skip or repeat events: give another --state-dir, or remove this one",
                ExitStatus.usage)
        case (true, .embedded) where holdsPositions:
            try store.discardEverything()
            logger.notice(
                "the embedded development broker starts empty: the state of the earlier run (offsets, devices, keys, dedupe window) is discarded",
                metadata: ["stateDir": "\(state.stateDir)"])
        default:
            break
        }
        try store.recordCluster(embedded ? .embedded : .external)
    }
}

/// Runs the pipeline under swift-service-lifecycle: graceful shutdown lets the batch in flight finish.
struct PipelineService: Service {
    let pipeline: Pipeline
    let startupTimeout: Duration
    let failure = FailureBox()

    func run() async throws {
        do {
            try await pipeline.run(startupTimeout: startupTimeout) { Task.isShuttingDownGracefully }
        } catch is CancellationError {
            return
        } catch {
            failure.value = error
            throw error
        }
    }
}

/// The pipeline's error, kept for after the service group has ended (a `Service` is a struct, so the
/// mutable slot lives in a class).
final class FailureBox: Sendable {
    private let stored = Mutex<(any Error)?>(nil)
    var value: (any Error)? {
        get { stored.withLock { $0 } }
        set { stored.withLock { $0 = newValue } }
    }
}
