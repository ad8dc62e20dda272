import MailpushCore
import MailpushKafka
import MailpushTestSupport
import Synchronization
import Testing

@testable import MailpushPipeline

/// A lookahead tops up the next batch with records that arrive while the batch before it is delivered:
/// each chunk is planned on its own and the plans are joined. The joined plan must decide and render what
/// one plan of all the records would.
struct LookaheadJoinTests {
    var processor = BatchProcessor(
        topics: Topics(), configuration: PipelineConfiguration(kafka: KafkaConfiguration(bootstrapServers: "unused:9092")))

    func config() throws -> ConfigView {
        let ios = try DeviceRegistration.decode(Fixtures.device(deviceId: "dev-ios").bytes)
        let android = try DeviceRegistration.decode(
            Fixtures.device(
                deviceId: "dev-android", target: .android(token: "fcm-1"), filter: SudoFilterList().initEmailNotifications(on: .android)
            )
            .bytes)
        return ConfigView(
            devicesByOwner: ["user-1": [android, ios]], keysByAddress: ["em-add-1": .usable(try TestKeys.addressKey())])
    }

    func record(_ offset: Int64, _ value: [UInt8]) -> KafkaRecord {
        KafkaRecord(
            topic: "email.received", partition: Int32(offset % 3), offset: offset, key: nil, value: value, headers: [], timestampMs: nil)
    }

    /// Jobs for m1 and m2, m1 again (a duplicate), a record that is not JSON, an address without a key, m3.
    /// `copy` > 0 gives other message ids and offsets, for batches of many copies.
    func records(copy: Int = 0) -> [KafkaRecord] {
        let tag = copy == 0 ? "" : "c\(copy)-"
        let first = Int64(copy * 6)
        return [
            record(first, Fixtures.event(messageId: "\(tag)m1").bytes),
            record(first + 1, Fixtures.event(messageId: "\(tag)m2").bytes),
            record(first + 2, Fixtures.event(messageId: "\(tag)m1").bytes),
            record(first + 3, Array("not json".utf8)),
            record(first + 4, Fixtures.event(emailAddressId: "em-add-unknown", messageId: "\(tag)m4").bytes),
            record(first + 5, Fixtures.event(messageId: "\(tag)m3").bytes),
        ]
    }

    struct Outcome: Equatable {
        var outputs: [String]
        var processedEmails: [String]
        var duplicates: Int
    }

    func outcome(_ plan: BatchPlan, roundDevices: Int) async throws -> Outcome {
        var plan = plan
        var outputs: [String] = []
        try await processor.renderAndEmit(&plan, roundDevices: roundDevices) { round, _ in
            outputs += round.map { output in
                switch output.kind {
                case .job(let jobId, let platform): "job \(output.source.headerValue) \(platform) \(jobId)"
                case .deadLetter(let reason, let detail): "dead letter \(output.source.headerValue) \(reason.rawValue): \(detail)"
                }
            }
        }
        return Outcome(outputs: outputs, processedEmails: plan.batch.processedEmails, duplicates: plan.batch.duplicates)
    }

    func plan(
        _ records: [KafkaRecord], inFlight: Set<String>, plannedBefore: Set<String> = [], firstRoundDevices: Int
    ) async throws -> BatchPlan {
        let view = try config()
        var plan = try processor.plan(
            records, nowMs: 1_700_000_000_000, config: { _, _ in view }, alreadyProcessed: { _ in [] }, inFlight: inFlight,
            plannedBefore: plannedBefore)
        await processor.renderFirstRound(&plan, roundDevices: firstRoundDevices)
        return plan
    }

    @Test(arguments: [1, 2, 3, 4, 5], [1, 4096])
    func joinedChunksDecideAndRenderAsOneBatch(split: Int, secondRoundDevices: Int) async throws {
        let all = records()
        let whole = try await outcome(plan(all, inFlight: [], firstRoundDevices: 4096), roundDevices: 4096)
        let first = try await plan(Array(all[..<split]), inFlight: [], firstRoundDevices: 4096)
        #expect(first.isRenderedWithoutFailures)
        let second = try await plan(
            Array(all[split...]), inFlight: [], plannedBefore: first.plannedEmails, firstRoundDevices: secondRoundDevices)
        var joined = first
        joined.extend(with: second)
        #expect(joined.records.map(\.offset) == all.map(\.offset))

        let parts = try await outcome(joined, roundDevices: secondRoundDevices)
        #expect(parts == whole)
        #expect(whole.duplicates == 1)
        #expect(whole.processedEmails.count == 3)
        #expect(whole.outputs.filter { $0.hasPrefix("job ") }.count == 6)
        #expect(whole.outputs.filter { $0.hasPrefix("dead letter ") }.count == 2)
    }

