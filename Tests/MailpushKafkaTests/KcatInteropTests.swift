import Foundation
import MailpushKafka
import MailpushPartition
import Testing

extension ProcessExclusiveTests {
    /// The mock cluster speaks real Kafka protocol over loopback TCP, so a third-party client (kcat, itself
    /// librdkafka-based but a separate process) can produce to it and read from it.
    @Suite struct KcatInteropTests {
        static func kcatPath() -> String? {
            let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
            return path.split(separator: ":").map { "\($0)/kcat" }.first { FileManager.default.isExecutableFile(atPath: $0) }
        }

        /// Runs kcat with `input` on stdin; returns stdout. Fails the test (with a clear message) if kcat is missing
        /// or exits with an error. The process runs on a thread of its own, off the cooperative pool.
        static func kcat(_ arguments: [String], input: String = "") async throws -> String {
            guard let kcat = kcatPath() else {
                Issue.record("kcat is not installed (apt-get install kcat); the interop test needs it")
                throw CancellationError()
            }
            let (status, output, errors) = try await withCheckedThrowingContinuation { continuation in
                DispatchQueue(label: "kcat").async {
                    continuation.resume(with: Result { try run(kcat, arguments, input: input) })
                }
            }
            #expect(status == 0, "kcat \(arguments): \(errors)")
            return output
        }

        static func run(_ executable: String, _ arguments: [String], input: String) throws -> (Int32, String, String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = arguments
            let stdin = Pipe()
            let stdout = Pipe()
            let stderr = Pipe()
            process.standardInput = stdin
            process.standardOutput = stdout
            process.standardError = stderr
            try process.run()
            stdin.fileHandleForWriting.write(Data(input.utf8))
            try stdin.fileHandleForWriting.close()
            let output = stdout.fileHandleForReading.readDataToEndOfFile()
            let errors = stderr.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: output, as: UTF8.self), String(decoding: errors, as: UTF8.self))
        }

        @Test func kcatProducedRecordsAreReadWithHeaders() async throws {
            let mock = try makeMock()
            try mock.createTopic("from-kcat", partitions: 1)
            _ = try await Self.kcat(
                [
                    "-b", mock.bootstrapServers, "-P", "-t", "from-kcat", "-K", ":",
                    "-H", "mailpush-source=kcat", "-H", "mailpush-job-id=job-42",
                ],
                input: "k1:hello\nk2:world\n")

            let consumer = try KafkaConsumer(configuration: config(mock))
            try consumer.assign([TopicPartition(topic: "from-kcat", partition: 0): .beginning])
            let records = try await consume(consumer, count: 2)
            #expect(records.map(\.key) == [bytes("k1"), bytes("k2")])
            #expect(records.map(\.value) == [bytes("hello"), bytes("world")])
            for record in records {
                #expect(
                    record.headers == [
                        KafkaHeader(key: "mailpush-source", value: bytes("kcat")),
                        KafkaHeader(key: "mailpush-job-id", value: bytes("job-42")),
                    ])
            }
        }

        @Test func kcatReadsWhatWeProduce() async throws {
            let mock = try makeMock()
            try mock.createTopic("to-kcat", partitions: 1)
            let producer = try KafkaProducer(configuration: config(mock))
            _ = try await producer.send(
                [
                    OutgoingRecord(
                        topic: "to-kcat", key: bytes("k"), value: bytes("v"),
                        headers: [KafkaHeader(key: "mailpush-source", value: bytes("swift"))])
                ],
                timeout: .seconds(10))
            let output = try await Self.kcat([
                "-b", mock.bootstrapServers, "-C", "-t", "to-kcat", "-e", "-q",
                "-f", "%o|%k|%s|%h\\n",
            ])
            #expect(output == "0|k|v|mailpush-source=swift\n")
        }
    }
}
