import Foundation
import Synchronization

/// Where the group member's thread leaves rebalance news for the batch loop, which acts on them between batches.
///
/// A revocation waits (on the member's thread) until the loop has released the partitions — finished the batch
/// in flight, committed, written their release records — so that the group moves them only once this instance
/// no longer writes for them; or until `revocationTimeout`, after which the group moves them anyway and the epoch
/// fence stops this instance's writes for them (the next owner's claim fences it, `PartitionLeases.renew`).
final class GroupInbox: Sendable {
    /// The latest news of one partition: what the loop is to do with it.
    enum Change: Sendable, Equatable {
        /// Take it over.
        case assigned
        /// Release it (its batch in flight first): the group waits for that, up to `revocationTimeout`.
        case revoked
        /// Revoked because this member had been dropped from the group: another member may already own it, so it is
        /// given up without a release (the next owner waits out the lease).
        case lost
    }

    /// The news since the loop last took them, one change per partition: a later change of a partition replaces
    /// an earlier one, and a revocation of a partition assigned since the loop last looked cancels the assignment.
    struct Changes: Sendable {
        var partitions: [Int32: Change] = [:]

        var isEmpty: Bool { partitions.isEmpty }
        var assigned: Set<Int32> { Set(partitions.filter { $0.value == .assigned }.keys) }
        /// Revoked, lost or not.
        var revoked: Set<Int32> { Set(partitions.filter { $0.value != .assigned }.keys) }
        var lost: Set<Int32> { Set(partitions.filter { $0.value == .lost }.keys) }
    }

    private struct State {
        var changes = Changes()
        /// Revoked partitions the loop has not released yet: what a revocation waits for.
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
            for partition in partitions { state.changes.partitions[partition] = .assigned }
        }
        phases.assigned(partitions)
        wake()
    }

    /// Blocks until the loop has released `partitions` (or the loop is closing, or the timeout passed).
    func revoked(_ partitions: [Int32], lost: Bool) {
        let (cancelled, waiting) = state.withLock { state -> (Set<Int32>, Bool) in
            var cancelled: Set<Int32> = []
            var releasing: Set<Int32> = []
            for partition in partitions {
                switch state.changes.partitions[partition] {
                case .assigned:
                    // Assigned but not taken over yet: nothing to release.
                    state.changes.partitions[partition] = nil
                    cancelled.insert(partition)
                case .lost:
                    releasing.insert(partition)
                case .revoked, nil:
                    state.changes.partitions[partition] = lost ? .lost : .revoked
                    releasing.insert(partition)
                }
            }
            state.releasing.formUnion(releasing)
            return (cancelled, !releasing.isEmpty && !state.closing)
        }
        phases.remove(cancelled)
        if lost { phases.droppedFromGroup() }
        guard waiting else { return }
        wake()
        // Past the timeout the group moves the partitions anyway. The loop still releases them once its batch is
        // done (a release older than the next owner's claim changes nothing in a restore), or gives them up if that
        // claim has fenced them by then.
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
