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
