import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState
import Testing

@testable import MailpushPipeline

/// A takeover's steps (`OwnedPartitions.takeOver`, docs/exactly-once.md, "A fleet") on librdkafka's mock cluster:
/// fleet members of one event partition, each with a state directory of its own, driven step by step as the batch
/// loop drives them when the group assigns the partition.
@Suite(.serialized)
struct TakeoverTests {
    typealias Fixture = PipelineTests.Harness

    /// Topics of one partition each.
    static func fixture() throws -> Fixture { try Fixture(partitions: 1) }

    /// One fleet member with the default group timings (unless a test sets its lease), and the loop state a takeover
    /// changes.
    struct Member {
        var owned: OwnedPartitions
        var committed: [TopicPartition: Int64] = [:]
        var recovery = Recovery()
        var replays = ServiceReplays()
        let delivery: OutputDelivery
        let phases = PartitionPhases()
        let eventPartition: TopicPartition

        /// `leaseDuration`: nil for the default; a test whose member must still hold its lease after steps that take
        /// seconds on a loaded machine (no renewals run here) sets a long one.
        /// `directory`: its state directory (a new one if nil; the same one for a restart).
        init(_ fixture: Fixture, directory: String? = nil, leaseDuration: Duration? = nil) throws {
            let store = try StateStore(directory: directory ?? PipelineTests.temporaryDirectory())
            var settings = GroupSettings(id: "takeover-tests")
            if let leaseDuration { settings.leaseDuration = leaseDuration }
            var configuration = PipelineConfiguration(kafka: fixture.kafka)
            configuration.ownership = .group(settings)
            let pipeline = Pipeline(configuration: configuration, store: store, logger: Logger(label: "test"))
            let cluster = try KafkaCluster(configuration: fixture.kafka)
            let writer = StateWriter(
                stateTopic: fixture.topics.state, instanceId: try store.instanceId(),
                producer: try KafkaProducer(configuration: fixture.kafka),
                cluster: cluster, readerKafka: fixture.kafka, requestTimeout: .seconds(10), deliveryTimeout: .seconds(20),
                messageTimeout: settings.messageTimeout, leaseDuration: settings.leaseDuration)
            let fleet = Fleet(
                settings: settings, inbox: GroupInbox(revocationTimeout: settings.revocationTimeout, phases: phases, wake: {}),
                writer: writer,
                statePublisher: try BatchStatePublisher(
                    writer: writer, store: store, interval: settings.stateWriteInterval, logger: pipeline.logger))
            owned = OwnedPartitions(group: fleet, pipeline: pipeline, cluster: cluster)
            delivery = try OutputDelivery(
                pipeline: pipeline, cluster: cluster,
                partitions: [
                    TopicPartition(topic: fixture.topics.jobs, partition: 0),
                    TopicPartition(topic: fixture.topics.deadLetters, partition: 0),
                ],
                producerKafka: fixture.kafka)
            eventPartition = TopicPartition(topic: fixture.topics.events, partition: 0)
        }

        var writer: StateWriter { owned.fleet!.writer }
        var store: StateStore { owned.pipeline.store }

        /// What the group's assignment of partition 0 makes the loop do.
        mutating func takeOver() async throws {
            phases.assigned([0])
            try await owned.takeOver([0], committed: &committed, recovery: &recovery, replays: &replays, delivery: delivery)
        }

        mutating func release() async throws {
            try await owned.release([0], committed: &committed, recovery: &recovery, replays: &replays)
        }

        /// What the loop does after a batch stopped with `OwnershipLost` (before its read-back).
        mutating func abandon(_ lost: Set<Int32>) throws {
            try owned.abandon(OwnershipLost(partitions: lost), committed: &committed, recovery: &recovery, replays: &replays)
        }

        func restore() async throws -> Takeover {
            phases.assigned([0])
            return try await owned.restore([0])
        }

        mutating func claim(_ takeover: inout Takeover) async throws {
            try await owned.claim(&takeover, committed: &committed, replays: &replays, delivery: delivery)
        }

