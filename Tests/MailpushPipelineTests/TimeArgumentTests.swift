import MailpushPipeline
import Testing

/// The times `replay --from-time/--to-time` and `offsets --set …=@time` accept.
@Suite("Time arguments")
struct TimeArgumentTests {
    @Test(
        arguments: [
            ("1718359200000", 1_718_359_200_000),
            ("-1000", -1000),
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
        "2024-06-14T10:60:00Z", "2024-06-14T10:00:60Z", "2024-06-14 10:00:00Z",
    ])
    func rejects(_ text: String) {
        #expect(TimeArgument.epochMilliseconds(text) == nil)
    }
}
