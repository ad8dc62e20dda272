"""Exactly once under harder crash and operating patterns (CONTRACT §8, issue 8): pairs of crashes with the
second one right after the restart's first batch, a replay beside a stalled service on the same state
directory, a second process on a state directory in use, and a producer whose local queue is full while
the broker is slow. Each is checked with an independent consumer of the jobs topic."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

import mailpush_harness as h
import sudo_client
from guarantees import assert_exactly_once
from mailpush_harness import DEVICES, EVENTS, JOBS, KEYS

EXIT_TEMPFAIL = 75


def assert_each_once(kafka, expected: set[str], timeout: float = 180) -> None:
    assert_exactly_once(kafka, expected, timeout=timeout, idle=2.0)


class OutputWatch:
    """Watches the end offsets of the jobs topic, to act the moment something lands there."""

    def __init__(self, bootstrap: str, partitions: list[int]):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watch"}, logger=h.KAFKA_LOG)
        self.partitions = partitions

    def total(self) -> int:
        return sum(self.consumer.get_watermark_offsets(TopicPartition(JOBS, p), timeout=5, cached=False)[1]
                   for p in self.partitions)

    def close(self) -> None:
        self.consumer.close()


def owner_with_devices(kafka, keys, owner: str, address: str, count: int) -> list[str]:
    kafka.produce(KEYS, address, sudo_client.key_record(keys.a, address, f"k-{address}", owner=owner))
    ids = [f"dev-{owner}-{i}" for i in range(count)]
    kafka.produce_many([(DEVICES, d, h.ios_device(d, owner=owner)) for d in ids])
    return ids


def emails(kafka, owner: str, address: str, device_ids: list[str], prefix: str, count: int) -> set[str]:
    kafka.produce_many([(EVENTS, address, h.event(f"{prefix}-{i}", address=address, owner=owner))
                        for i in range(count)])
    return {sudo_client.job_id(address, f"{prefix}-{i}", d) for i in range(count) for d in device_ids}


# --------------------------------------------------------------------------- double crash

def batches_committed(svc) -> int:
    return svc.proc.log_text().count("batch committed")


@pytest.mark.runs_for(30)
def test_double_crash_right_after_the_restarts_first_batch(bare_world, keys):
    """Kill mid-backlog, restart, kill again 0–50 ms after the restart committed its first batch; repeat."""
    world = bare_world
    world.devbroker(partitions=32)
    kafka = world.kafka
    rnd = random.Random(8)
    # One owner, address and device per 128: jobs are keyed by device, and the development broker keeps only
    # about the last 5 MB of a partition, so 12,000 jobs for one device would not all stay readable.
    addresses = [f"em-dc-{i}" for i in range(128)]
    kafka.produce_many([(KEYS, a, sudo_client.key_record(keys.a, a, f"k-{a}", owner=f"user-dc-{n}"))
                        for n, a in enumerate(addresses)]
                       + [(DEVICES, f"dev-dc-{n}", h.ios_device(f"dev-dc-{n}", owner=f"user-dc-{n}"))
                          for n in range(len(addresses))])
    # Enough backlog for 12 pairs at a few thousand events a second (each first kill lets 0.02–0.25 s of batches
    # through): a drained backlog leaves a restart no first batch to kill after.
    count = 20_000
    kafka.produce_many([(EVENTS, addresses[i % 128], h.event(f"dc-{i}", address=addresses[i % 128], owner=f"user-dc-{i % 128}"))
                        for i in range(count)], timeout=120)
    expected = {sudo_client.job_id(addresses[i % 128], f"dc-{i}", f"dev-dc-{i % 128}") for i in range(count)}

    args = ["--batch-size", "8", "--log-level", "debug"]
    svc = world.service(state_dir=world.workdir / "state", args=args, wait_ready=False)
    started = time.monotonic()
    pairs = 0
    while pairs < 12 and time.monotonic() - started < 60:
        # First kill: somewhere in the backlog, while batches are in flight.
        h.wait_for(lambda: batches_committed(svc) >= 1, 60, "the service's first batch", interval=0.01,
                   on_fail=svc.proc.log_tail)
        time.sleep(rnd.uniform(0.02, 0.25))
        svc.kill()
        svc = svc.restart(wait_ready=False)
        # Second kill: 0–50 ms after the restart committed its first batch, while recovery is pending.
        h.wait_for(lambda: batches_committed(svc) >= 1, 60, "the restart's first batch", interval=0.002,
                   on_fail=svc.proc.log_tail)
        time.sleep(rnd.uniform(0, 0.05))
        svc.kill()
        pairs += 1
        svc = svc.restart(wait_ready=False)
    assert pairs >= 5, f"only {pairs} pairs of kills fitted in the time"
    svc.wait_ready(120)
    assert_each_once(kafka, expected, timeout=240)
    svc.assert_alive()


# --------------------------------------------------------------------------- replay beside the service

def test_replay_beside_a_stalled_service_writes_nothing_twice(world, kafka, keys):
    devices = owner_with_devices(kafka, keys, "user-40", "em-add-40", 40)
    partitions = kafka.partitions(JOBS)
    watch = OutputWatch(world.bootstrap, partitions)
    try:
        expected = emails(kafka, "user-40", "em-add-40", devices, "busy", 150)
        svc = world.service(wait_ready=False)
        h.wait_for(lambda: watch.total() > 0, 120, "the service's first job", interval=0.005,
                   on_fail=svc.proc.log_tail)
        svc.proc.send_signal(signal.SIGSTOP)
    finally:
        watch.close()
    try:
        replay = world.spawn("replay", [world.bin, "replay", "--brokers", world.bootstrap,
                                        "--state-dir", str(svc.state_dir), "--from-offset", "0"])
        # Give the replay time to do whatever it does while the service is stalled.
        replay.wait(5)
    finally:
        svc.proc.send_signal(signal.SIGCONT)
    rc = replay.wait(180)
    assert rc == 0, f"replay exited with {rc}\n{replay.log_tail()}"
    assert_each_once(kafka, expected)
    svc.assert_alive()


# --------------------------------------------------------------------------- one process per state dir

def test_second_service_on_a_state_dir_in_use_exits_75(world, kafka, keys):
    devices = owner_with_devices(kafka, keys, "user-2", "em-add-2", 2)
    svc = world.service()
    started = time.monotonic()
    try:
        p = world.run_cli(["run", "--brokers", world.bootstrap, "--state-dir", str(svc.state_dir),
                           "--http-port", str(h.free_port())], timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError("a second `mailpush run` on the same state directory was still running after 15 s")
    assert p.returncode == EXIT_TEMPFAIL, (p.returncode, p.stderr[-2000:])
    assert time.monotonic() - started < 10, "exits at once"
    assert str(svc.state_dir) in p.stderr, p.stderr
    # Setting offsets under the running service would be lost at its next commit: refused the same way.
    p = world.run_cli(["offsets", "--state-dir", str(svc.state_dir), "--set", "email.received:0=0"], timeout=30)
    assert p.returncode == EXIT_TEMPFAIL and str(svc.state_dir) in p.stderr, (p.returncode, p.stderr)
    # The first one is unaffected and still the only writer.
    expected = emails(kafka, "user-2", "em-add-2", devices, "after", 20)
    assert_each_once(kafka, expected, timeout=60)
    svc.assert_alive()
    # Once it is gone, the directory is free again.
    assert svc.stop(signal.SIGTERM) == 0
    svc.restart()


# --------------------------------------------------------------------------- queue full

@pytest.mark.runs_for(85)
def test_full_producer_queue_and_slow_broker_still_exactly_once(bare_world, keys):
    world = bare_world
    world.devbroker(control=True)
    kafka = world.kafka
    devices = owner_with_devices(kafka, keys, "user-q", "em-add-q", 40)
    expected = emails(kafka, "user-q", "em-add-q", devices, "queued", 150)
    world.control("rtt 1 500")
    # A short message timeout makes the delivery deadline (message timeout + 15 s) shorter than the time
    # 6000 records need through a 200-record queue to a slow broker.
    # Five requests in flight, librdkafka's default (the service asks the development broker for one, for its
    # latency): the scenario is a queue that fills while requests are slow, not a starved connection.
    # Static ownership: the scenario is the producer's, and a fleet member's 1 s lease cannot be renewed through a
    # broker whose every round trip takes 500 ms (a renewal's read takes several): its batches would stop and start
    # again until the broker is fast again (docs/operations.md, "Group timing").
    svc = world.service(args=["-X", "queue.buffering.max.messages=100", "-X", "message.timeout.ms=2000",
                              "-X", "max.in.flight.requests.per.connection=5", "--instance", "0", "--instances", "1"])
    assert_each_once(kafka, expected, timeout=240)
    world.control("rtt 1 0")
    svc.assert_alive()


# --------------------------------------------------------------------------- replay for backfill

@pytest.mark.parametrize("resumed_by", ["replay", "service"])
def test_replay_killed_mid_batch_and_resumed_writes_nothing_twice(world, kafka, keys, resumed_by):
    """A replay killed in the middle of its batch is resumed by the next process that holds the state directory:
    the same replay run again, or the service started on the directory."""
    devices = owner_with_devices(kafka, keys, "user-r", "em-add-r", 40)
    expected = emails(kafka, "user-r", "em-add-r", devices, "backfill", 150)
    state = world.workdir / "replay-state"
    argv = [world.bin, "replay", "--brokers", world.bootstrap, "--state-dir", str(state), "--from-offset", "0"]
    watch = OutputWatch(world.bootstrap, kafka.partitions(JOBS))
    try:
        # A tiny producer queue with a long linger makes the first batch's delivery take seconds: the kill,
        # the moment its first job lands, falls inside that batch.
        first = world.spawn("replay", argv + ["-X", "queue.buffering.max.messages=10", "-X", "linger.ms=500"])
        h.wait_for(lambda: watch.total() > 0, 120, "the replay's first job", interval=0.005, on_fail=first.log_tail)
        first.kill()
        time.sleep(0.5)
        written = watch.total()
    finally:
        watch.close()
    assert 0 < written < len(expected), "killed in the middle of its batch"
    if resumed_by == "replay":
        again = world.run_cli(argv[1:], timeout=180)
        assert again.returncode == 0, again.stderr[-3000:]
        assert_each_once(kafka, expected)
    else:
        svc = world.service(state_dir=state)
        assert_each_once(kafka, expected)
        h.wait_for(lambda: "replay done" in svc.proc.log_text(), 60, "the service finished the recorded replay",
                   on_fail=svc.proc.log_tail)
        svc.assert_alive()


def test_replay_dry_run_counts_and_writes_nothing(world, kafka, keys):
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce_many([(EVENTS, "em-add-1", h.event(f"dry-{i}")) for i in range(10)]
                       + [(EVENTS, "em-add-9", h.event(f"nokey-{i}", address="em-add-9")) for i in range(2)]
                       + [(EVENTS, "em-add-1", b"not json")])
    state = world.workdir / "dry-state"
    p = world.run_cli(["replay", "--brokers", world.bootstrap, "--state-dir", str(state), "--from-offset", "0",
                       "--dry-run"], timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "13 events" in p.stdout and "20 jobs" in p.stdout, p.stdout
    assert "android=10" in p.stdout and "ios=10" in p.stdout, p.stdout
    assert "3 dead letters" in p.stdout and "0 skipped" in p.stdout, p.stdout
    assert "ETA" in p.stderr, "progress lines with rate and ETA"
    assert kafka.consume(JOBS, timeout=3, idle=0.5) == [], "a dry run writes nothing"
    assert kafka.consume(h.DEAD, timeout=3, idle=0.5) == []
    # …and records nothing: the real replay afterwards delivers everything.
    p = world.run_cli(["replay", "--brokers", world.bootstrap, "--state-dir", str(state), "--from-offset", "0"],
                      timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "20 jobs, 3 dead letters, 0 skipped" in p.stdout, p.stdout
    assert_each_once(kafka, {sudo_client.job_id("em-add-1", f"dry-{i}", d)
                             for i in range(10) for d in ("dev-ios-1", "dev-android-1")})
