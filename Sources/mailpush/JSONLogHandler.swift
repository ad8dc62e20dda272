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

    private static let lock = NSLock()
    nonisolated(unsafe) private static let formatter: ISO8601DateFormatter = {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter
    }()

    func log(event: LogEvent) {
        var fields = metadata
        if let extra = event.metadata { fields.merge(extra) { _, new in new } }
        if let error = event.error { fields["error"] = "\(error)" }
        var writer = JSONWriter()
        writer.beginObject()
        Self.lock.lock()
        let time = Self.formatter.string(from: Date())
        Self.lock.unlock()
        writer.key("time"); writer.value(time)
        writer.key("level"); writer.value(event.level.rawValue)
        writer.key("logger"); writer.value(label)
        writer.key("message"); writer.value(event.message.description)
        for (key, value) in fields.sorted(by: { $0.key < $1.key }) {
            writer.key(key); writer.value(value.description)
        }
        writer.endObject()
        var line = writer.bytes
        line.append(UInt8(ascii: "\n"))
        Self.lock.lock()
        FileHandle.standardError.write(Data(line))
        Self.lock.unlock()
    }
}
