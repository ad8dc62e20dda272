import Metrics
import Synchronization

/// Where each event partition assigned to this fleet member stands, from the group's assignment to processing:
/// what `/readyz` and `mailpush_event_partitions` report. Written by the group member's thread (assignments) and
/// the batch loop (the takeover's steps); read by the HTTP server.
final class PartitionPhases: Sendable {
    enum Phase: String, Sendable, CaseIterable {
        /// Assigned by the group; the batch loop has not started taking it over.
        case assigned
        /// Reading the partition's state records.
        case restoring
        /// Claimed; waiting until a previous owner that did not release can write nothing more.
        case waitingForLease = "waiting_for_lease"
        /// Reading the output topics back for what earlier owners left unfinished.
        case readingBack = "reading_back"
        case processing

        /// The takeover's steps, in order; a takeover that failed starts again from `restoring`. A partition leaves
        /// from any phase (released, lost, fenced, revoked before its takeover).
        func mayBecome(_ next: Phase) -> Bool {
            switch (self, next) {
            case (.assigned, .restoring), (.restoring, .restoring), (.restoring, .waitingForLease), (.restoring, .readingBack),
                (.waitingForLease, .readingBack), (.waitingForLease, .restoring), (.readingBack, .processing),
                (.readingBack, .restoring):
                true
            default: false
            }
        }
    }

    private struct State {
        /// The member has received an assignment (maybe empty) since it last joined the group.
        var joined = false
        var phases: [Int32: Phase] = [:]
    }

    private let state = Mutex(State())
    private let counts = Dictionary(
        uniqueKeysWithValues: Phase.allCases.map { ($0, Gauge(label: "mailpush_event_partitions", dimensions: [("phase", $0.rawValue)])) })
    private let joinedGauge = Gauge(label: "mailpush_group_joined")
    private let changed: @Sendable () -> Void

    /// `changed` runs after every change (outside the lock).
    init(changed: @escaping @Sendable () -> Void = {}) {
        self.changed = changed
        record(State())
    }

    /// The group's assignment arrived (its partitions, possibly none): the member has joined.
    func assigned(_ partitions: some Sequence<Int32>) {
        update { state in
            state.joined = true
            for partition in partitions where state.phases[partition] == nil { state.phases[partition] = .assigned }
        }
    }

    /// This member was dropped from the group: it owns nothing until it has joined again.
    func droppedFromGroup() {
        update { $0.joined = false }
    }

    /// Moves `partitions` on to `phase`; a move the takeover does not make is a programming error.
    func set(_ phase: Phase, _ partitions: some Sequence<Int32>) {
        update { state in
            for partition in partitions {
                let from = state.phases[partition] ?? .assigned
                assert(from.mayBecome(phase), "event partition \(partition): \(from.rawValue) cannot become \(phase.rawValue)")
                state.phases[partition] = phase
            }
        }
    }

    /// The partitions no longer belong to this member (released, lost, or revoked before their takeover).
    func remove(_ partitions: some Sequence<Int32>) {
        update { state in
            for partition in partitions { state.phases[partition] = nil }
        }
    }

    /// Working: joined, and every assigned partition processing (or none assigned). Otherwise what it waits for.
    var readiness: (working: Bool, detail: String) {
        state.withLock { state in
            guard state.joined else { return (false, "joining the consumer group") }
            let waiting = Dictionary(grouping: state.phases.filter { $0.value != .processing }, by: \.value)
            let processing = state.phases.filter { $0.value == .processing }.keys.sorted()
            guard waiting.isEmpty else {
                let parts = Phase.allCases.compactMap { phase in
                    waiting[phase].map { "\(phase.rawValue) \($0.map(\.key).sorted())" }
                }
                return (false, "event partitions " + parts.joined(separator: ", ") + "; processing \(processing)")
            }
            return (
                true, processing.isEmpty ? "joined; the group assigned no event partition" : "processing event partitions \(processing)"
            )
        }
    }

    private func update(_ body: (inout State) -> Void) {
        state.withLock { state in
            body(&state)
            record(state)
        }
        changed()
    }

    private func record(_ state: State) {
        for phase in Phase.allCases {
            counts[phase]?.record(state.phases.values.count { $0 == phase })
        }
        joinedGauge.record(state.joined ? 1 : 0)
    }
}
