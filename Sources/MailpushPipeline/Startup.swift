import Logging
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState

extension PipelineRun {
    /// Loads the state, waits for the topics, pins start offsets, catches up with the config topics and
    /// recovers what an earlier run left unfinished; then the run is ready.
    static func start(pipeline: Pipeline, cluster: KafkaCluster) async throws -> PipelineRun {
        let configuration = pipeline.configuration
        let logger = pipeline.logger
        let store = pipeline.store
        let topics = configuration.topics

        // The registrations stay in the state file: nothing but the offsets is loaded.
        let directory = ConfigDirectory(store: store, capacity: configuration.configCache, log: pipeline.recordLog)
        var committed: [TopicPartition: Int64]
        do {
            committed = try store.offsets()
        } catch {
            throw PipelineError.state(error)
        }
        let grouped = configuration.group != nil
        logger.info(
            "state loaded",
            metadata: [
                "stateFile": "\(store.path)",
                "ownership": "\(configuration.ownership)",
            ])

        func partitions(_ topic: String) async throws -> [TopicPartition] {
            try await Self.partitions(of: topic, pipeline: pipeline, cluster: cluster)
        }
        let eventPartitions = try await partitions(topics.events)
        // A fleet member owns nothing until the group assigns it partitions (and their state is restored).
        let owned: [TopicPartition] =
            switch configuration.ownership {
            case .fixed(let ownership): eventPartitions.filter { ownership.owns(partition: $0.partition) }
            case .group: []
            }
        // Only the owned event partitions count as committed here: recovery reads back for those alone.
        committed = committed.filter { $0.key.topic != topics.events || owned.contains($0.key) }
        let configPartitions = try await partitions(topics.devices) + (try await partitions(topics.addressKeys))
        let outputPartitions = try await partitions(topics.jobs) + (try await partitions(topics.deadLetters))
        try await checkTopics(
            pipeline: pipeline, cluster: cluster,
            partitionCounts: Dictionary(
                (eventPartitions + configPartitions + outputPartitions).map { ($0.topic, 1) }, uniquingKeysWith: +))
        if grouped {
            do {
                try store.keepMarksOfUnreleasedPartitions()
            } catch {
                throw PipelineError.state(error)
            }
        }
        if owned.isEmpty && !grouped {
            logger.warning(
                "this instance owns no event partition",
                metadata: [
                    "partitions": "\(eventPartitions.count)", "ownership": "\(configuration.ownership)",
                ])
        }

        let developmentBroker = await cluster.isDevelopmentBroker(timeout: configuration.kafkaRequestTimeout)
        let delivery = try OutputDelivery(
            pipeline: pipeline, cluster: cluster, partitions: outputPartitions,
            producerKafka: configuration.producerKafka(developmentBroker: developmentBroker))
        await delivery.prepare()
        let consumerKafka = configuration.consumerKafka(developmentBroker: developmentBroker)
        let eventsConsumer = try PipelineError.creatingClient { () throws(KafkaError) in try KafkaConsumer(configuration: consumerKafka) }
        var followerConfiguration = configuration
        followerConfiguration.kafka = configuration.configConsumerKafka(developmentBroker: developmentBroker)
        var config = try ConfigFollower(
            configuration: followerConfiguration, cluster: cluster, partitions: configPartitions, directory: directory,
            stored: committed, store: store, log: pipeline.recordLog, metrics: pipeline.metrics)
        config.progress = ProgressReporter("catching up with the config topics", logger: logger, health: pipeline.health)

        let ownedPartitions: OwnedPartitions
        switch configuration.ownership {
        case .fixed(let ownership):
            ownedPartitions = OwnedPartitions(fixed: ownership, partitions: owned, pipeline: pipeline, cluster: cluster)
        case .group(let group):
            let instanceId: String
            do {
                instanceId = try store.instanceId()
            } catch {
                throw PipelineError.state(error)
            }
            let stateProducer = try PipelineError.creatingClient { () throws(KafkaError) in
                try KafkaProducer(configuration: configuration.stateProducerKafka)
            }
            await stateProducer.prepare(topics: [topics.state])
            let writer = StateWriter(
                stateTopic: topics.state, instanceId: instanceId, producer: stateProducer, cluster: cluster, readerKafka: consumerKafka,
                requestTimeout: configuration.kafkaRequestTimeout, deliveryTimeout: configuration.deliveryTimeout,
                messageTimeout: configuration.messageTimeout, leaseDuration: group.leaseDuration,
                leaseWaited: { [metrics = pipeline.metrics] in metrics.leaseWaits.record(duration: $0) }, logger: logger)
            let health = pipeline.health
            let phases = PartitionPhases(changed: { health.recordReadiness() })
            health.follow(phases)
            let inbox = GroupInbox(
                revocationTimeout: group.revocationTimeout, phases: phases, wake: { [eventsConsumer] in eventsConsumer.wake() })
            let statePublisher: BatchStatePublisher
            do {
                statePublisher = try BatchStatePublisher(writer: writer, store: store, interval: group.stateWriteInterval, logger: logger)
            } catch {
                throw PipelineError.state(error)
            }
            ownedPartitions = OwnedPartitions(
                group: Fleet(settings: group, inbox: inbox, writer: writer, statePublisher: statePublisher), pipeline: pipeline,
                cluster: cluster)
        }
        var run = PipelineRun(
            pipeline: pipeline, cluster: cluster,
            processor: BatchProcessor(topics: topics, configuration: configuration),
            events: eventsConsumer, config: config, delivery: delivery, owned: ownedPartitions, committed: committed)

        try await run.pinStartOffsets()
        try run.events.assign(
            Dictionary(
                uniqueKeysWithValues: owned.map { partition in
                    (partition, StartOffset.offset(run.committed[partition]!))
                }))

        try await run.retrying("catching up with the config topics") { run in
            try await run.config.catchUp()
        }
        // Static ownership reads back for its partitions now; a fleet member, for each partition it takes over.
        switch run.owned.mode {
        case .fixed:
            try await run.retrying("recovering outputs of an unfinished batch") { run in
                try await run.recover()
            }
        case .group:
            try await run.retrying("resuming the event partitions held before a restart") { run in
                try await run.resumeHeldPartitions(existing: eventPartitions)
            }
        }
        try run.owned.joinGroup()
        run.health.setReady(true, "config topics caught up")
        let counts = try? directory.counts()
        logger.info(
            "ready",
            metadata: [
                "ownedEventPartitions": "\(owned.map(\.partition))", "devices": "\(counts.map { "\($0.devices)" } ?? "?")",
                "addressKeys": "\(counts.map { "\($0.addressKeys)" } ?? "?")",
            ])
        return run
    }

