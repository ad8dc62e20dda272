import Foundation

/// A point in time given on the command line: epoch milliseconds or ISO 8601 (`2024-06-14T10:00:00Z`).
enum TimeArgument {
    static func epochMilliseconds(_ text: String) -> Int64? {
        if let millis = Int64(text) { return millis }
        let formatter = ISO8601DateFormatter()
        for options: ISO8601DateFormatter.Options in [[.withInternetDateTime, .withFractionalSeconds], [.withInternetDateTime]] {
            formatter.formatOptions = options
            if let date = formatter.date(from: text) { return Int64(date.timeIntervalSince1970 * 1000) }
        }
        return nil
    }
}
