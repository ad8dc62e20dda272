import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushState
import MailpushTestSupport
import Synchronization
import Testing

@testable import MailpushPipeline

/// The pipeline end to end against librdkafka's mock cluster, real SQLite files and real cryptography.
@Suite(.serialized)
struct PipelineTests {
    final class Harness: Sendable {
        let cluster: MockKafkaCluster
        let topics = Topics()
        let producer: KafkaProducer

        init(partitions: Int = 2) throws {
            cluster = try MockKafkaCluster(brokers: 1)
            for topic in topics.all { try cluster.createTopic(topic, partitions: partitions) }
            producer = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: cluster.bootstrapServers))
        }

        var kafka: KafkaConfiguration { KafkaConfiguration(bootstrapServers: cluster.bootstrapServers) }

        func publish(_ topic: String, key: String, json: String?) async throws {
            let results = try await producer.send(
                [OutgoingRecord(topic: topic, key: Array(key.utf8), value: json.map { Array($0.utf8) }, headers: [])],
                timeout: .seconds(10))
            #expect(results.allSatisfy { $0.error == nil })
        }

        func registerKey(address: String) async throws {
            let der = TestKeys.shared.publicKeySPKIBase64
            try await publish(
                topics.addressKeys, key: address,
                json: """
                    {"emailAddressId":"\(address)","owner":"user-1","keyId":"key-\(address)","algorithm":"RSAEncryptionOAEPAESCBC","keyFormat":"SPKI","publicKey":"\(der)"}
                    """)
        }

        func registerDevice(_ deviceId: String, disabledAddress: String? = nil) async throws {
            var filter =
                #"{"serviceName":"emService","actionType":"DISABLE","rule":"{\"!=\":[{\"var\":\"meta.type\"},\"messageReceived\"]}"}"#
            if let disabledAddress {
                filter +=
                    #",{"serviceName":"emService","actionType":"DISABLE","rule":"{\"==\":[{\"var\":\"meta.emailAddressId\"},\"\#(disabledAddress)\"]}"}"#
            }
            filter += #",{"serviceName":"emService","actionType":"ENABLE","rule":"{\"==\":[1,1]}"}"#
            try await publish(
                topics.devices, key: deviceId,
                json: """
                    {"deviceId":"\(deviceId)","owner":"user-1","bundleId":"com.example.mail","platform":"ios","pushToken":"tok-\(deviceId)","filter":[\(filter)]}
                    """)
        }

        func publishEvent(address: String, messageId: String) async throws {
            try await publish(
                topics.events, key: address,
                json: """
                    {"owner":"user-1","emailAddressId":"\(address)","sudoId":"sudo-1","messageId":"\(messageId)","folderId":"\(address)-INBOX","encryptionStatus":"UNENCRYPTED","subject":"Hello \(messageId)","from":{"emailAddress":"a@example.com","displayName":"Alice"},"hasAttachments":false,"sentAtEpochMs":1718330537000,"receivedAtEpochMs":1718330541336}
                    """)
        }

        /// Every record of `topic`, read by a consumer of its own.
        func readAll(_ topic: String) async throws -> [KafkaRecord] {
            let consumer = try KafkaConsumer(configuration: kafka)
            defer { consumer.close() }
            let cluster = try KafkaCluster(configuration: kafka)
            let partitions = (0..<2).map { TopicPartition(topic: topic, partition: Int32($0)) }
            let ends = try await cluster.endOffsets(partitions, timeout: .seconds(10))
            var remaining = ends.filter { $0.value > 0 }
            try consumer.assign(Dictionary(uniqueKeysWithValues: remaining.keys.map { ($0, StartOffset.beginning) }))
            var records: [KafkaRecord] = []
            let deadline = ContinuousClock.now + .seconds(20)
            while !remaining.isEmpty && ContinuousClock.now < deadline {
                for record in try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200)) {
                    records.append(record)
                    let partition = record.topicPartition
                    if record.offset + 1 >= remaining[partition] ?? 0 { remaining[partition] = nil }
                }
            }
            return records
        }

        func jobIds() async throws -> [String] {
            try await readAll(topics.jobs).compactMap { record in
                record.headers.first { $0.key == "mailpush-job-id" }?.value.flatMap { String(validating: $0, as: UTF8.self) }
            }
        }

        /// Runs the pipeline until `done` holds (checked against the output topics), then stops it gracefully.
        func runPipeline(stateDir: String, until done: @escaping @Sendable () async throws -> Bool) async throws {
            let store = try StateStore(directory: stateDir)
            var configuration = PipelineConfiguration(kafka: kafka)
            configuration.maxBatchSize = 7
            let pipeline = Pipeline(configuration: configuration, store: store, logger: Logger(label: "test"))
            let stop = Atomic<Bool>(false)
            let task = Task { try await pipeline.run(startupTimeout: .seconds(10)) { stop.load(ordering: .relaxed) } }
            let deadline = ContinuousClock.now + .seconds(60)
            while try await !done() {
                guard ContinuousClock.now < deadline else {
                    stop.store(true, ordering: .relaxed)
                    Issue.record("pipeline did not reach the expected output in time")
                    break
                }
                try await Task.sleep(for: .milliseconds(200))
            }
            stop.store(true, ordering: .relaxed)
            try await task.value
        }
    }

    static func expectedJobId(_ address: String, _ messageId: String, _ deviceId: String) -> String {
        JobID.make(emailAddressId: address, messageId: messageId, deviceId: deviceId)
    }

    static func temporaryDirectory() -> String {
        // A path under the test process's own directory, which goes when it exits.
        (try? TestDirectories.make("mailpush-test")) ?? TestDirectories.path("mailpush-test")
    }

    @Test func producesOneJobPerWantingDeviceAndDeadLettersWithoutAKey() async throws {
        let harness = try Harness()
        try await harness.registerKey(address: "em-1")
        try await harness.registerDevice("dev-a")
        try await harness.registerDevice("dev-b", disabledAddress: "em-1")
        for index in 0..<5 { try await harness.publishEvent(address: "em-1", messageId: "m-\(index)") }
        try await harness.publishEvent(address: "em-nokey", messageId: "m-x")
        try await harness.publish(harness.topics.events, key: "em-1", json: #"{"owner":"user-1""#)

        let state = Self.temporaryDirectory()
        try await harness.runPipeline(stateDir: state) {
            let deadLetters = try await harness.readAll(harness.topics.deadLetters).count
            let jobs = try await harness.jobIds().count
            return deadLetters >= 2 && jobs >= 5
        }

        let jobIds = try await harness.jobIds()
        #expect(Set(jobIds) == Set((0..<5).map { Self.expectedJobId("em-1", "m-\($0)", "dev-a") }))
        #expect(jobIds.count == 5, "no job twice")
        let deadLetters = try await harness.readAll(harness.topics.deadLetters)
        let reasons = Set(
            deadLetters.compactMap { record in
                record.headers.first { $0.key == "mailpush-error" }?.value.flatMap { String(validating: $0, as: UTF8.self) }
            })
        #expect(reasons.contains("no public key for address em-nokey"))
        #expect(reasons.contains { $0.hasPrefix("invalid JSON at byte") })
        #expect(deadLetters.contains { $0.value == Array(#"{"owner":"user-1""#.utf8) }, "original bytes unchanged")

        // The job opens with the registered key's private half.
        let job = try #require(try await harness.readAll(harness.topics.jobs).first?.value)
        let pem = TestKeys.shared.privateKeyPEM
        let plaintext = try Unsealer.open(pushJob: job, privateKeyPEM: pem)
        let opened = try JSONValue.parse(plaintext)
        guard case .object(let fields) = opened else {
            Issue.record("plaintext is not an object")
            return
        }
        #expect(fields["emailAddressId"] == .string("em-1"))
    }

    @Test func restartDoesNotReReadConfigAndDoesNotRepeatJobs() async throws {
        let harness = try Harness()
        try await harness.registerKey(address: "em-1")
        try await harness.registerDevice("dev-a")
        try await harness.publishEvent(address: "em-1", messageId: "m-0")
        let state = Self.temporaryDirectory()
        try await harness.runPipeline(stateDir: state) { try await harness.jobIds().count >= 1 }

        try await harness.publishEvent(address: "em-1", messageId: "m-1")
        try await harness.publishEvent(address: "em-1", messageId: "m-0") // published twice: deduped
        try await harness.runPipeline(stateDir: state) { try await harness.jobIds().count >= 2 }
        try await Task.sleep(for: .milliseconds(500))
        let jobIds = try await harness.jobIds()
        #expect(jobIds.sorted() == ["m-0", "m-1"].map { Self.expectedJobId("em-1", $0, "dev-a") }.sorted())

        let store = try StateStore(directory: state)
        #expect(try store.devices().map(\.deviceId) == ["dev-a"])
        #expect(
            try store.offsets()[TopicPartition(topic: harness.topics.devices, partition: 0)] != nil
                || store.offsets()[TopicPartition(topic: harness.topics.devices, partition: 1)] != nil)
    }

    /// A crash after every output of a batch was acknowledged but before its commit: the state on disk is
    /// the one from before the batch. The restart must find the outputs and produce none of them again.
    @Test func recoveryAfterCrashBeforeCommitProducesNothingTwice() async throws {
        let harness = try Harness()
        try await harness.registerKey(address: "em-1")
        try await harness.registerDevice("dev-a")
        try await harness.registerDevice("dev-b")
        for index in 0..<3 { try await harness.publishEvent(address: "em-1", messageId: "a-\(index)") }
        let state = Self.temporaryDirectory()
        try await harness.runPipeline(stateDir: state) { try await harness.jobIds().count >= 6 }

        let snapshot = Self.temporaryDirectory()
        for file in try FileManager.default.contentsOfDirectory(atPath: state) where file.hasPrefix("mailpush.sqlite") {
            try FileManager.default.copyItem(atPath: "\(state)/\(file)", toPath: "\(snapshot)/\(file)")
        }

        for index in 0..<10 { try await harness.publishEvent(address: "em-1", messageId: "b-\(index)") }
        try await harness.publish(harness.topics.events, key: "em-1", json: "not json")
        try await harness.runPipeline(stateDir: state) {
            let jobs = try await harness.jobIds().count
            let deadLetters = try await harness.readAll(harness.topics.deadLetters).count
            return jobs >= 26 && deadLetters >= 1
        }

        // Restart from the snapshot: offsets, dedupe and marks as before the second run's batches.
        try await harness.runPipeline(stateDir: snapshot) {
            let store = try StateStore(directory: snapshot)
            let offsets = try store.offsets()
            let events = offsets.filter { $0.key.topic == harness.topics.events }.values.reduce(0, +)
            return events >= 14
        }
        let jobIds = try await harness.jobIds()
        #expect(jobIds.count == 26, "every job exactly once, got \(jobIds.count)")
        #expect(Set(jobIds).count == 26)
        #expect(try await harness.readAll(harness.topics.deadLetters).count == 1, "the dead letter exactly once")
    }
}
