import ArgumentParser
import Foundation
import Logging
import MailpushKafka
import MailpushPipeline

struct TopicsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "topics",
        abstract: "Create the topics mailpush uses that do not exist, and check those that do.",
        discussion: """
            One line per topic (events, devices, address keys, jobs, dead letters,
            state): exists, created or would create; partitions; cleanup.policy;
            any problem.
            Missing topics are created with --partitions and --replication-factor,
            cleanup.policy=compact for devices, address keys and state and delete
            for the others; the state topic gets at least as many partitions as the
            events topic. An existing topic is never altered: a problem names the
            command that mends it. Running it again changes nothing.
            Exit status: 0 when every topic exists as it should (or was created);
            64 when one is misconfigured or cannot be created as asked; 69 when the
            broker cannot be reached or cannot create topics.
            """)

    @OptionGroup var broker: BrokerOptions
    @OptionGroup var topicOptions: TopicOptions
    @OptionGroup var logging: LogOptions
    @Option(help: "Compacted topic of partition state (as `mailpush run --state-topic`).") var stateTopic = Topics().state
    @Option(help: "Partitions of each topic created.") var partitions: Int = 12
    @Option(help: "Replication factor of each topic created (1 for a single-broker cluster).") var replicationFactor: Int = 3
    @Flag(help: "Show what would be created; create nothing.") var dryRun = false

    func validate() throws {
        guard broker.brokers != nil else { throw ValidationError("--brokers is required for topics") }
        guard (1...100_000).contains(partitions) else { throw ValidationError("--partitions must be 1…100000, got \(partitions)") }
        guard (1...32_767).contains(replicationFactor) else {
            throw ValidationError("--replication-factor must be 1…32767, got \(replicationFactor)")
        }
        try TopicOptions.validateName(stateTopic, flag: "--state-topic")
        guard !topicOptions.topics.all.dropLast().contains(stateTopic) else {
            throw ValidationError("--state-topic \(stateTopic) must differ from the other topics")
        }
    }

    func run() async throws {
        logging.bootstrap()
        let logger = Logger(label: "mailpush.topics")
        var topics = topicOptions.topics
        topics.state = stateTopic
        let requirements = topics.requirements(includingState: true)
        let timeout = Duration.seconds(broker.startupTimeoutSeconds)

        let cluster: KafkaCluster
        do {
            cluster = try KafkaCluster(configuration: broker.kafkaConfiguration(bootstrap: broker.brokers!, logger: logger))
        } catch {
            throw fail("Kafka client settings (-X / MAILPUSH_KAFKA_*): \(error)", ExitStatus.usage)
        }
        let plan: TopicPlan
        do {
            try await cluster.waitUntilReachable(timeout: timeout)
            plan = try await observe(cluster, requirements, timeout: timeout)
        } catch {
            throw fail("broker unreachable: \(error)", ExitStatus.unavailable)
        }

        var notCreated: [String: String] = [:]
        var created: Set<String> = []
        /// Made by someone else between our look and our request.
        var appeared: Set<String> = []
        var unavailable = false
        var shown = plan
        if !dryRun && !plan.toCreate.isEmpty {
            do {
                switch try await cluster.createTopics(plan.toCreate, timeout: timeout) {
                case .answered(let outcomes):
                    for topic in plan.toCreate {
                        switch outcomes[topic.name] {
                        case .created: created.insert(topic.name)
                        case .alreadyExists: appeared.insert(topic.name)
                        case .failed(let error):
                            notCreated[topic.name] = "\(error)"
                            unavailable = unavailable || error.isRetriable
                        case nil: notCreated[topic.name] = "the broker's answer did not mention it"
                        }
                    }
                case .unsupported(let reason):
                    unavailable = true
                    for topic in plan.toCreate { notCreated[topic.name] = "the broker does not answer CreateTopics (\(reason))" }
                }
            } catch {
                // A refusal (authorization, policy) is the operator's to mend; a timeout or transport error is not.
                unavailable = error.isRetriable
                for topic in plan.toCreate { notCreated[topic.name] = "\(error)" }
            }
            if !created.isEmpty || !appeared.isEmpty {
                // Verify: what the broker reports now, not what was asked for.
                do {
                    shown = try await observe(cluster, requirements, timeout: timeout, until: created.union(appeared))
                } catch {
                    throw fail(
                        "broker unreachable after creating \(created.sorted().joined(separator: ", ")): \(error)", ExitStatus.unavailable)
                }
            }
        }

        let width = requirements.map(\.name.count).max() ?? 0
        for entry in shown.entries {
            writeLine(line(entry, width: width, created: created, notCreated: notCreated))
        }
        if let reason = shown.configsUnchecked {
            writeLine("note: the cleanup.policy of existing topics could not be checked: \(reason)")
        }
        if dryRun, !plan.toCreate.isEmpty {
            writeLine("dry run: nothing created")
        }
        if !shown.problems.isEmpty {
            throw fail(
                shown.problems.map { "\($0.message); to fix: \($0.fix)" }.joined(separator: "; ")
                    + " (mailpush topics never alters an existing topic)", ExitStatus.usage)
        }
        if !notCreated.isEmpty {
            let message = notCreated.sorted { $0.key < $1.key }.map { "topic \($0.key) not created: \($0.value)" }.joined(separator: "; ")
            throw fail(message, unavailable ? ExitStatus.unavailable : ExitStatus.usage)
        }
    }

    /// The plan from what the broker reports now. With `until`, asks again (up to `timeout`) until each of those
    /// topics shows up in the metadata: a topic just created may reach the broker answering a moment later.
    private func observe(
        _ cluster: KafkaCluster, _ requirements: [TopicRequirement], timeout: Duration, until expected: Set<String> = []
    ) async throws -> TopicPlan {
        let deadline = ContinuousClock.now + timeout
        var counts: [String: Int] = [:]
        while true {
            counts = [:]
            for requirement in requirements {
                counts[requirement.name] = try await cluster.partitionCount(topic: requirement.name, timeout: timeout)
            }
            if expected.isSubset(of: counts.keys) || ContinuousClock.now >= deadline { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        let configs = await ObservedConfigs.describing(requirements.map(\.name).filter { counts[$0] != nil }, on: cluster, timeout: timeout)
        return TopicPlan(
            requirements: requirements, partitionCounts: counts, configs: configs, partitions: partitions,
            replicationFactor: replicationFactor)
    }

    private func line(_ entry: TopicPlan.Entry, width: Int, created: Set<String>, notCreated: [String: String]) -> String {
        let name = entry.requirement.name
        var columns: [String] = [name.padding(toLength: width, withPad: " ", startingAt: 0)]
        switch entry.action {
        case .exists(let count):
            columns.append((created.contains(name) ? "created" : "exists").padding(toLength: 12, withPad: " ", startingAt: 0))
            columns.append("\(count) partitions")
        case .create(let topic):
            let state = dryRun ? "would create" : notCreated[name] != nil ? "not created" : "missing"
            columns.append(state.padding(toLength: 12, withPad: " ", startingAt: 0))
            columns.append("\(topic.partitions) partitions, replication factor \(topic.replicationFactor)")
        }
        columns.append("cleanup.policy=\(entry.cleanupPolicy ?? "unknown")")
        columns += entry.problems.map { "PROBLEM: \($0.message)" }
        if let reason = notCreated[name] { columns.append("PROBLEM: \(reason)") }
        return columns.joined(separator: "  ")
    }
}
