import Testing

@testable import MailpushPipeline

/// The `batch committed` line's stage timings (`--log-level debug`): under a steady load most stages take under a
/// millisecond, so whole milliseconds said 0 for most of them.
@Suite("Batch timings in the log")
struct BatchTimingTests {
    @Test(
        arguments: [
            (Duration.zero, "0.0"),
            (.microseconds(99), "0.0"),
            (.microseconds(100), "0.1"),
            (.microseconds(1_450), "1.4"),
            (.milliseconds(12), "12.0"),
            (.seconds(2) + .microseconds(999), "2000.9"),
        ] as [(Duration, String)])
    func tenthsOfAMillisecond(_ duration: Duration, _ logged: String) {
        #expect(duration.millisecondsToATenth == logged)
    }
}
