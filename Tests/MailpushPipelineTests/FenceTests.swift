import Foundation
import MailpushKafka
import MailpushPartition
import Synchronization
import Testing

@testable import MailpushPipeline

/// The fleet's fence (docs/exactly-once.md, "A fleet"): two owners' `StateWriter`s on one state partition of
/// librdkafka's mock cluster, claims written as a takeover writes them.
@Suite(.serialized)
struct FenceTests {
    static let stateTopic = "fence.state"

    final class Fixture: Sendable {
        let cluster: MockKafkaCluster
        let admin: KafkaCluster
        let producer: KafkaProducer

        init() throws {
            cluster = try MockKafkaCluster(brokers: 1)
            try cluster.createTopic(FenceTests.stateTopic, partitions: 1)
            let kafka = KafkaConfiguration(bootstrapServers: cluster.bootstrapServers)
            admin = try KafkaCluster(configuration: kafka)
            producer = try KafkaProducer(configuration: kafka)
        }

        /// A lease long enough that a renewal on a loaded machine never outlasts it, unless a test is about its end.
        /// The waits for a late renewal, as the service's `mailpush_lease_wait_seconds` is told them.
        let leaseWaits = Mutex<[Duration]>([])

        func writer(_ owner: String, lease: Duration = .seconds(30)) -> StateWriter {
            StateWriter(
                stateTopic: FenceTests.stateTopic, instanceId: owner, producer: producer, cluster: admin,
                readerKafka: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers), requestTimeout: .seconds(10),
                deliveryTimeout: .seconds(20), messageTimeout: .milliseconds(1500), leaseDuration: lease,
                leaseWaited: { [self] wait in leaseWaits.withLock { $0.append(wait) } })
        }

        /// What a takeover does: the state partition's end (its restore reads up to there), then its claim, adopted.
        @discardableResult
        func claim(_ writer: StateWriter, epoch: Int64, restoredTo: Int64? = nil) async throws -> Int64 {
            let end: Int64
            if let restoredTo { end = restoredTo } else { end = try await stateEnd() }
            let leaseFrom = ContinuousClock.now
            let offset = try await writer.publishClaims([record(.claim, owner: writer.instanceId, epoch: epoch)])[0]
            writer.leases.adopt(0, epoch: epoch, claimOffset: offset, knownEnd: end, leaseFrom: leaseFrom)
            return offset
        }

        /// The lease of the tests about its end: the default. Every wait in them is a fraction or a multiple of it, so a
        /// slow machine has the same share of it as a fast one (with 300 ms, a renewal's round trip and the gate's
        /// look had to fit in 300 ms).
        static let endingLease = GroupSettings(id: "fence-tests").leaseDuration

        /// An owner of partition 0 at epoch 1 with an `endingLease` just renewed, and its delivery gate, open.
        func ownerWithOpenGate(_ owner: String) async throws -> (StateWriter, EnqueueGate) {
            let writer = writer(owner, lease: Self.endingLease)
            try await claim(writer, epoch: 1)
            #expect(try await writer.leases.renew().isEmpty)
            let gate = writer.leases.leaseGate([0])
            #expect(await gate.until() != nil)
            return (writer, gate)
        }

        func stateEnd() async throws -> Int64 {
            let partition = TopicPartition(topic: FenceTests.stateTopic, partition: 0)
            return try await admin.endOffsets([partition], timeout: .seconds(10))[partition] ?? 0
        }

