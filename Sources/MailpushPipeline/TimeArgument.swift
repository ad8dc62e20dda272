import Foundation

/// A point in time given on the command line (`replay --from-time`, `offsets --set …=@time`):
/// epoch milliseconds or ISO 8601 (`2024-06-14T10:00:00Z`), with or without fractional seconds,
/// with `Z` or an offset.
public enum TimeArgument {
    public static func epochMilliseconds(_ text: String) -> Int64? {
        if let millis = Int64(text) { return millis }
        // ISO8601DateFormatter, used before, skipped leading whitespace; keep accepting it.
        let text = String(text.drop(while: \.isWhitespace))
        guard clockFieldsInRange(text) else { return nil }
        for style in [withFraction, withoutFraction] {
            if let date = try? style.parse(text) { return Int64(date.timeIntervalSince1970 * 1000) }
        }
        return nil
    }

    // Format styles are values and thread-safe, unlike ISO8601DateFormatter.
    private static let withFraction = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
    private static let withoutFraction = Date.ISO8601FormatStyle()

    /// The format style rolls a minute or second of 60 or more over into the next hour or
    /// minute; a typo should be refused instead. Both styles need `yyyy-MM-ddTHH:mm:ss`, so the
    /// fields are at fixed places.
    private static func clockFieldsInRange(_ text: String) -> Bool {
        let utf8 = Array(text.utf8.prefix(19))
        guard utf8.count == 19 else { return false }
        return utf8[14] < UInt8(ascii: "6") && utf8[17] < UInt8(ascii: "6")
    }
}
