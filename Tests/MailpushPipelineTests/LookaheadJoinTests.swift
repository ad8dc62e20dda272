import MailpushCore
import MailpushKafka
import MailpushTestSupport
import Testing

@testable import MailpushPipeline

/// A lookahead tops up the next batch with records that arrive while the batch before it is delivered:
/// each chunk is planned on its own and the plans are joined. The joined plan must decide and render what
/// one plan of all the records would.
struct LookaheadJoinTests {
    let processor = BatchProcessor(topics: Topics(), renderer: JobRenderer(options: RenderOptions()))

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
    func records() -> [KafkaRecord] {
        [
            record(0, Fixtures.event(messageId: "m1").bytes),
            record(1, Fixtures.event(messageId: "m2").bytes),
            record(2, Fixtures.event(messageId: "m1").bytes),
            record(3, Array("not json".utf8)),
            record(4, Fixtures.event(emailAddressId: "em-add-unknown", messageId: "m4").bytes),
            record(5, Fixtures.event(messageId: "m3").bytes),
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
}