    /// A fleet makes a batch's state records from the batch handed over with its last round, while that round is
    /// delivered: it must be the batch as its commit stores it, with every round's processed emails.
    @Test(arguments: [1, 2, 4096])
    func theLastRoundCarriesTheFinishedBatch(roundDevices: Int) async throws {
        var plan = try await plan(records(), inFlight: [], firstRoundDevices: roundDevices)
        var rounds = 0
        var handed: [ProcessedBatch?] = []
        try await processor.renderAndEmit(&plan, roundDevices: roundDevices) { _, finished in
            rounds += 1
            handed.append(finished)
        }
        #expect(rounds >= (roundDevices == 1 ? 3 : 1))
        #expect(handed.dropLast().allSatisfy { $0 == nil })
        let finished = try #require(handed.last ?? nil)
        #expect(finished.processedEmails == plan.batch.processedEmails)
        #expect(finished.processedEmailPartitions == plan.batch.processedEmailPartitions)
        #expect(finished.processedEmails.count == 3)
    }

    @Test func aDuplicateOfAnEarlierChunkCountsAsInFlight() async throws {
        let all = records()
        let first = try await plan(Array(all[..<2]), inFlight: [], firstRoundDevices: 4096)
        let second = try await plan(Array(all[2...]), inFlight: [], plannedBefore: first.plannedEmails, firstRoundDevices: 4096)
        var joined = first
        joined.extend(with: second)
        // The batch loop replans the lookahead when the batch in flight did not process one of these.
        #expect(joined.countedAsInFlight == [DedupeKey.of(try EmailReceived.decode(all[2].value!))])
        #expect(joined.plannedEmails.count == 3)
    }

    /// Renderers take slices as they become free, in no fixed order: the outputs must still come in record order,
    /// whatever the number of renderers.
    @Test(arguments: [2, 3, 8])
    func severalRenderersKeepRecordOrder(parallelism: Int) async throws {
        let many = (0..<8).flatMap { records(copy: $0) }
        var single = self
        single.processor.parallelism = 1
        let one = try await single.outcome(single.plan(many, inFlight: [], firstRoundDevices: 4096), roundDevices: 4096)
        var spread = self
        spread.processor.parallelism = parallelism
        let several = try await spread.outcome(spread.plan(many, inFlight: [], firstRoundDevices: 4096), roundDevices: 4096)
        #expect(several == one)
        #expect(one.outputs.filter { $0.hasPrefix("job ") }.count == 8 * 6)
        #expect(one.duplicates == 8)
    }

