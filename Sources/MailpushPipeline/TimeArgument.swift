import Foundation

/// A point in time given on the command line (`replay --from-time`, `offsets --set …=@time`):
/// epoch milliseconds or ISO 8601 (`2024-06-14T10:00:00Z`), with or without fractional seconds,
/// with `Z` or an offset.
public enum TimeArgument {
    /// A time before 1970 is taken as 1970: no Kafka record is older, and librdkafka refuses a negative time (its
    /// error named the client's settings, not this argument).
    public static func epochMilliseconds(_ text: String) -> Int64? {
        if let millis = Int64(text) { return max(0, millis) }
        // ISO8601DateFormatter, used before, skipped leading whitespace; keep accepting it.
        let text = String(text.drop(while: \.isWhitespace))
        guard fieldsInRange(text) else { return nil }
        for style in [withFraction, withoutFraction] {
            if let date = try? style.parse(text) { return max(0, Int64(date.timeIntervalSince1970 * 1000)) }
        }
        return nil
    }

    // Format styles are values and thread-safe, unlike ISO8601DateFormatter.
    private static let withFraction = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
    private static let withoutFraction = Date.ISO8601FormatStyle()

    /// The format style rolls a field past its range over into the next one (February 30 into March, hour 24 into
    /// the next day, a minute or second of 60 into the next hour or minute); a typo should be refused instead. Both
    /// styles need `yyyy-MM-ddTHH:mm:ss`, so the fields are at fixed places.
    private static func fieldsInRange(_ text: String) -> Bool {
        let utf8 = Array(text.utf8.prefix(19))
        guard utf8.count == 19 else { return false }
        func number(_ range: Range<Int>) -> Int? { Int(String(decoding: utf8[range], as: UTF8.self)) }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), let hour = number(11..<13),
            let minute = number(14..<16), let second = number(17..<19)
        else { return false }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        return (1...12).contains(month) && (1...days[month - 1]).contains(day) && hour < 24 && minute < 60 && second < 60
    }
}
