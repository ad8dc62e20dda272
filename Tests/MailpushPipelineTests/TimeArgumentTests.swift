import MailpushPipeline
import Testing

/// The times `replay --from-time/--to-time` and `offsets --set …=@time` accept.
@Suite("Time arguments")
struct TimeArgumentTests {
    @Test(
        arguments: [
            ("1718359200000", 1_718_359_200_000),
            // Before 1970 is 1970: no Kafka record is older, and librdkafka refuses a negative time.
            ("-1000", 0),
            ("1969-12-31T23:59:59Z", 0),
            ("2024-02-29T10:00:00Z", 1_709_200_800_000),
            ("2024-06-14T10:00:00Z", 1_718_359_200_000),
            ("2024-06-14T10:00:00.250Z", 1_718_359_200_250),
            ("2024-06-14T10:00:00.5Z", 1_718_359_200_500),
            ("2024-06-14T12:00:00+02:00", 1_718_359_200_000),
            ("2024-06-14T12:00:00.250+02:00", 1_718_359_200_250),
            ("2024-06-14T07:30:00-02:30", 1_718_359_200_000),
            ("2024-06-14T10:00:00.123456789Z", 1_718_359_200_123),
            (" \t2024-06-14T10:00:00Z", 1_718_359_200_000),
        ] as [(String, Int64)])
    func accepts(_ text: String, _ expected: Int64) {
        #expect(TimeArgument.epochMilliseconds(text) == expected)
    }

    @Test(arguments: [
        "", "yesterday", "2024-06-14", "10:00:00Z", "2024-06-14T10:00:00", "2024-13-14T10:00:00Z",
        "2024-06-14T10:60:00Z", "2024-06-14T10:00:60Z", "2024-06-14 10:00:00Z", "2024-02-30T10:00:00Z",
        "2023-02-29T10:00:00Z", "2024-04-31T10:00:00Z", "2024-06-14T24:00:00Z", "2024-00-14T10:00:00Z",
        "2024-06-00T10:00:00Z", "20x4-06-14T10:00:00Z",
    ])
    func rejects(_ text: String) {
        #expect(TimeArgument.epochMilliseconds(text) == nil)
    }
}
