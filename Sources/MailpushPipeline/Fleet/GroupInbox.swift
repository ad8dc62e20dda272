import Foundation
import Synchronization

/// Where the group member's thread leaves rebalance news for the batch loop, which acts on them between batches.
///
/// A revocation waits (on the member's thread) until the loop has released the partitions — finished the batch
/// in flight, committed, written their release records — so that the group moves them only once this instance
/// no longer writes for them; or until `revocationTimeout`, after which the group moves them anyway and the epoch
/// fence stops this instance's writes for them (the next owner's claim fences it, `StateWriter.renew`).
final class GroupInbox: Sendable {
    struct Changes: Sendable {
        var assigned: Set<Int32> = []
        var revoked: Set<Int32> = []
        /// Revoked because this member had been dropped from the group: another member may already own them.
        var lost: Set<Int32> = []
        var isEmpty: Bool { assigned.isEmpty && revoked.isEmpty }
    }

    private struct State {
        var changes = Changes()
        /// Revoked partitions the loop has not released yet.
        var releasing: Set<Int32> = []
        var closing = false
    }

    private let state = Mutex(State())
    let revocationTimeout: Duration
    /// Where each assigned partition stands, for readiness.
    let phases: PartitionPhases
    /// Wakes the batch loop's poll so that it sees the news at once.
    private let wake: @Sendable () -> Void

    init(revocationTimeout: Duration, phases: PartitionPhases, wake: @escaping @Sendable () -> Void) {
        self.revocationTimeout = revocationTimeout
        self.phases = phases
        self.wake = wake
    }

    var hasChanges: Bool { state.withLock { !$0.changes.isEmpty } }

    func take() -> Changes {
        state.withLock { state in
            defer { state.changes = Changes() }
            return state.changes
        }
    }

    func assigned(_ partitions: [Int32]) {
        state.withLock { state in
            state.changes.assigned.formUnion(partitions)
            state.changes.revoked.subtract(partitions)
            state.changes.lost.subtract(partitions)
        }
        phases.assigned(partitions)
        wake()
    }

    /// Blocks until the loop has released `partitions` (or the loop is closing, or the timeout passed).
    func revoked(_ partitions: [Int32], lost: Bool) {
        let (pending, waiting) = state.withLock { state -> (Set<Int32>, Bool) in
            // Assigned but not taken over yet: nothing to release.
            let pending = Set(partitions).intersection(state.changes.assigned)
            state.changes.assigned.subtract(pending)
            let rest = Set(partitions).subtracting(pending)
            state.changes.revoked.formUnion(rest)
            if lost { state.changes.lost.formUnion(rest) }
            state.releasing.formUnion(rest)
            return (pending, !rest.isEmpty && !state.closing)
        }
        phases.remove(pending)
        if lost { phases.droppedFromGroup() }
        guard waiting else { return }
        wake()
        let deadline = ContinuousClock.now + revocationTimeout
        while ContinuousClock.now < deadline {
            let done = state.withLock { $0.closing || $0.releasing.isDisjoint(with: partitions) }
            if done { return }
            Thread.sleep(forTimeInterval: 0.005)
        }
    }

    /// The loop no longer writes for these partitions.
    func released(_ partitions: some Sequence<Int32>) {
        state.withLock { $0.releasing.subtract(partitions) }
    }

    /// Revocations from now on return at once (the loop has stopped and released everything it could).
    func close() {
        state.withLock { $0.closing = true }
    }
}
