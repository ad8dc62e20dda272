/// A partition of a Kafka topic, as every layer names it: the Kafka clients read and write it, the state
/// store keys offsets and output marks by it. Its own target, without dependencies, so that the state
/// store can name partitions without linking librdkafka.
public struct TopicPartition: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public var description: String { "\(topic)[\(partition)]" }

    /// "topic/partition": how output marks name a partition, in the state topic and in the state file alike.
    public var name: String { "\(topic)/\(partition)" }

    /// The partition a `name` names; nil for text that is not one. Topic names cannot hold "/", so the last one
    /// separates the partition.
    public init?(name: some StringProtocol) {
        guard let slash = name.lastIndex(of: "/"), let partition = Int32(name[name.index(after: slash)...]) else { return nil }
        self.init(topic: String(name[..<slash]), partition: partition)
    }

    public static func < (lhs: Self, rhs: Self) -> Bool {
        (lhs.topic, lhs.partition) < (rhs.topic, rhs.partition)
    }
}
