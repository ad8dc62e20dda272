import ArgumentParser
import Foundation
import MailpushKafka
import MailpushPipeline
import Synchronization

/// librdkafka's mock cluster with the default topics: memory only, for development and tests.
enum DevBroker {
    static func start(partitions: Int, topics: Topics, brokers: Int = 1) throws -> MockKafkaCluster {
        do {
            let cluster = try MockKafkaCluster(brokers: brokers)
            for topic in topics.all { try cluster.createTopic(topic, partitions: partitions) }
            return cluster
        } catch {
            throw fail("cannot start the development broker: \(error)", ExitStatus.software)
        }
    }

    static func writeBootstrap(_ bootstrap: String, to file: String) throws {
        do {
            let directory = (file as NSString).deletingLastPathComponent
            if !directory.isEmpty { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
            try Data((bootstrap + "\n").utf8).write(to: URL(fileURLWithPath: file), options: .atomic)
        } catch {
            throw fail("cannot write the bootstrap file \(file): \(error.localizedDescription)", ExitStatus.usage)
        }
    }
}

struct DevBrokerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "devbroker",
        abstract: "Run the embedded development broker (librdkafka mock cluster) with the five default topics.",
        discussion: """
            Memory only. Prints bootstrap=HOST:PORT and runs until SIGTERM/SIGINT.
            With --control-stdin it reads fault-injection commands, one a line:
              errors API_KEY CODE…   push request errors (API keys: 0 produce, 1 fetch, 2 list-offsets, 3 metadata)
              clear API_KEY          forget pushed errors
              down BROKER_ID | up BROKER_ID | rtt BROKER_ID MILLISECONDS
              topic-error TOPIC CODE   metadata answers CODE for TOPIC (29: not authorized; 0 lifts it)
            """)

    @Option(help: "Partitions of each of the five default topics (librdkafka 2.0.2 gives topics made on first use 4).") var partitions:
        Int = 4
    @Option(help: "Also write HOST:PORT to this file.") var bootstrapFile: String?
    @Option(help: "Number of mock brokers.") var brokerCount: Int = 1
    @Flag(help: "Read fault-injection commands from standard input (for tests).") var controlStdin = false

    func validate() throws {
        guard (1...1000).contains(partitions) else { throw ValidationError("--partitions must be 1…1000, got \(partitions)") }
        guard (1...9).contains(brokerCount) else { throw ValidationError("--broker-count must be 1…9, got \(brokerCount)") }
    }

    func run() async throws {
        let cluster = try DevBroker.start(partitions: partitions, topics: Topics(), brokers: brokerCount)
        defer { cluster.close() }
        let bootstrap = cluster.bootstrapServers
        if let bootstrapFile { try DevBroker.writeBootstrap(bootstrap, to: bootstrapFile) }
        writeLine("bootstrap=\(bootstrap)")

        if controlStdin {
            Thread.detachNewThread {
                while let line = readLine() {
                    writeLine(Self.control(cluster, line))
                }
            }
        }
        await waitForTermination()
        writeLine("devbroker stopped")
    }

    static func control(_ cluster: MockKafkaCluster, _ line: String) -> String {
        let words = line.split(separator: " ").map(String.init)
        guard let command = words.first else { return "ok" }
        if command == "topic-error" {
            guard words.count == 3, let code = Int32(words[2]) else { return "error: expected \"topic-error <topic> <code>\"" }
            cluster.setTopicError(words[1], code: code)
            return "ok \(line)"
        }
        let numbers = words.dropFirst().compactMap { Int($0) }
        guard numbers.count == words.count - 1 else { return "error: numbers expected in \"\(line)\"" }
        switch (command, numbers.count) {
        case ("errors", 2...):
            cluster.pushRequestErrors(apiKey: Int16(numbers[0]), errors: numbers.dropFirst().map { Int32($0) })
        case ("clear", 1):
            cluster.clearRequestErrors(apiKey: Int16(numbers[0]))
        case ("down", 1):
            cluster.setBrokerDown(Int32(numbers[0]))
        case ("up", 1):
            cluster.setBrokerUp(Int32(numbers[0]))
        case ("rtt", 2):
            cluster.setRoundTripTime(broker: Int32(numbers[0]), milliseconds: numbers[1])
        default:
            return "error: unknown command \"\(line)\""
        }
        return "ok \(line)"
    }
}

/// Suspends until SIGTERM or SIGINT.
func waitForTermination() async {
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        let once = OnceFlag()
        for signalNumber in [SIGTERM, SIGINT] {
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
            source.setEventHandler {
                if once.claim() { continuation.resume() }
            }
            source.resume()
            retainedSignalSources.append(source)
        }
    }
}

nonisolated(unsafe) private var retainedSignalSources: [any DispatchSourceSignal] = []

final class OnceFlag: Sendable {
    private let claimed = Atomic<Bool>(false)
    /// True for the first caller only.
    func claim() -> Bool {
        claimed.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged
    }
}

/// Standard output without buffering: a parent process reading a pipe sees each line at once.
func writeLine(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
