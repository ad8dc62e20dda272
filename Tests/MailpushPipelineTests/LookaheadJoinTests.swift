import MailpushCore
import MailpushKafka
import MailpushTestSupport
import Testing

@testable import MailpushPipeline

/// A lookahead tops up the next batch with records that arrive while the batch before it is delivered:
/// each chunk is planned on its own and the plans are joined. The joined plan must decide and render what
/// one plan of all the records would.
struct LookaheadJoinTests {
    var processor = BatchProcessor(topics: Topics(), renderer: JobRenderer(options: RenderOptions()))

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
}
