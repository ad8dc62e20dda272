import MailpushKafka

/// One topic mailpush uses and what it must be (CONTRACT §9, `mailpush topics`).
public struct TopicRequirement: Sendable, Hashable {
    public enum Role: Sendable, Hashable { case events, devices, addressKeys, jobs, deadLetters, state }

    public var role: Role
    public var name: String

    public init(role: Role, name: String) {
        self.role = role
        self.name = name
    }

    /// The option of `mailpush run` that names the topic.
    public var option: String {
        switch role {
        case .events: "--events-topic"
        case .devices: "--devices-topic"
        case .addressKeys: "--keys-topic"
        case .jobs: "--jobs-topic"
        case .deadLetters: "--dead-letter-topic"
        case .state: "--state-topic"
        }
    }

    /// What a deleting cleanup policy would lose, for the topics whose latest record per key must stay.
    public var whyCompacted: String? {
        switch role {
        case .devices: "registrations older than retention.ms would vanish"
        case .addressKeys: "address keys older than retention.ms would vanish"
        case .state: "the state of a partition untouched for retention.ms would vanish"
        case .events, .jobs, .deadLetters: nil
        }
    }

    /// Topic-level configs mailpush creates the topic with; the broker's defaults for everything else. The
    /// policy is always explicit: compacting the events or jobs topic (keyed by address and device) would drop
    /// all but the latest record per key, whatever a broker's `log.cleanup.policy` says.
    public var creationConfigs: [String: String] { ["cleanup.policy": whyCompacted == nil ? "delete" : "compact"] }
}

extension Topics {
    /// Every topic in the order they are shown; without the state topic for static ownership, which does not
    /// use it.
    public func requirements(includingState: Bool) -> [TopicRequirement] {
        var list: [TopicRequirement] = [
            .init(role: .events, name: events), .init(role: .devices, name: devices), .init(role: .addressKeys, name: addressKeys),
            .init(role: .jobs, name: jobs), .init(role: .deadLetters, name: deadLetters),
        ]
        if includingState { list.append(.init(role: .state, name: state)) }
        return list
    }
}

/// What the broker says about the topics' configs.
public enum ObservedConfigs: Sendable, Hashable {
    /// Each existing topic's config entries.
    case known([String: [String: String]])
    /// The broker could not say (the development broker does not answer DescribeConfigs): why.
    case unknown(String)
}

extension ObservedConfigs {
    /// Asks the broker for the configs of `topics` (which must exist). A broker that cannot answer, or a request
    /// that fails (a timeout, an account without the DescribeConfigs permission), gives `.unknown` with the reason.
    public static func describing(_ topics: [String], on cluster: KafkaCluster, timeout: Duration) async -> ObservedConfigs {
        do {
            switch try await cluster.describeTopicConfigs(topics, timeout: timeout) {
            case .answered(let entries): return .known(entries)
            case .unsupported(let reason): return .unknown("the broker does not answer DescribeConfigs (\(reason))")
            }
        } catch {
            return .unknown("DescribeConfigs failed: \(error)")
        }
    }
}

/// A setting of an existing topic mailpush cannot work with. mailpush never alters an existing topic:
/// `fix` is the command an operator runs.
public struct TopicProblem: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var setting: String
    public var message: String
    public var fix: String

    public var description: String { message }
}

/// What `mailpush topics` does to each topic, and what `mailpush run` checks at start-up, decided from what
/// the broker reports: which topics exist with how many partitions, and their configs if it can tell.
public struct TopicPlan: Sendable, Hashable {
    public enum Action: Sendable, Hashable {
        case exists(partitions: Int)
        case create(NewTopic)
    }

    public struct Entry: Sendable, Hashable {
        public var requirement: TopicRequirement
        public var action: Action
        /// The topic's cleanup.policy as reported, or as it will be created; nil when the broker cannot say.
        public var cleanupPolicy: String?
        public var problems: [TopicProblem]
    }

    public var entries: [Entry]
    /// Set when the configs of existing topics could not be checked: why.
    public var configsUnchecked: String?

