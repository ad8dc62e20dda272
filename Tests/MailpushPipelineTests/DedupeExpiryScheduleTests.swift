import Testing

@testable import MailpushPipeline

/// How often the dedupe window's expiry runs and how many runs one sweep of its keys takes, for the windows a user
/// may set (`--dedupe-window-seconds`, 0…100 years).
@Suite("Dedupe expiry schedule")
struct DedupeExpiryScheduleTests {
    @Test(
        arguments: [
            // window (s), run every (s), runs a sweep: a pass every seventh of the window, between 1 and 4,096 runs.
            (604_800, 60, 1_440), // the default week: a pass a day
            (86_400, 60, 205),
            (3_600, 60, 8),
            (840, 60, 2),
            (839, 60, 1), // shorter than 14 minutes: swept whole at each run
            (8, 2, 1),
            (1, 1, 1),
            (0, 1, 1),
            (2_592_000, 60, 4_096), // 30 days: the cap, a pass every 68 hours
            (3_153_600_000, 60, 4_096),
        ] as [(Int64, Int64, Int)])
    func aSweepTakesASeventhOfTheWindow(window: Int64, runEvery: Int64, runs: Int) {
        #expect(Pipeline.expiryInterval(windowSeconds: window) == .seconds(runEvery))
        #expect(Pipeline.dedupeSweepSlices(windowSeconds: window) == runs)
    }
}
