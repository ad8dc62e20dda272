/// A topic to create: its name, partitions, replication factor and topic-level configs.
public struct NewTopic: Sendable, Hashable {
    public var name: String
    public var partitions: Int
    public var replicationFactor: Int
    public var configs: [String: String]

    public init(name: String, partitions: Int, replicationFactor: Int, configs: [String: String] = [:]) {
        self.name = name
        self.partitions = partitions
        self.replicationFactor = replicationFactor
        self.configs = configs
    }
}

/// What became of one topic of a CreateTopics request.
public enum TopicCreation: Sendable, Hashable {
    case created
    /// Someone else made it between our look and our request: nothing of ours was applied to it.
    case alreadyExists
    case failed(KafkaError)
}

/// An admin request's answer, or word that the broker does not implement the request at all (librdkafka's
/// mock cluster, `mailpush devbroker`, answers neither CreateTopics nor DescribeConfigs).
public enum AdminAnswer<Value: Sendable>: Sendable {
    case answered(Value)
    case unsupported(String)
}

extension AdminAnswer: Equatable where Value: Equatable {}

extension KafkaCluster {
    /// Creates the topics in one CreateTopics request, waiting up to `timeout` for the controller.
    /// Throws only when the request as a whole fails; one topic's failure is its own `TopicCreation`.
    public func createTopics(_ topics: [NewTopic], timeout: Duration) async throws(KafkaError) -> AdminAnswer<[String: TopicCreation]> {
        let admin = self.admin
        return try await worker.run { () throws(KafkaError) in
            try admin.createTopics(topics, timeoutMs: timeout.clampedMilliseconds)
        }
    }

    /// Every topic-level config entry of each topic (defaults included), as the broker reports them.
    /// Sensitive entries, whose value the broker withholds, are left out. Throws the first topic's error
    /// (e.g. a topic that does not exist).
    public func describeTopicConfigs(_ topics: [String], timeout: Duration) async throws(KafkaError) -> AdminAnswer<
        [String: [String: String]]
    > {
        let admin = self.admin
        return try await worker.run { () throws(KafkaError) in
            try admin.describeTopicConfigs(topics, timeoutMs: timeout.clampedMilliseconds)
        }
    }
}
