"""State that survives a real cluster: a real Kafka compacts `mailpush.state` (the latest record per key, tombstones
and what they delete removed), which the development broker never does. An owner runs through several dedupe
windows while events flow, its state topic is copied the way compaction leaves it, the owner is killed, and a
fresh instance restores from the copy: every job exactly once, the state topic bounded to about one window, and
the read-back of the takeover bounded by the last checkpoint, not by how long the owner held the partitions."""

from __future__ import annotations

import collections
import json
import time

import pytest

import mailpush_harness as h
from compact_state_topic import compact_copy, compacted
from guarantees import assert_exactly_once
from mailpush_harness import DEAD, EVENTS, JOBS
from test_fleet import Publisher, setup_config

WINDOW_S = 8
#: The expiry runs four times per window when the window is shorter than four minutes (each run writes a
#: checkpoint first, then deletes what is no longer needed).
EXPIRY_INTERVAL_S = WINDOW_S / 4
RUN_S = 5 * WINDOW_S


@pytest.mark.runs_for(60)
def test_a_successor_restores_from_the_compacted_state_topic_exactly_once_with_a_bounded_read_back(world, kafka, keys):
    addrs = setup_config(kafka, keys)
    window = ["--dedupe-window-seconds", str(WINDOW_S)]
    a = world.service(args=["--group", "compaction-a", *window], name="a")
    h.wait_for(lambda: a.metrics().get("mailpush_owned_partitions", 0) == len(kafka.partitions(EVENTS)), 60,
               "a owns every partition", on_fail=a.proc.log_tail)
    publisher = Publisher(kafka, addrs, rate=100)
    publisher.start()
    try:
        time.sleep(RUN_S)
        assert a.metrics().get("mailpush_dedupe_entries_expired_total", 0) > 0, "entries expired during the run"
        killed_ms = int(time.time() * 1000)
        a.kill()
        time.sleep(2)
    finally:
        publisher.stop()

    report = compact_copy(kafka, "mailpush.state", "mailpush.state.compacted")
    validator = h.load_schema_validator("partition-state.v1.schema.json")
    for partition, numbers in report.items():
        for record in numbers["live"]:
            problems = [e.message for e in validator.iter_errors(record)]
            assert not problems, (partition, problems, record)
        print(f"state partition {partition}: {numbers['records']} records, {numbers['bytes']} bytes written in "
              f"{RUN_S} s ({RUN_S // WINDOW_S} dedupe windows); live after compaction: {numbers['liveRecords']} "
              f"records, {numbers['liveBytes']} bytes")
        kinds = collections.Counter(record["kind"] for record in numbers["live"])
        assert kinds["checkpoint"] == 1 and kinds["claim"] == 1, (partition, kinds)
        # Bounded: no batch record older than about one window (plus the expiry's cadence) is left.
        oldest = min(record["processedAtMs"] for record in numbers["live"] if record["kind"] == "batch")
        assert killed_ms - oldest <= (2 * WINDOW_S + 2 * EXPIRY_INTERVAL_S) * 1000, (partition, killed_ms - oldest)
        # The compaction removed the start of the owner's chain: a restore must not need it.
        claim = next(record for record in numbers["live"] if record["kind"] == "claim")
        assert not any(record.get("from") == claim["offset"] for record in numbers["live"] if record["kind"] == "batch"), (
            partition, "the chain from the claim is still whole; the run did not exercise compaction")

    b = world.service(args=["--group", "compaction-b", *window, "--state-topic", "mailpush.state.compacted"], name="b",
                      wait_ready=False)
    assert_exactly_once(kafka, publisher.expected, timeout=180)
    taken = [line for line in b.proc.log_lines() if line["message"] == "processing taken-over event partitions"]
    assert taken, b.proc.log_tail()
    read_back = sum(int(line["readBack"]) for line in taken)
    assert b.metrics()["mailpush_takeover_readback_records_total"] == read_back

    # The bound: the read-back starts at the last checkpoint's marks, at most a checkpoint interval (here the
    # expiry's) before the kill, plus the batches in flight: far less than everything since the claim.
    outputs = kafka.consume(JOBS, idle=1.0) + kafka.consume(DEAD, idle=1.0)
    before_kill = [r for r in outputs if r.timestamp_ms is not None and r.timestamp_ms <= killed_ms + 1000]
    recent = [r for r in before_kill if r.timestamp_ms >= killed_ms - (EXPIRY_INTERVAL_S + 6) * 1000]
    print(f"read back {read_back} output records at the takeover; the owner wrote {len(before_kill)} in {RUN_S} s, "
          f"{len(recent)} in its last {EXPIRY_INTERVAL_S + 6:.0f} s")
    assert read_back <= len(recent), (read_back, len(recent))
    assert read_back < len(before_kill) / 4


def test_a_finished_fleet_replay_leaves_nothing_in_the_compacted_state_topic(world, kafka, keys, tmp_path):
    """A replay's progress records are superseded one by one, and a finished replay's request and progress are
    deleted a dedupe window after it ended (time enough for `mailpush replay` to read the result)."""
    addrs = setup_config(kafka, keys)
    window = ["--dedupe-window-seconds", str(WINDOW_S)]
    svc = world.service(args=["--group", "compaction-replay", "--batch-size", "10", *window], name="a")
    h.wait_for(lambda: svc.metrics().get("mailpush_owned_partitions", 0) == len(kafka.partitions(EVENTS)), 60,
               "the instance owns every partition", on_fail=svc.proc.log_tail)
    publisher = Publisher(kafka, addrs, rate=200)
    publisher.start()
    time.sleep(2)
    publisher.stop()
    kafka.consume(JOBS, min_count=len(publisher.expected), timeout=60, idle=1.0)
    replay = world.run_cli(["replay", "--brokers", world.bootstrap, "--from-offset", "0", "--force",
                            "--state-dir", str(tmp_path / "replay-state")], timeout=120)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"replayed {publisher.sent} events" in replay.stdout + replay.stderr, replay.stdout + replay.stderr
    assert not (tmp_path / "replay-state").exists(), "a fleet's replay needs no state directory and creates none"
    written = [json.loads(r.value) for r in kafka.consume("mailpush.state", idle=1.0) if r.value]
    progress = collections.Counter(v["partition"] for v in written if v["kind"] == "replayProgress")
    assert all(n > 1 for n in progress.values()) and len(progress) == len(kafka.partitions(EVENTS)), progress
    # One window after the end, and the next expiry run: waited for rather than slept (on a loaded machine the
    # expiry runs and their writes come later), then the compacted copy checked.
    def replay_records_left() -> list[tuple[int, str]]:
        by_partition: dict[int, list[h.Record]] = collections.defaultdict(list)
        for record in kafka.consume("mailpush.state", idle=0.5):
            by_partition[record.partition].append(record)
        return [(p, json.loads(r.value)["kind"]) for p, records in sorted(by_partition.items()) for r in compacted(records)
                if json.loads(r.value)["kind"].startswith("replay")]
    remaining: list[tuple[int, str]] = []

    def deleted() -> bool:
        remaining[:] = replay_records_left()
        return not remaining
    h.wait_for(deleted, WINDOW_S + 2 * EXPIRY_INTERVAL_S + 60, "the finished replay's records deleted", interval=1.0,
               on_fail=lambda: f"left: {remaining}")
    report = compact_copy(kafka, "mailpush.state", "mailpush.state.replay-compacted")
    left = [(p, v["kind"]) for p, numbers in report.items() for v in numbers["live"] if v["kind"].startswith("replay")]
    assert not left, left
    assert svc.stop() == 0
