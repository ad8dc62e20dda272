import CRdKafka
import MailpushPartition

/// librdkafka's logical offsets (the RD_KAFKA_OFFSET_* macros); also the ListOffsets "timestamps"
/// that ask for the end / start of a partition.
enum RdOffset {
    static let end: Int64 = -1
    static let beginning: Int64 = -2
    static let invalid: Int64 = -1001
}

/// Builds a `rd_kafka_topic_partition_list_t` for the duration of `body`.
func withPartitionList<R>(
    _ entries: [(TopicPartition, Int64)],
    _ body: (UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> R
) -> R {
    let list = rd_kafka_topic_partition_list_new(Int32(entries.count))!
    defer { rd_kafka_topic_partition_list_destroy(list) }
    for (tp, offset) in entries {
        rd_kafka_topic_partition_list_add(list, tp.topic, tp.partition).pointee.offset = offset
    }
    return body(list)
}

/// The elements of a partition list: partition, offset and per-partition error.
func partitionEntries(_ list: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>)
    -> [(TopicPartition, offset: Int64, error: rd_kafka_resp_err_t)]
{
    (0..<Int(list.pointee.cnt)).map { i in
        let e = list.pointee.elems[i]
        return (TopicPartition(topic: String(cString: e.topic), partition: e.partition), e.offset, e.err)
    }
}