    /// Refuses to start (exit 64) when a topic whose records must outlive retention is not compacted, or when the
    /// state topic is missing or has fewer partitions than the events topic. A broker that cannot describe topic
    /// configs (the development broker) leaves the policies unchecked: said once, and the run goes on.
    ///
    /// - Parameter partitionCounts: the partition count of the events, config and output topics.
    private static func checkTopics(pipeline: Pipeline, cluster: KafkaCluster, partitionCounts: [String: Int]) async throws {
        let configuration = pipeline.configuration
        let timeout = configuration.kafkaRequestTimeout
        // Static ownership hands nothing over: it never touches the state topic.
        let requirements = configuration.topics.requirements(includingState: configuration.group != nil)
        var counts = partitionCounts
        if configuration.group != nil,
            let stateCount = try await cluster.partitionCount(topic: configuration.topics.state, timeout: timeout)
        {
            counts[configuration.topics.state] = stateCount
        }
        let described = requirements.filter { $0.whyCompacted != nil && counts[$0.name] != nil }.map(\.name)
        let configs = await ObservedConfigs.describing(described, on: cluster, timeout: timeout)
        // Nothing is created at start-up: the creation settings are unused.
        let plan = TopicPlan(requirements: requirements, partitionCounts: counts, configs: configs, partitions: 1, replicationFactor: 1)
        switch plan.startupVerdict {
        case .proceed:
            break
        case .proceedUnchecked(let reason):
            pipeline.logger.notice(
                "the topics' cleanup.policy could not be checked; starting anyway",
                metadata: ["topics": "\(described)", "reason": "\(reason)"])
        case .refuse(let message):
            throw PipelineError.invalidConfiguration(message)
        }
    }

    /// The partitions of `topic`, waiting (unready) until it exists.
    private static func partitions(of topic: String, pipeline: Pipeline, cluster: KafkaCluster) async throws -> [TopicPartition] {
        let timeout = pipeline.configuration.kafkaRequestTimeout
        var attempt = 0
        while true {
            if let count = try await cluster.partitionCount(topic: topic, timeout: timeout), count > 0 {
                return (0..<Int32(count)).map { TopicPartition(topic: topic, partition: $0) }
            }
            attempt += 1
            if attempt == 1 {
                // A request naming the topic creates it where the broker auto-creates topics (the development
                // broker does); elsewhere it must be created by the operator, and we wait, unready, until it is.
                _ = try? await cluster.endOffsets([TopicPartition(topic: topic, partition: 0)], timeout: timeout)
                continue
            }
            pipeline.health.setReady(false, "waiting for topic \(topic) to exist")
            if attempt == 2 { pipeline.logger.warning("topic does not exist yet; waiting", metadata: ["topic": "\(topic)"]) }
            try await Task.sleep(for: .seconds(1))
        }
    }

    /// Resolves `earliest`/`latest` to concrete offsets and stores them before anything is read, so a crash
    /// before the first commit cannot move the starting point.
    private mutating func pinStartOffsets() async throws {
        let missing = owned.partitions.filter { committed[$0] == nil }
        guard !missing.isEmpty else { return }
        var pinned: [TopicPartition: Int64] = [:]
        try await retrying("reading start offsets") { run in
            pinned =
                switch run.pipeline.configuration.initialPosition {
                case .earliest: try await run.cluster.beginningOffsets(missing, timeout: run.timeout)
                case .latest: try await run.cluster.endOffsets(missing, timeout: run.timeout)
                }
        }
        do {
            try store.setOffsets(pinned)
        } catch {
            throw PipelineError.state(error)
        }
        committed.merge(pinned) { _, new in new }
        logger.info(
            "new event partitions start at their \(pipeline.configuration.initialPosition.rawValue) offset",
            metadata: [
                "offsets": "\(pinned.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" })"
            ])
    }
}