        func record(_ kind: PartitionStateRecord.Kind, owner: String, epoch: Int64, from: Int64? = nil, offset: Int64 = 0)
            -> PartitionStateRecord
        {
            PartitionStateRecord(
                kind: kind, topic: "events", partition: 0, epoch: epoch, owner: owner, from: from, offset: offset, marks: [:],
                processedAtMs: kind == .batch ? 1 : nil, emails: kind == .batch ? [] : nil)
        }
    }

    @Test func aNewerClaimFencesTheOwnerAtItsNextRenewal() async throws {
        let fixture = try Fixture()
        let old = fixture.writer("old")
        let new = fixture.writer("new")
        try await fixture.claim(old, epoch: 1)
        #expect(try await old.leases.renew().isEmpty)
        #expect(old.leases.leaseValid([0]))

        try await fixture.claim(new, epoch: 2)
        #expect(try await old.leases.renew() == [0])
        #expect(!old.leases.leaseValid([0]))
        #expect(old.leases.fenced == [0])
        #expect(try await new.leases.renew().isEmpty)
        #expect(new.leases.leaseValid([0]))
    }

    @Test func aLateRecordOfAReplacedOwnerDoesNotFenceTheNewOwner() async throws {
        let fixture = try Fixture()
        let old = fixture.writer("old")
        let new = fixture.writer("new")
        try await fixture.claim(old, epoch: 1)
        try await fixture.claim(new, epoch: 2)
        // The replaced owner, paused before the claim, writes a batch record after it.
        try await old.publish([fixture.record(.batch, owner: "old", epoch: 1, from: 0, offset: 10)])
        #expect(try await new.leases.renew().isEmpty)
        #expect(new.leases.leaseValid([0]))
        #expect(try await old.leases.renew() == [0])
    }

    @Test func ofTwoClaimsOfOneEpochTheFirstInTheLogWins() async throws {
        let fixture = try Fixture()
        let first = fixture.writer("first")
        let second = fixture.writer("second")
        // Both restored the same (empty) state and claim epoch 1: the second claim lands after the first.
        try await fixture.claim(first, epoch: 1, restoredTo: 0)
        try await fixture.claim(second, epoch: 1, restoredTo: 0)
        #expect(try await second.leases.renew() == [0], "the later claim of an epoch loses")
        #expect(!second.leases.leaseValid([0]))
        #expect(try await first.leases.renew().isEmpty, "a later claim of the same epoch is no rival")
        #expect(first.leases.leaseValid([0]))
    }

    @Test func aReplayRequestARenewalFoundIsReadAgainByTheNextRestoreUntilItIsRecorded() async throws {
        let fixture = try Fixture()
        let owner = fixture.writer("owner")
        try await fixture.claim(owner, epoch: 1)
        let request = PartitionStateRecord(
            kind: .replay, topic: "events", partition: 0, epoch: -1, owner: "replay", from: 0, offset: 40, marks: [:],
            replayId: "r1", force: false)
        let at = try await fixture.producer.send(
            [OutgoingRecord(topic: Self.stateTopic, key: Array(request.key.utf8), value: request.encoded(), partition: 0)],
            timeout: .seconds(10))[0].offset
        try await owner.publish([fixture.record(.batch, owner: "owner", epoch: 1, from: 0, offset: 10)])
        #expect(try await owner.leases.renew().isEmpty)
        let end = try await fixture.stateEnd()
        #expect(owner.leases.replayRecords().map(\.replayId) == ["r1"])
        // Lost now (a pause past the session), the partition's next restore here must read the request again.
        #expect(owner.leases.restoreStart(of: 0) == at)
        owner.leases.forgetReplayRecords(1)
        #expect(owner.leases.replayRecords().isEmpty)
        #expect(owner.leases.restoreStart(of: 0) == end)
    }

    /// A claim right after the restore's end is known as any record of ours: the first renewal has nothing to read
    /// (before, it read and decoded the claim), renews the lease, and still finds a newer claim after it.
    @Test func aClaimRightAfterTheRestoredEndIsNotReadAgain() async throws {
        let fixture = try Fixture()
        let owner = fixture.writer("owner")
        try await fixture.claim(owner, epoch: 1)
        #expect(!owner.leases.renewedSinceClaim(0))
        #expect(try await owner.leases.renew().isEmpty)
        #expect(owner.leases.renewedSinceClaim(0) && owner.leases.leaseValid([0]))
        #expect(owner.leases.renewalConsumer.consumersMade == 0, "nothing to read: no consumer made")
        try await fixture.claim(fixture.writer("newer"), epoch: 2)
        #expect(try await owner.leases.renew() == [0])
        #expect(owner.leases.renewalConsumer.consumersMade == 1)
    }

    @Test func renewalsThatReadKeepOneConsumerAndStillFindANewerClaim() async throws {
        let fixture = try Fixture()
        let replaced = fixture.writer("replaced")
        let owner = fixture.writer("owner")
        try await fixture.claim(replaced, epoch: 1)
        try await fixture.claim(owner, epoch: 2)
        for offset in 0..<4 {
            // A replaced owner's late record: every renewal has something new to read, and no rival in it.
            try await replaced.publish([fixture.record(.batch, owner: "replaced", epoch: 1, from: 0, offset: Int64(offset))])
            #expect(try await owner.leases.renew().isEmpty)
        }
        #expect(owner.leases.renewalConsumer.consumersMade == 1, "one Kafka client for every renewal's read")
        // The kept consumer reads each look's range from its start: a newer claim after its last read is found.
        try await fixture.claim(fixture.writer("newer"), epoch: 3)
        #expect(try await owner.leases.renew() == [0])
        #expect(owner.leases.renewalConsumer.consumersMade == 1)
    }

    @Test func aLeaseEndsWithoutARenewalAndALookRenewsIt() async throws {
        let fixture = try Fixture()
        let lease = Fixture.endingLease
        let (writer, gate) = try await fixture.ownerWithOpenGate("owner")
        #expect(fixture.leaseWaits.withLock { $0.isEmpty }, "a valid lease is not a wait")
        try await Task.sleep(for: lease * 4 / 3)
        #expect(!writer.leases.leaseValid([0]), "no renewal for longer than the lease")
        // The delivery's gate waits for a renewal that is late (a slow broker), up to two lease periods...
        let started = ContinuousClock.now
        async let allowed = gate.until()
        try await Task.sleep(for: lease / 3)
        #expect(try await writer.leases.renew().isEmpty)
        #expect(await allowed.map { $0 > ContinuousClock.now } == true, "a late renewal lets the delivery go on")
        #expect(ContinuousClock.now - started < lease * 2)
        let waits = fixture.leaseWaits.withLock { $0 }
        // At least a quarter of a lease, not a third: the waiting task may start a moment after `started` (it once
        // told 0.332 s against a third of a lease, 0.333 s, on a busy machine).
        #expect(waits.count == 1 && waits[0] >= lease / 4 && waits[0] < lease * 2, "the wait is told: \(waits)")
        // ...and no longer.
        try await Task.sleep(for: lease * 4 / 3)
        let refused = ContinuousClock.now
        #expect(await gate.until() == nil)
        #expect(ContinuousClock.now - refused >= lease * 2 - .milliseconds(50))
    }

    @Test func aFencedPartitionStaysClosedToTheDeliveryGate() async throws {
        let fixture = try Fixture()
        let (old, gate) = try await fixture.ownerWithOpenGate("old")
        try await fixture.claim(fixture.writer("new"), epoch: 2)
        #expect(try await old.leases.renew() == [0])
        // A delivery keeps the lease end the gate gave: what it lets through until then was covered by a look that
        // saw no newer claim. Once that end has passed it asks again, and a fenced partition has no lease.
        #expect(old.leases.leaseEnd([0]) == nil)
        try await Task.sleep(for: Fixture.endingLease * 7 / 6)
        #expect(await gate.until() == nil)
        #expect(try await old.leases.renew().isEmpty, "a fenced partition is not looked at again")
        #expect(await gate.until() == nil)
    }
}