        mutating func yieldToRivals(_ takeover: inout Takeover) async throws {
            try await owned.yieldToRivals(&takeover, committed: &committed, recovery: &recovery, replays: &replays)
        }

        /// The rest of a takeover after its claim: the lease wait, the read-back, processing.
        mutating func finish(_ takeover: inout Takeover) async throws -> OutputScanner.Scan {
            try await owned.waitForPreviousOwners(&takeover)
            return try await readBackAndProcess(takeover)
        }

        mutating func readBackAndProcess(_ takeover: Takeover) async throws -> OutputScanner.Scan {
            let scan = try await owned.readBack(takeover, committed: committed, recovery: &recovery, delivery: delivery)
            owned.startProcessing(takeover, readBack: scan)
            return scan
        }
    }

    @Test func aTakeoverAfterAReleaseStartsAtOnceWhereTheReleaseLeftOff() async throws {
        let fixture = try Self.fixture()
        // A lease that outlasts the takeover: on a loaded machine the default 1 s one ended before the release (no
        // renewals run here), and an owner whose lease ended rightly writes no release.
        var first = try Member(fixture, leaseDuration: .seconds(30))
        try await first.takeOver()
        #expect(first.owned.partitions == [first.eventPartition])
        #expect(first.phases.readiness.working)
        #expect(first.writer.leases.leaseValid([0]))
        first.committed[first.eventPartition] = 5 // its batches committed events up to offset 5
        try await first.release()
        #expect(first.owned.partitions.isEmpty && first.committed[first.eventPartition] == nil)

        var second = try Member(fixture, leaseDuration: .seconds(30))
        var takeover = try await second.restore()
        #expect(takeover.folds[0]?.released == true)
        try await second.claim(&takeover)
        #expect(!takeover.mustWait, "nothing of a released owner is in flight")
        try await second.yieldToRivals(&takeover)
        _ = try await second.finish(&takeover)
        #expect(takeover.waited == .zero, "no lease to wait out")
        #expect(second.owned.partitions == [second.eventPartition])
        #expect(second.committed[second.eventPartition] == 5, "it continues where the release left off")
        #expect(second.writer.leases.epoch(of: 0) == takeover.folds[0]!.epoch + 1, "a newer epoch than the first owner's")
        #expect(second.phases.readiness.working)
    }

    /// The gap chaos testing found (docs/exactly-once.md, "Unwritten state records"): an owner commits a batch and
    /// is killed before the batch's state record lands. Restarted on its state directory it takes the partition
    /// back from there, past that batch; a later owner, which restores from the state topic, must still find the
    /// batch's dedupe entries there, or it processes those emails again.
    @Test func aRestartThatTakesItsPartitionBackWritesTheBatchRecordsACrashLeftUnwritten() async throws {
        let fixture = try Self.fixture()
        let directory = PipelineTests.temporaryDirectory()
        var crashed = try Member(fixture, directory: directory, leaseDuration: .seconds(30))
        try await crashed.takeOver()
        let epoch = try #require(crashed.writer.leases.epoch(of: 0))
        let record = PartitionStateRecord.batch(
            topic: fixture.topics.events, partition: 0, epoch: epoch, owner: crashed.writer.instanceId, from: 0, offset: 3,
            marks: PartitionStateRecord.encodeMarks([TopicPartition(topic: fixture.topics.jobs, partition: 0): 2]),
            processedAtMs: Int64(Date().timeIntervalSince1970 * 1000), emails: ["email-of-event-1"])
        // Committed as the batch loop commits, then the process dies before the publisher writes the record.
        try crashed.store.commitEventBatch(
            offsets: [crashed.eventPartition: 3], processedEmails: ["email-of-event-1"], processedAtMs: record.processedAtMs!,
            outputMarks: [:],
            stateRecords: { _ in PartitionStateRecord.unwritten(PartitionStateRecord.unwrittenValues([record]), marks: record.marks) })

        var restarted = try Member(fixture, directory: directory)
        try await restarted.takeOver()
        #expect(restarted.committed[restarted.eventPartition] == 3, "the restart continues from its state directory")
        #expect(try restarted.store.unwrittenStateRecords(except: []).isEmpty)
        // It dies again, without a release (which would also write what it kept unwritten).

        let successor = try Member(fixture)
        let takeover = try await successor.restore()
        #expect(takeover.folds[0]?.offset == 3)
        #expect(takeover.folds[0]?.emails["email-of-event-1"] != nil, "the crashed batch's dedupe entry reached the state topic")
        let end = try #require(takeover.ranges[0]?.to)
        let written = try await successor.writer.leases.reader.read([0: (0, end)]).records[0, default: []].map(\.record)
        #expect(written.filter { $0.kind == .batch } == [record], "the record as committed, its batch's marks included")
    }

