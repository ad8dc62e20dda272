import Dispatch

/// Membership of a consumer group on one topic (cooperative-sticky by default): tells the application which
/// of the topic's partitions are its own, and when they move. It reads no records.
///
/// `onAssign` is called with partitions newly assigned and must return quickly. `onRevoke` is called with
/// partitions taken away (`lost`: the member was dropped from the group, e.g. after a pause longer than the
/// session timeout, so another member may already own them); the group waits until it returns before it
/// hands them to another member, so it should return once the application no longer writes for them.
/// Both run on the member's own thread (or, for the last revocation, in `close`).
public final class KafkaGroupMember: Sendable {
    private let member: RdGroupMember
    private let worker = DispatchQueue(label: "mailpush.kafka.group")

    public init(
        configuration: KafkaConfiguration, groupId: String, topic: String,
        onAssign: @escaping @Sendable (_ partitions: [Int32]) -> Void,
        onRevoke: @escaping @Sendable (_ partitions: [Int32], _ lost: Bool) -> Void
    ) throws(KafkaError) {
        member = try RdGroupMember(configuration: configuration, groupId: groupId, topic: topic, onAssign: onAssign, onRevoke: onRevoke)
    }

    /// The coordinator's id for this member; empty before the first join.
    public var memberId: String { member.memberId }

    /// Leaves the group at once, after revoking (through `onRevoke`) what is still assigned. Idempotent.
    public func close() async {
        let member = self.member
        await withCheckedContinuation { continuation in
            worker.async {
                member.close()
                continuation.resume()
            }
        }
    }

    deinit {
        let member = self.member
        worker.async { member.close() }
    }
}