/// The wait of a revocation on the group member's thread (`GroupInbox.revoked`) for the batch loop's release.
struct RevocationWaitTests {
    func inbox(timeout: Duration) -> GroupInbox {
        GroupInbox(revocationTimeout: timeout, phases: PartitionPhases(), wake: {})
    }

    @Test func aRevocationWaitsUntilTheLoopHasReleasedThePartitions() async throws {
        let inbox = inbox(timeout: .seconds(30))
        inbox.assigned([0, 1])
        _ = inbox.take()
        let returned = Flag()
        let thread = Thread {
            inbox.revoked([0], lost: false)
            returned.set()
        }
        thread.start()
        // The thread may start late on a busy machine: the revocation is posted before it waits.
        try await waitFor { inbox.hasChanges }
        try await Task.sleep(for: .milliseconds(200))
        #expect(!returned.isSet, "the group must not move the partition while the loop may still write for it")
        let changes = inbox.take()
        #expect(changes.revoked == [0] && changes.lost.isEmpty)
        inbox.released([0])
        try await waitFor { returned.isSet }
    }

    @Test func aPartitionRevokedBeforeItsTakeoverNeedsNoWait() {
        let inbox = inbox(timeout: .seconds(30))
        inbox.assigned([3])
        let started = ContinuousClock.now
        inbox.revoked([3], lost: false)
        // Far below the timeout it would have waited out, however slow the machine.
        #expect(ContinuousClock.now - started < inbox.revocationTimeout / 2)
        #expect(inbox.take().isEmpty, "assigned and revoked before the loop looked: nothing to do")
    }

