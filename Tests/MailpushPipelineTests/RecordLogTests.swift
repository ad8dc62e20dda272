import Logging
import Synchronization
import Testing

@testable import MailpushPipeline

@Suite struct RecordLogTests {
    /// Keeps what is logged through it, message and metadata.
    final class Captured: Sendable {
        let lines = Mutex<[(message: String, metadata: Logger.Metadata)]>([])

        var logger: Logger {
            Logger(label: "test") { _ in Handler(captured: self) }
        }

        struct Handler: LogHandler {
            let captured: Captured
            var metadata: Logger.Metadata = [:]
            var logLevel: Logger.Level = .trace
            subscript(metadataKey key: String) -> Logger.Metadata.Value? {
                get { metadata[key] }
                set { metadata[key] = newValue }
            }
            func log(event: LogEvent) {
                captured.lines.withLock { $0.append((event.message.description, event.metadata ?? [:])) }
            }
        }
    }

    @Test func eachKindLogsItsFirstLinesAndSumsUpTheRestWhenItsWindowEnds() async throws {
        let captured = Captured()
        let log = RecordLog(logger: captured.logger, linesPerWindow: 3, window: .milliseconds(200))
        for reason in ["invalid_json", "no_key"] {
            for i in 0..<25 {
                log.log(.notice, "event dead-lettered", of: ("reason", reason), countedIn: "see the topic", metadata: ["n": "\(i)"])
            }
        }
        #expect(captured.lines.withLock { $0.count } == 6)
        log.flush()
        #expect(captured.lines.withLock { $0.count } == 6, "a window still open is not summed up")

        try await Task.sleep(for: .milliseconds(250))
        log.log(.notice, "event dead-lettered", of: ("reason", "no_key"), countedIn: "see the topic", metadata: ["n": "25"])
        log.flush()
        let lines = captured.lines.withLock { $0 }
        let summaries = lines.filter { $0.message.contains("more \"event dead-lettered\" lines were not logged") }
        #expect(summaries.count == 2)
        #expect(summaries.allSatisfy { $0.metadata["notLogged"] == "22" && $0.message.hasSuffix("; see the topic") })
        #expect(Set(summaries.compactMap { $0.metadata["reason"]?.description }) == ["invalid_json", "no_key"])
        // A new window for the kind that came back: its line is logged, after the summary of the window before.
        let back = try #require(lines.firstIndex { $0.metadata["n"] == "25" })
        let summedUp = try #require(lines.firstIndex { $0.metadata["reason"] == "no_key" && $0.metadata["notLogged"] != nil })
        #expect(summedUp < back)
    }

    @Test func theLastFlushSumsUpWindowsStillOpen() {
        let captured = Captured()
        let log = RecordLog(logger: captured.logger, linesPerWindow: 1, window: .seconds(60))
        for _ in 0..<5 { log.log(.warning, "config record skipped", of: ("topic", "devices"), countedIn: "x", metadata: [:]) }
        log.flush(all: true)
        let lines = captured.lines.withLock { $0 }
        #expect(lines.count == 2)
        #expect(lines.last?.metadata["notLogged"] == "4")
        #expect(lines.last?.metadata["topic"] == "devices")
    }
}