    /// A batch record whose write failed (the state topic refused it five times in a row) goes to the state topic
    /// before the release: the release moves the partition's offset past that batch, so a successor would otherwise
    /// miss its dedupe entries.
    @Test func aReleaseWritesTheBatchRecordsLeftUnwrittenBeforeIt() async throws {
        let fixture = try Self.fixture()
        var owner = try Member(fixture, leaseDuration: .seconds(30))
        try await owner.takeOver()
        let record = PartitionStateRecord.batch(
            topic: fixture.topics.events, partition: 0, epoch: try #require(owner.writer.leases.epoch(of: 0)),
            owner: owner.writer.instanceId, from: 0, offset: 3, marks: [:], processedAtMs: Int64(Date().timeIntervalSince1970 * 1000),
            emails: ["email-of-event-1"])
        let batch = try owner.store.commitEventBatch(
            offsets: [owner.eventPartition: 3], processedEmails: ["email-of-event-1"], processedAtMs: record.processedAtMs!,
            outputMarks: [:],
            stateRecords: { _ in PartitionStateRecord.unwritten(PartitionStateRecord.unwrittenValues([record]), marks: record.marks) })
        owner.committed[owner.eventPartition] = 3
        fixture.cluster.pushRequestErrors(apiKey: KafkaApiKey.produce, errors: Array(repeating: 10, count: 5)) // MSG_SIZE_TOO_LARGE
        owner.owned.publishBatchState([record], stored: batch)
        await owner.owned.settleStatePublish()
        let end = try await KafkaCluster(configuration: fixture.kafka).endOffsets(
            [owner.writer.statePartition(0)], timeout: .seconds(10))[owner.writer.statePartition(0)]!
        #expect(
            try await owner.writer.leases.reader.read([0: (0, end)]).records[0, default: []].allSatisfy { $0.record.kind != .batch },
            "the batch record's write was given up")
        try await owner.release()
        #expect(try owner.store.unwrittenStateRecords(except: []).isEmpty)
        #expect(try owner.store.splitUnwrittenBatches() == 0, "the batch left the state directory once its record was written")

