import Foundation
import Logging
import MailpushCore

/// One JSON object per line on standard error, for log collectors. Messages and metadata never carry email
/// content or key material: the pipeline logs ids, counts and reasons only.
struct JSONLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Keeps each line whole when several threads log at once.
    private static let lock = NSLock()
    /// Milliseconds are truncated, not rounded as ISO8601DateFormatter did: either is fine for a
    /// log line, and a format style needs no lock.
    private static let timeStyle = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    func log(event: LogEvent) {
        var fields = metadata
        if let extra = event.metadata { fields.merge(extra) { _, new in new } }
        if let error = event.error { fields["error"] = "\(error)" }
        var writer = JSONWriter()
        writer.beginObject()
        let time = Date().formatted(Self.timeStyle)
        writer.key("time")
        writer.value(time)
        writer.key("level")
        writer.value(event.level.rawValue)
        writer.key("logger")
        writer.value(label)
        writer.key("message")
        writer.value(event.message.description)
        for (key, value) in fields.sorted(by: { $0.key < $1.key }) {
            writer.key(key)
            writer.value(value.description)
        }
        writer.endObject()
        var line = writer.bytes
        line.append(UInt8(ascii: "\n"))
        Self.lock.lock()
        FileHandle.standardError.write(Data(line))
        Self.lock.unlock()
    }
}