    /// - Parameters:
    ///   - partitionCounts: the partition count of each topic that exists; a topic not in it is missing.
    ///   - partitions, replicationFactor: for topics to create. The state topic is created with at least as
    ///     many partitions as the events topic has (or will have).
    public init(
        requirements: [TopicRequirement], partitionCounts: [String: Int], configs: ObservedConfigs,
        partitions: Int, replicationFactor: Int
    ) {
        let eventsPartitions = requirements.first { $0.role == .events }.map { partitionCounts[$0.name] ?? partitions }
        var entries: [Entry] = []
        for requirement in requirements {
            let name = requirement.name
            guard let count = partitionCounts[name] else {
                let wanted = requirement.role == .state ? max(partitions, eventsPartitions ?? 0) : partitions
                let topic = NewTopic(
                    name: name, partitions: wanted, replicationFactor: replicationFactor, configs: requirement.creationConfigs)
                entries.append(
                    Entry(
                        requirement: requirement, action: .create(topic), cleanupPolicy: topic.configs["cleanup.policy"],
                        problems: []))
                continue
            }
            var problems: [TopicProblem] = []
            var policy: String?
            if case .known(let described) = configs, let entries = described[name] {
                // Kafka's default when the broker leaves the entry out.
                policy = entries["cleanup.policy"] ?? "delete"
                if let why = requirement.whyCompacted, let policy, policy != "compact" {
                    problems.append(
                        TopicProblem(
                            topic: name, setting: "cleanup.policy",
                            message: "topic \(name) has cleanup.policy=\(policy); it must be compact (\(why))",
                            fix:
                                "kafka-configs.sh --bootstrap-server B --alter --entity-type topics --entity-name \(name) --add-config cleanup.policy=compact"
                        ))
                }
            }
            if requirement.role == .state, let eventsPartitions, count < eventsPartitions {
                let events = requirements.first { $0.role == .events }!.name
                problems.append(
                    TopicProblem(
                        topic: name, setting: "partitions",
                        message:
                            "topic \(name) has \(count) partitions; it must have at least as many as \(events) (\(eventsPartitions)): the state of event partition p lives in its partition p",
                        fix: "kafka-topics.sh --bootstrap-server B --alter --topic \(name) --partitions \(eventsPartitions)"))
            }
            entries.append(Entry(requirement: requirement, action: .exists(partitions: count), cleanupPolicy: policy, problems: problems))
        }
        self.entries = entries
        let unchecked = entries.filter { $0.action.exists && $0.cleanupPolicy == nil && $0.requirement.whyCompacted != nil }
        if !unchecked.isEmpty {
            switch configs {
            case .unknown(let reason): configsUnchecked = reason
            case .known: configsUnchecked = "the broker's answer left out \(unchecked.map(\.requirement.name).joined(separator: ", "))"
            }
        }
    }

    public var toCreate: [NewTopic] {
        entries.compactMap { if case .create(let topic) = $0.action { topic } else { nil } }
    }

    public var problems: [TopicProblem] { entries.flatMap(\.problems) }

    /// `mailpush run`'s decision. It waits for every topic but the state topic to exist before it asks, so a
    /// topic to create here is the state topic, which the service cannot do without.
    public var startupVerdict: StartupVerdict {
        if let missing = entries.first(where: { !$0.action.exists }) {
            let events = entries.first { $0.requirement.role == .events }
            let atLeast =
                events.map { e in
                    if case .exists(let count) = e.action {
                        " with at least \(count) partitions (as many as \(e.requirement.name))"
                    } else {
                        ""
                    }
                } ?? ""
            return .refuse(
                "\(missing.requirement.option): topic \(missing.requirement.name) does not exist; create it\(atLeast)\(missing.requirement.whyCompacted == nil ? "" : " and cleanup.policy=compact") (`mailpush topics` does)"
            )
        }
        if !problems.isEmpty {
            return .refuse(
                entries.flatMap { entry in
                    entry.problems.map { "\(entry.requirement.option): \($0.message); to fix: \($0.fix)" }
                }.joined(separator: "; "))
        }
        if let configsUnchecked { return .proceedUnchecked(configsUnchecked) }
        return .proceed
    }
}

public enum StartupVerdict: Sendable, Hashable {
    case proceed
    /// The topics' cleanup policies could not be checked (why); the service starts anyway.
    case proceedUnchecked(String)
    /// Exit 64 with this message.
    case refuse(String)
}

extension TopicPlan.Action {
    public var exists: Bool { if case .exists = self { true } else { false } }
}
