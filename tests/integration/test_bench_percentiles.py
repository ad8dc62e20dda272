"""`make bench`'s steady-load percentiles: latencies are whole milliseconds (both Kafka timestamps are), and the
report's p50 and p99 are interpolated within their millisecond so that a 5% target is not judged in 8% steps."""
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench  # noqa: E402


def test_the_interpolated_percentile_sits_where_the_latencies_around_it_put_it():
    # 30 at 11 ms, 50 at 12 ms, 20 at 13 ms: the 50th of 100 is 12 ms, 20 of its 50 into that millisecond.
    latencies = sorted([11] * 30 + [12] * 50 + [13] * 20)
    assert bench.percentile(latencies, 50) == 12
    assert abs(bench.percentile_of_whole_ms(latencies, 50) - 11.9) < 1e-9


def test_the_interpolated_percentile_recovers_a_p50_between_whole_milliseconds():
    rng = random.Random(7)
    whole = []
    for _ in range(50_000):
        published = rng.uniform(0, 1000)
        produced = published + rng.gauss(12.3, 3)
        whole.append(int(produced // 1) - int(published // 1))
    whole.sort()
    assert bench.percentile(whole, 50) == 12
    assert abs(bench.percentile_of_whole_ms(whole, 50) - 12.3) < 0.1


def test_the_interpolated_percentile_stays_within_half_a_millisecond_of_the_plain_one():
    rng = random.Random(11)
    latencies = sorted(rng.choice([3, 4, 4, 5, 9, 40]) for _ in range(999))
    for p in (1, 50, 90, 99, 100):
        assert abs(bench.percentile_of_whole_ms(latencies, p) - bench.percentile(latencies, p)) <= 0.5
    assert math.isnan(bench.percentile_of_whole_ms([], 50))


def steady_runs(rng, scale: float, runs: int = 8, burst_every: int = 3) -> list[dict[int, int]]:
    """Histograms of runs like the steady load's: most jobs near 10 ms, and in some runs a burst of slow ones."""
    histograms = []
    for run in range(runs):
        mood = rng.uniform(0.85, 1.15)  # the machine, shared by both subjects of a pair
        latencies = [max(1, round(rng.gauss(10, 3) * mood * scale)) for _ in range(4000)]
        if run % burst_every == 0:
            latencies += [round(rng.uniform(30, 90) * mood * scale) for _ in range(60)]
        histograms.append(bench.latency_histogram(latencies))
    return histograms


def test_a_histogram_gives_the_same_percentile_as_the_sorted_latencies():
    rng = random.Random(3)
    latencies = sorted(max(0, round(rng.gauss(12, 5))) for _ in range(9000))
    histogram = bench.latency_histogram(latencies)
    for p in (50, 99):
        assert bench.histogram_percentile(histogram, p) == bench.percentile_of_whole_ms(latencies, p)
    # As raw.json keeps it: millisecond keys as text, which must not sort as text ("100" before "11").
    as_json = {str(ms): count for ms, count in histogram.items()}
    assert bench.histogram_percentile(as_json, 99) == bench.percentile_of_whole_ms(latencies, 99)


def test_pooled_runs_tell_equal_subjects_from_a_tenth_slower_one():
    rng = random.Random(11)
    same = [(a, b) for a, b in zip(steady_runs(random.Random(1), 1.0), steady_runs(random.Random(1), 1.0))]
    centre, low, high = bench.pooled_ratio_interval(same, 99)
    assert centre == 1.0 and low <= 1.0 <= high
    assert bench.interval_verdict(centre, low, high, 1.05)[0] == "met"
    # B a tenth slower in every run, with A's bursts and moods: not within 5%.
    seeds = [rng.randrange(1 << 30) for _ in range(8)]
    a = [steady_runs(random.Random(seed), 1.0, runs=1, burst_every=1 + i % 3)[0] for i, seed in enumerate(seeds)]
    b = [steady_runs(random.Random(seed), 1.1, runs=1, burst_every=1 + i % 3)[0] for i, seed in enumerate(seeds)]
    centre, low, high = bench.pooled_ratio_interval(list(zip(a, b)), 99)
    assert low > 1.05, (centre, low, high)
    assert bench.interval_verdict(centre, low, high, 1.05)[0] == "not met"


def test_a_pooled_interval_from_two_runs_decides_nothing_close():
    runs = steady_runs(random.Random(5), 1.0, runs=2)
    slower = steady_runs(random.Random(6), 1.03, runs=2)
    centre, low, high = bench.pooled_ratio_interval(list(zip(runs, slower)), 99)
    assert low < 1.0 < 1.05 < high  # Student's t for one degree of freedom: 12.7