    @Test func aRevocationGivesUpWaitingAfterItsTimeoutOrWhenTheLoopCloses() async throws {
        let short = inbox(timeout: .milliseconds(200))
        short.assigned([0])
        _ = short.take()
        let started = ContinuousClock.now
        short.revoked([0], lost: true)
        #expect(ContinuousClock.now - started >= .milliseconds(200))
        #expect(short.take().lost == [0])

        let closing = inbox(timeout: .seconds(30))
        closing.assigned([1])
        _ = closing.take()
        let returned = Flag()
        Thread {
            closing.revoked([1], lost: false)
            returned.set()
        }.start()
        try await Task.sleep(for: .milliseconds(100))
        closing.close()
        try await waitFor { returned.isSet }
    }

    @Test func eachPartitionsLatestNewsIsWhatTheLoopActsOn() {
        let inbox = inbox(timeout: .zero)
        inbox.assigned([0, 1, 2])
        _ = inbox.take()
        inbox.revoked([0], lost: true)
        inbox.revoked([0], lost: false)
        inbox.revoked([1], lost: false)
        inbox.assigned([1, 3])
        let changes = inbox.take()
        #expect(changes.lost == [0], "a partition lost stays lost when the revocation repeats")
        #expect(changes.revoked == [0], "lost partitions count as revoked")
        #expect(changes.assigned == [1, 3], "an assignment after a revocation takes the partition over again")
        #expect(inbox.take().isEmpty)
    }

    @Test func joiningAndLosingTheGroupShowInReadiness() {
        let phases = PartitionPhases()
        let inbox = GroupInbox(revocationTimeout: .seconds(1), phases: phases, wake: {})
        #expect(phases.readiness.working == false)
        inbox.assigned([])
        #expect(phases.readiness.working, "joined with no partition: ready")
        inbox.assigned([2])
        #expect(!phases.readiness.working && phases.readiness.detail.contains("assigned [2]"))
        for phase in [PartitionPhases.Phase.restoring, .waitingForLease, .readingBack] {
            phases.set(phase, [2])
            #expect(!phases.readiness.working && phases.readiness.detail.contains("\(phase.rawValue) [2]"))
        }
        phases.set(.processing, [2])
        #expect(phases.readiness.working)
        inbox.revoked([2], lost: true)
        #expect(!phases.readiness.working && phases.readiness.detail == "joining the consumer group")
    }
}

struct PartitionPhaseTests {
    @Test func theTakeoverStepsAreTheOnlyMoves() {
        typealias Phase = PartitionPhases.Phase
        let steps: [Phase] = [.assigned, .restoring, .waitingForLease, .readingBack, .processing]
        for (from, to) in zip(steps, steps.dropFirst()) { #expect(from.mayBecome(to), "\(from) → \(to)") }
        #expect(Phase.restoring.mayBecome(.readingBack), "no previous owner to wait for")
        for phase in [Phase.restoring, .waitingForLease, .readingBack] {
            #expect(phase.mayBecome(.restoring), "a takeover that failed starts again")
        }
        #expect(!Phase.processing.mayBecome(.restoring), "a partition processing is not taken over again")
        #expect(!Phase.assigned.mayBecome(.processing), "nothing skips the takeover")
        #expect(!Phase.waitingForLease.mayBecome(.processing), "nothing skips the read-back")
    }
}

final class Flag: Sendable {
    private let value = Mutex(false)
    var isSet: Bool { value.withLock { $0 } }
    func set() { value.withLock { $0 = true } }
}

func waitFor(_ condition: () async throws -> Bool, within limit: Duration = .seconds(5)) async throws {
    let deadline = ContinuousClock.now + limit
    while try await !condition() {
        #expect(ContinuousClock.now < deadline, "condition not met within \(limit)")
        if ContinuousClock.now >= deadline { return }
        try await Task.sleep(for: .milliseconds(10))
    }
}