        let successor = try Member(fixture)
        let takeover = try await successor.restore()
        #expect(takeover.folds[0]?.released == true && takeover.folds[0]?.offset == 3)
        #expect(takeover.folds[0]?.emails["email-of-event-1"] != nil, "the batch's dedupe entry reached the state topic")
    }

    @Test func aTakeoverAfterAnOwnerThatDidNotReleaseWaitsOutItsLease() async throws {
        let fixture = try Self.fixture()
        var first = try Member(fixture)
        try await first.takeOver()
        // The first owner stops without a release (a crash, or a pause past the session timeout).

        var second = try Member(fixture)
        var takeover = try await second.restore()
        try await second.claim(&takeover)
        #expect(takeover.mustWait)
        try await second.yieldToRivals(&takeover)
        try await second.owned.waitForPreviousOwners(&takeover)
        #expect(
            ContinuousClock.now - takeover.claimedAt >= second.writer.leases.takeoverWait,
            "nothing is read back before the previous owner's outputs can no longer land")
        #expect(second.phases.readiness.detail.contains("waiting_for_lease [0]"))
        #expect(try await first.writer.leases.renew() == [0], "the replaced owner is fenced by the newer claim")
        #expect(!first.writer.leases.leaseValid([0]))
        _ = try await second.readBackAndProcess(takeover)
        #expect(second.phases.readiness.working)
        #expect(try await second.writer.leases.renew().isEmpty, "its renewals find no rival")
    }

    @Test func aTakeoverReadsBackWhatThePreviousOwnerWroteSinceItsClaim() async throws {
        let fixture = try Self.fixture()
        // An output in the jobs topic before the partition was ever claimed: the claim's marks lie past it.
        try await fixture.writeJob(forEventAt: 7)
        var first = try Member(fixture)
        try await first.takeOver()
        // Its first batch, events 0 and 1: both jobs written, then a crash before the commit.
        try await fixture.writeJob(forEventAt: 0)
        try await fixture.writeJob(forEventAt: 1)

        var second = try Member(fixture)
        var takeover = try await second.restore()
        try await second.claim(&takeover)
        try await second.yieldToRivals(&takeover)
        let scan = try await second.finish(&takeover)
        #expect(second.committed[second.eventPartition] == 0, "the events are processed again")
        #expect(scan.recordsRead == 2, "the read-back starts at the claim's marks")
        #expect(second.recovery.found == [fixture.jobIdentity(forEventAt: 0), fixture.jobIdentity(forEventAt: 1)])
        #expect(!second.recovery.isSettled, "those jobs are not produced again when their events are")
    }

    @Test func ofTwoMembersClaimingOneEpochTheEarlierClaimTakesOverAndTheLaterWritesNothing() async throws {
        let fixture = try Self.fixture()
        var first = try Member(fixture)
        var second = try Member(fixture)
        // Both restore the same (empty) state before either claims: both claim the same epoch.
        var firstTakeover = try await first.restore()
        var secondTakeover = try await second.restore()
        try await first.claim(&firstTakeover)
        try await second.claim(&secondTakeover)
        #expect(first.writer.leases.epoch(of: 0) == second.writer.leases.epoch(of: 0))

        try await second.yieldToRivals(&secondTakeover)
        #expect(secondTakeover.partitions.isEmpty, "the later claim loses")
        #expect(second.owned.partitions.isEmpty && second.committed.isEmpty)
        #expect(!second.writer.leases.leaseValid([0]), "it may write nothing for the partition")
        #expect(!second.phases.readiness.detail.contains("[0]"))

        try await first.yieldToRivals(&firstTakeover)
        #expect(firstTakeover.partitions == [0], "the earlier claim wins")
        _ = try await first.finish(&firstTakeover)
        #expect(first.owned.partitions == [first.eventPartition])
        #expect(try await first.writer.leases.renew().isEmpty, "its renewals find no rival")
    }

    @Test func aBatchStoppedByAnEndedLeaseClaimsThePartitionAgainButNotOneANewerOwnerClaimed() async throws {
        let fixture = try Self.fixture()
        var first = try Member(fixture)
        try await first.takeOver()
        // No renewal in time (a slow broker): the lease merely ran out, and the partition is taken over again.
        try first.abandon([0])
        #expect(first.owned.partitions.isEmpty)
        #expect(first.owned.fleet!.inbox.take().assigned == [0])
        try await first.takeOver()
        #expect(first.owned.partitions == [first.eventPartition])

        // A newer owner's claim: the partition waits for the group to revoke it, and is not claimed back.
        var second = try Member(fixture)
        var takeover = try await second.restore()
        try await second.claim(&takeover)
        #expect(try await first.writer.leases.renew() == [0])
        try first.abandon([0])
        #expect(first.owned.partitions.isEmpty)
        #expect(first.owned.fleet!.inbox.take().isEmpty, "claiming it back would fence the newer owner")
    }

    /// `mailpush offsets --set` beside a running owner: its renewal sees the request, and the loop claims the
    /// partition again from the offset set. A claim that fails leaves the partition given up with its request
    /// returned: the retry takes it over from the request, not from where this instance's state says.
    @Test func aPositionRequestSeenInARenewalIsTakenUpAndAFailedTakeUpIsRetried() async throws {
        let fixture = try Self.fixture()
        var owner = try Member(fixture, leaseDuration: .seconds(30))
        try await owner.takeOver()
        #expect(owner.committed[owner.eventPartition] == 0)
        try await FleetView.requestPositions(
            kafka: fixture.kafka, topics: fixture.topics, offsets: [0: 7], requestedBy: "operator", host: "laptop",
            timeout: .seconds(10))
        #expect(try await owner.writer.leases.renew().isEmpty, "a request fences nobody")
        #expect(owner.owned.hasNews)
        let news = try #require(owner.owned.takeGroupNews())
        #expect(news.positions[0]?.offset == 7)

        fixture.cluster.pushRequestErrors(apiKey: KafkaApiKey.produce, errors: [10]) // the new claim: MSG_SIZE_TOO_LARGE
        await #expect(throws: (any Error).self) {
            try await owner.owned.act(
                on: news, committed: &owner.committed, recovery: &owner.recovery, replays: &owner.replays, delivery: owner.delivery)
        }
        #expect(owner.owned.partitions.isEmpty)
        let retry = try #require(owner.owned.takeGroupNews())
        #expect(retry.changes.assigned == [0] && retry.positions[0]?.offset == 7)
        try await owner.owned.act(
            on: retry, committed: &owner.committed, recovery: &owner.recovery, replays: &owner.replays, delivery: owner.delivery)
        #expect(owner.owned.partitions == [owner.eventPartition])
        #expect(owner.committed[owner.eventPartition] == 7)
        #expect(try owner.store.offsets()[owner.eventPartition] == 7)

        // The new claim comes after the request: a successor follows the claim, and sees no request waiting.
        let successor = try Member(fixture)
        let takeover = try await successor.restore()
        #expect(takeover.folds[0]?.offset == 7 && takeover.folds[0]?.owner == owner.writer.instanceId)
        #expect(takeover.folds[0]?.pendingPosition == nil)
    }

    /// The same request, and the process dies after giving the partition up, before its new claim: the restart
    /// restores from what its state directory kept, which does not start past the request.
    @Test func aPositionRequestSeenBeforeACrashIsTakenUpByTheRestart() async throws {
        let fixture = try Self.fixture()
        let directory = PipelineTests.temporaryDirectory()
        var owner = try Member(fixture, directory: directory, leaseDuration: .seconds(30))
        try await owner.takeOver()
        try await FleetView.requestPositions(
            kafka: fixture.kafka, topics: fixture.topics, offsets: [0: 5], requestedBy: "operator", host: "laptop",
            timeout: .seconds(10))
        #expect(try await owner.writer.leases.renew().isEmpty)
        try owner.owned.giveUp([0], committed: &owner.committed, recovery: &owner.recovery, replays: &owner.replays)

        var restarted = try Member(fixture, directory: directory)
        try await restarted.takeOver()
        #expect(restarted.committed[restarted.eventPartition] == 5)
    }

    /// A request that lands between a member's restore and its claim: the claim comes after it in the log, but was
    /// made without it. The command does not count that claim as taking it up; a successor restoring now would take
    /// it up, and so does the member's restart when it dies before its first renewal.
    @Test func aPositionRequestThatRacedAClaimIsTakenUpByTheNextClaim() async throws {
        let fixture = try Self.fixture()
        let directory = PipelineTests.temporaryDirectory()
        var owner = try Member(fixture, directory: directory, leaseDuration: .seconds(30))
        var takeover = try await owner.restore()
        let landed = try await FleetView.requestPositions(
            kafka: fixture.kafka, topics: fixture.topics, offsets: [0: 6], requestedBy: "operator", host: "laptop",
            timeout: .seconds(10))
        try await owner.claim(&takeover)
        #expect(owner.committed[owner.eventPartition] == 0)
        func takenUp() async throws -> Set<Int32> {
            try await FleetView.positionsTakenUp(
                kafka: fixture.kafka, stateTopic: fixture.topics.state, eventsTopic: fixture.topics.events, landed: landed,
                timeout: .seconds(10))
        }
        #expect(try await takenUp().isEmpty)

        let successor = try Member(fixture)
        let seen = try await successor.restore()
        #expect(seen.folds[0]?.offset == 6 && seen.folds[0]?.position?.offset == 6)

        var restarted = try Member(fixture, directory: directory)
        try await restarted.takeOver()
        #expect(restarted.committed[restarted.eventPartition] == 6)
        #expect(try await takenUp() == [0])
    }

    /// The same race with a replay request (`mailpush replay` in a fleet): the member that dies before its first
    /// renewal reads the request again when it restarts, and executes the replay.
    @Test func aReplayRequestThatRacedAClaimIsRecordedByTheRestart() async throws {
        let fixture = try Self.fixture()
        let directory = PipelineTests.temporaryDirectory()
        var owner = try Member(fixture, directory: directory, leaseDuration: .seconds(30))
        var takeover = try await owner.restore()
        _ = try await FleetView.requestReplay(
            kafka: fixture.kafka, eventsTopic: fixture.topics.events, stateTopic: fixture.topics.state, replayId: "backfill",
            ranges: [(partition: 0, from: 0, to: 3)], force: false, timeout: .seconds(10))
        try await owner.claim(&takeover)
        #expect(try owner.store.pendingReplays().isEmpty)

        var restarted = try Member(fixture, directory: directory)
        try await restarted.takeOver()
        let replays = try restarted.store.pendingReplays()
        let recorded = try restarted.store.fleetReplayLocalId(replayId: "backfill", partition: 0)
        #expect(replays.count == 1 && replays.first?.id == recorded)
    }

    /// `mailpush offsets --brokers` reads each state partition's last records only: the checkpoint among them
    /// stands for what came before (and names the owner's host); a partition whose last records name no owner is
    /// read from its beginning.
    @Test func theFleetViewFoldsTheLastRecordsFromTheirCheckpoint() async throws {
        let fixture = try Self.fixture()
        let events = fixture.topics.events
        var records = [
            PartitionStateRecord.claim(
                topic: events, partition: 0, epoch: 3, owner: "a", host: "pod-a", offset: 0, marks: [:], restoredTo: 0)
        ]
        for batch in 0..<20 {
            records.append(
                .batch(
                    topic: events, partition: 0, epoch: 3, owner: "a", from: Int64(batch * 10), offset: Int64(batch * 10 + 10),
                    marks: [:], processedAtMs: 1, emails: ["e\(batch)"]))
            if batch == 14 { records.append(.checkpoint(of: records.last!, host: "pod-a", atMs: 2)) }
        }
        let results = try await fixture.producer.send(
            records.map { OutgoingRecord(topic: fixture.topics.state, key: Array($0.key.utf8), value: $0.encoded(), partition: 0) },
            timeout: .seconds(10))
        #expect(results.allSatisfy { $0.error == nil })

        func view(tail: Int64) async throws -> FleetPartition? {
            try await FleetView.read(
                kafka: fixture.kafka, eventsTopic: events, stateTopic: fixture.topics.state, timeout: .seconds(10), tail: tail
            ).first
        }
        for tail: Int64 in [7, 100] {
            let partition = try #require(try await view(tail: tail))
            #expect(partition.offset == 200 && partition.epoch == 3 && partition.owner == "a" && partition.host == "pod-a", "tail \(tail)")
        }
        // The last 3 are batch records: their owner and offset, but no host.
        let short = try #require(try await view(tail: 3))
        #expect(short.offset == 200 && short.owner == "a" && short.host == nil)
    }
}

extension PipelineTests.Harness {
    /// A job for the event at `offset` of event partition 0, with the headers a delivery gives it.
    func writeJob(forEventAt offset: Int64) async throws {
        let source = "\(topics.events)/0/\(offset)"
        let record = OutgoingRecord(
            topic: topics.jobs, key: Array(source.utf8), value: Array("sealed".utf8),
            headers: [
                KafkaHeader(key: Header.source, value: Array(source.utf8)),
                KafkaHeader(key: Header.jobId, value: Array("job-\(offset)".utf8)),
            ])
        let results = try await producer.send([record], timeout: .seconds(10))
        #expect(results.allSatisfy { $0.error == nil })
    }

    func jobIdentity(forEventAt offset: Int64) -> OutputIdentity {
        OutputIdentity(topic: topics.jobs, source: "\(topics.events)/0/\(offset)", jobId: "job-\(offset)")
    }
}
