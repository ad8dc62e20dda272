"""`make bench`'s side-by-side measurements (issue 25, goal 5): the group and static ownership run at the same moment,
each on its own development broker, so that the machine's mood is the same for both."""
import argparse
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench  # noqa: E402
import mailpush_harness as h  # noqa: E402


def test_side_by_side_steady_loads_start_at_the_same_moment(tmp_path):
    # The group member is ready about 3 s after static ownership (the broker's first join): its load must not start
    # later, nor static ownership's earlier.
    options = argparse.Namespace(bin=h.mailpush_bin(), bench_bin="", devices=2, steady_partitions=8, steady_owners=20,
                                 steady_seconds=1.5, steady_settle=0.2, service_args=[])
    results = bench.steady_together({"group": (options, "group"), "static": (options, "static")}, bench.spki_base64(),
                                    tmp_path, 0, 200)
    group, static = results["group"], results["static"]
    assert abs(group["loadStartedWallMs"] - static["loadStartedWallMs"]) < 300, (
        group["loadStartedWallMs"], static["loadStartedWallMs"])
    for result in (group, static):
        assert result["events"] >= 250 and result["jobs"] == 2 * result["events"], result["events"]
        assert result["steadyHistogram"], "no steady-load job was sampled"


def test_side_by_side_drains_each_count_their_own_jobs(tmp_path):
    drains = [bench.Drain(h.mailpush_bin(), mode, h.mailpush_bin(), 1_000, 20, bench.spki_base64(), tmp_path, f"d-{mode}",
                          devices=2) for mode in ("group", "static")]
    group, static = bench.drain_together(drains, tmp_path)
    for drain, measured in zip(drains, (group, static)):
        assert drain.counter.count == 2_000
        assert 0 < measured["cpuMicrosPerJob"] < 10_000, measured


def test_a_side_by_side_drain_whose_service_exits_fails_at_once(tmp_path):
    # Without the check the bench waited ten minutes for jobs that could never come.
    exits = tmp_path / "exits"
    exits.write_text("#!/bin/sh\nexit 3\n")
    exits.chmod(0o755)
    drains = [bench.Drain(h.mailpush_bin(), "group", h.mailpush_bin(), 1_000, 20, bench.spki_base64(), tmp_path, "d-group",
                          devices=2),
              bench.Drain(str(exits), "static", h.mailpush_bin(), 1_000, 20, bench.spki_base64(), tmp_path, "d-static",
                          devices=2)]
    started = time.monotonic()
    with pytest.raises(SystemExit, match="exited with 3 during its drain"):
        bench.drain_together(drains, tmp_path)
    assert time.monotonic() - started < 60


def test_a_side_by_side_drain_whose_reader_fell_behind_the_broker_fails_at_once(tmp_path):
    # The development broker keeps about 5 MB a partition: a reader further behind than that can never count every
    # job. Session 51's bench waited ten minutes for jobs both services had written, then stopped; now the pair is
    # known to be unmeasurable at once (and `make bench` measures it again).
    drains = [bench.Drain(h.mailpush_bin(), mode, h.mailpush_bin(), 1_000, 20, bench.spki_base64(), tmp_path, f"d-{mode}",
                          devices=2) for mode in ("group", "static")]
    lagging = drains[1]
    flood = bench.Producer({"bootstrap.servers": lagging.brokers, "linger.ms": 5, "log_level": 0})
    for _ in range(12_000):
        flood.produce(bench.JOBS, b"x" * 1_200, partition=0)
        flood.poll(0)
    assert flood.flush(30) == 0
    # A reader whose next jobs the broker no longer has (a consumer assigned before the flood may keep up with it in
    # librdkafka's own thread, so it is pointed at the dropped offsets).
    lagging.counter.stopping = True
    lagging.counter.join()
    lagging.counter = lagging.sampler.counter = bench.JobCounter(lagging.brokers)
    lagging.counter.consumer.assign([bench.TopicPartition(bench.JOBS, p, 0) for p in lagging.counter.partitions])
    lagging.counter.start()
    started = time.monotonic()
    with pytest.raises(bench.ReaderFellBehind, match=r"\(static\) fell behind"):
        bench.drain_together(drains, tmp_path)
    assert time.monotonic() - started < 60
