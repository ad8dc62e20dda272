import Foundation
import Logging
import MailpushCore

/// Writes one log line per event on standard error: a JSON object for log collectors (`--log-format json`), or
/// swift-log's text layout for a person (`time level label: key=value … [source] message`).
///
/// Messages and metadata never carry email content or key material: the pipeline logs ids, counts and reasons
/// only. But ids come from tenants' records, so every line is made safe to read whatever they hold:
/// - each value is cut after `valueLimit` Unicode scalars (`cut(afterScalars:)`): a 1 MB record key stays a short line;
/// - every control, invisible format and line separator character is written as `\uXXXX`
///   (`withInvisiblesEscaped`): a newline would start a forged line, a right-to-left override would reorder what
///   a person reads. In JSON these are JSON's own escapes, so a parser reads every value back exactly.
struct LineLogHandler: LogHandler {
    enum Format { case json, text }

    let label: String
    let format: Format
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    static let valueLimit = 512

    /// Keeps each line whole when several threads log at once.
    private static let lock = NSLock()
    /// Milliseconds are truncated, not rounded as ISO8601DateFormatter did: either is fine for a
    /// log line, and a format style needs no lock.
    private static let jsonTimeStyle = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
    private static let textTimeStyle = Date.ISO8601FormatStyle(timeZone: .current)

    func log(event: LogEvent) {
        var fields = metadata
        if let extra = event.metadata { fields.merge(extra) { _, new in new } }
        if let error = event.error { fields["error"] = "\(error)" }
        let values = fields.sorted { $0.key < $1.key }.map { ($0.key, $0.value.description.cut(afterScalars: Self.valueLimit)) }
        let message = event.message.description.cut(afterScalars: Self.valueLimit)
        var line: String
        switch format {
        case .json:
            var writer = JSONWriter()
            writer.beginObject()
            for (key, value) in [
                ("time", Date().formatted(Self.jsonTimeStyle)), ("level", event.level.rawValue), ("logger", label),
                ("message", message),
            ] + values {
                writer.key(key)
                writer.value(value)
            }
            writer.endObject()
            line = String(decoding: writer.bytes, as: UTF8.self)
        case .text:
            line = "\(Date().formatted(Self.textTimeStyle)) \(event.level) \(label):"
            for (key, value) in values { line += " \(key)=\(value)" }
            line += " [\(event.source)] \(message)"
        }
        var bytes = Array(line.withInvisiblesEscaped.utf8)
        bytes.append(UInt8(ascii: "\n"))
        Self.lock.withLock { FileHandle.standardError.write(Data(bytes)) }
    }
}
