import CRdKafka
import Foundation
import MailpushPartition
import Synchronization

/// A consumer that joins a group on one topic only to be told which of its partitions are this member's.
/// It never hands records to the application: partitions are paused as soon as they are assigned, and the
/// application reads them with an assign-based consumer of its own, from offsets it keeps itself.
///
/// A thread of its own polls the client (heartbeats and rebalances are served from there). The rebalance
/// callback runs on that thread: `onAssign` must return quickly; `onRevoke` may block until the application
/// has stopped using the partitions, which is the point of it (the group waits for it before moving them).
///
/// `@unchecked Sendable`: `rk` is thread-safe; `stopped` is behind a lock.
final class RdGroupMember: @unchecked Sendable {
    private let client: RdClient
    private let stopped = Mutex(false)
    private let exited = DispatchSemaphore(value: 0)
    private let closed = Mutex(false)
    private let assignedOnce = Flag()

    private final class Flag: Sendable { let value = Mutex(false) }

    deinit {
        let assigned = assignedOnce.value.withLock { $0 }
        client.mustNotDestroy.withLock { $0 = !assigned }
    }

    static let defaults: KeyValuePairs<String, String> = [
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": "false",
        "enable.auto.offset.store": "false",
        "enable.partition.eof": "false",
        "auto.offset.reset": "latest",
    ]

    init(
        configuration: KafkaConfiguration, groupId: String, topic: String,
        onAssign: @escaping @Sendable ([Int32]) -> Void, onRevoke: @escaping @Sendable ([Int32], Bool) -> Void
    ) throws(KafkaError) {
        var configuration = configuration
        configuration.properties["group.id"] = groupId
        let assignedOnce = self.assignedOnce
        client = try RdClient(
            role: .consumer, configuration: configuration, defaults: Self.defaults, servePollQueue: false,
            rebalance: { rk, code, list in
                let partitions = partitionEntries(list).filter { $0.0.topic == topic }.map(\.0.partition)
                let cooperative = rd_kafka_rebalance_protocol(rk).map { String(cString: $0) } == "COOPERATIVE"
                switch code {
                case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
                    // The assignor's state exists from the first assignment on: destroying is safe now.
                    assignedOnce.value.withLock { $0 = true }
                    if cooperative {
                        if let error = rd_kafka_incremental_assign(rk, list) { rd_kafka_error_destroy(error) }
                    } else {
                        _ = rd_kafka_assign(rk, list)
                    }
                    // Membership only: the application fetches these itself, from its own offsets.
                    _ = rd_kafka_pause_partitions(rk, list)
                    onAssign(partitions)
                case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
                    let lost = rd_kafka_assignment_lost(rk) != 0
                    onRevoke(partitions, lost)
                    if cooperative {
                        if let error = rd_kafka_incremental_unassign(rk, list) { rd_kafka_error_destroy(error) }
                    } else {
                        _ = rd_kafka_assign(rk, nil)
                    }
                default:
                    _ = rd_kafka_assign(rk, nil)
                }
            })
        rd_kafka_poll_set_consumer(client.rk)
        let code = withPartitionList([(TopicPartition(topic: topic, partition: -1), RdOffset.invalid)]) {
            rd_kafka_subscribe(client.rk, $0)
        }
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(rd: code, message: "subscribing to \(topic)") }
        let thread = Thread { [self] in
            Thread.current.name = "rdkafka-group"
            while !stopped.withLock({ $0 }) {
                if let message = rd_kafka_consumer_poll(client.rk, 100) { rd_kafka_message_destroy(message) }
            }
            exited.signal()
        }
        thread.start()
    }

    /// The member id the coordinator gave this member ("" before the first join).
    var memberId: String {
        guard let id = rd_kafka_memberid(client.rk) else { return "" }
        defer { rd_kafka_mem_free(client.rk, id) }
        return String(cString: id)
    }

    /// Leaves the group at once (the group rebalances without waiting for the session timeout). Revokes what is
    /// still assigned first, through `onRevoke`, on the calling thread. Blocks; idempotent.
    func close() {
        let wasClosed = closed.withLock { closed in
            defer { closed = true }
            return closed
        }
        if wasClosed { return }
        stopped.withLock { $0 = true }
        rd_kafka_yield(client.rk)
        exited.wait()
        _ = rd_kafka_consumer_close(client.rk)
    }
}