    /// The outputs of `plan`'s first round as its delivery assembles them, and the pieces `renderFirstRound`
    /// offered while rendering it (`answers` says which pieces are taken, in turn; then every piece is).
    func renderInPieces(
        _ records: [KafkaRecord], parallelism: Int, answers: [Bool] = []
    ) async throws -> (delivered: [Output], offered: [(outputs: [Output], partitions: Set<Int32>, taken: Bool)]) {
        var spread = self
        spread.processor.parallelism = parallelism
        let view = try config()
        var plan = try spread.processor.plan(records, nowMs: 1_700_000_000_000, config: { _, _ in view }, alreadyProcessed: { _ in [] })
        var offered: [(outputs: [Output], partitions: Set<Int32>, taken: Bool)] = []
        await spread.processor.renderFirstRound(&plan, roundDevices: 4096) { outputs, partitions in
            let taken = offered.count < answers.count ? answers[offered.count] : true
            offered.append((outputs, partitions, taken))
            return taken
        }
        return (try #require(spread.processor.outputsOfWholeFirstRound(plan)), offered)
    }

    /// A large chunk's first round goes out in pieces while the rest of it renders: each piece whole emails,
    /// the pieces taken in order the start of what its delivery assembles.
    @Test(arguments: [1, 2, 3])
    func piecesOfAFirstRoundAreWholeEmailsInDeliveryOrder(parallelism: Int) async throws {
        let many = (0..<8).flatMap { records(copy: $0) }
        let (delivered, offered) = try await renderInPieces(many, parallelism: parallelism)
        let streamed = offered.flatMap(\.outputs)
        #expect(streamed.map(\.identity) == delivered.prefix(streamed.count).map(\.identity))
        var end = 0
        for piece in offered {
            end += piece.outputs.count
            // No email's outputs are split between a piece and what follows it.
            if end < delivered.count { #expect(delivered[end - 1].source != delivered[end].source) }
            #expect(piece.partitions.isSuperset(of: piece.outputs.map(\.source.partition)))
        }
        if parallelism == 1 {
            // The calling task renders every unit, and offers each piece as it is done.
            #expect(offered.count == many.count / BatchProcessor.unitsPerPiece(of: many.count))
            #expect(offered.count > 1)
            #expect(streamed.count == delivered.count)
        }
    }

    /// A piece not taken is offered again with the next one: what is taken stays the start of the delivery's
    /// outputs, with nothing skipped.
    @Test func aPieceNotTakenIsOfferedAgainGrown() async throws {
        let many = (0..<8).flatMap { records(copy: $0) }
        let (delivered, offered) = try await renderInPieces(many, parallelism: 1, answers: [false])
        let pieces = many.count / BatchProcessor.unitsPerPiece(of: many.count)
        #expect(pieces > 2)
        #expect(offered.map(\.taken) == [false] + Array(repeating: true, count: pieces - 1))
        #expect(offered[1].outputs.map(\.identity) == delivered.prefix(offered[1].outputs.count).map(\.identity))
        #expect(offered[1].outputs.count > offered[0].outputs.count)
        #expect(offered.dropFirst().flatMap(\.outputs).map(\.identity) == delivered.map(\.identity))
    }

    /// An email of more than one slice (more than `devicesPerSlice` devices) is never cut between pieces.
    @Test func aPieceEndsAfterTheLastSliceOfAnEmail() throws {
        let view = try config()
        var many = (0..<3).flatMap { records(copy: $0) }
        many.append(record(100, Fixtures.event(owner: "user-big", messageId: "big").bytes))
        let devices = try (0..<(BatchProcessor.devicesPerSlice + 1)).map { number in
            try DeviceRegistration.decode(Fixtures.device(deviceId: "dev-\(number)", owner: "user-big").bytes)
        }
        var byOwner = view.devicesByOwner
        byOwner["user-big"] = devices
        let bigView = ConfigView(devicesByOwner: byOwner, keysByAddress: view.keysByAddress)
        let plan = try processor.plan(many, nowMs: 1_700_000_000_000, config: { _, _ in bigView }, alreadyProcessed: { _ in [] })
        let units = plan.units.count
        // The big email's two slices come last.
        #expect(plan.endOfLastEmail(in: 0..<units) == units)
        #expect(plan.endOfLastEmail(in: 0..<(units - 1)) == units - 2)
        #expect(plan.endOfLastEmail(in: (units - 1)..<(units - 1)) == nil)
    }

    /// A chunk written ahead in pieces and then its rest: nothing before the config is confirmed, nothing while
    /// the batch in flight has not enqueued everything (asked again later), nothing after a refusal.
    @Test func aChunkWrittenAheadIsAPrefixOfItsOutputs() async throws {
        let cluster = try MockKafkaCluster(brokers: 1)
        let topics = Topics()
        for topic in topics.all { try cluster.createTopic(topic, partitions: 3) }
        let producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        let (outputs, _) = try await renderInPieces((0..<8).flatMap { records(copy: $0) }, parallelism: 1)
        let leaseValid = Atomic<Bool>(true)
        let ahead = WriteAhead(producer: producer, mayWrite: { _ in leaseValid.load(ordering: .relaxed) })
        let chunk = ChunkWriteAhead(ahead)
        let first = Array(outputs[..<10])
        #expect(!chunk.offer(first, partitions: [0]))
        chunk.configConfirmed.set()
        #expect(!chunk.offer(first, partitions: [0]))
        ahead.open()
        #expect(chunk.offer(first, partitions: [0]))
        #expect(chunk.finish(outputs, partitions: [0, 1, 2]))
        #expect(chunk.writes.flatMap(\.outputs).map(\.identity) == outputs.map(\.identity))
        for write in chunk.writes {
            let results = try await write.pending.results(timeout: .seconds(10))
            #expect(results.allSatisfy { $0.error == nil })
        }

        let refusing = ChunkWriteAhead(ahead)
        refusing.configConfirmed.set()
        #expect(refusing.offer(first, partitions: [0]))
        leaseValid.store(false, ordering: .relaxed)
        #expect(!refusing.offer(Array(outputs[10..<20]), partitions: [1]))
        leaseValid.store(true, ordering: .relaxed)
        #expect(!refusing.offer(Array(outputs[10..<20]), partitions: [1]))
        #expect(!refusing.finish(outputs, partitions: [0, 1, 2]))
        #expect(refusing.writes.flatMap(\.outputs).map(\.identity) == first.map(\.identity))
        _ = try await refusing.writes[0].pending.results(timeout: .seconds(10))
    }
}
