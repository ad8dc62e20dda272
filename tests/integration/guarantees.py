"""Shared steps of the guarantee tests (faults, shutdown, offsets): publish emails, count jobs."""

from __future__ import annotations

import collections

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEVICES, EVENTS, JOBS, KEYS

DEVICE_IDS = ("dev-ios-1", "dev-android-1")


def register(kafka, keys) -> None:
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))


def publish(kafka, prefix: str, count: int) -> set[str]:
    """Publishes `count` emails; returns the jobIds they must yield (one per device)."""
    kafka.produce_many([(EVENTS, "em-add-1", h.event(f"{prefix}-{i}")) for i in range(count)])
    return {sudo_client.job_id("em-add-1", f"{prefix}-{i}", d) for i in range(count) for d in DEVICE_IDS}


def assert_exactly_once(kafka, expected: set[str], timeout: float = 120, idle: float = 1.5) -> list:
    """Waits for the jobs topic to hold `expected` (then `idle` seconds more, for late duplicates), then checks
    each jobId is there exactly once."""
    jobs = kafka.consume(JOBS, min_count=len(expected), timeout=timeout, idle=idle)
    # A job the broker itself dropped is not one the service lost: say which it is (a test of 3,000 emails to one
    # device wrote 5.2 MB into one partition and lost its first jobs that way, with no fault of the service).
    trimmed = {p: start for p, start in kafka.log_starts(JOBS).items() if start > 0}
    assert not trimmed, (
        f"the development broker dropped the oldest jobs of {JOBS} partitions {trimmed} (partition: first offset "
        f"left), as it does past about 5 MB per partition: this test writes too much into one partition")
    counts = collections.Counter(r.headers.get("mailpush-job-id") for r in jobs)
    duplicates = {j: n for j, n in counts.items() if n > 1}
    missing = expected - set(counts)
    unexpected = set(counts) - expected
    where = {}
    for r in jobs:
        jid = r.headers.get("mailpush-job-id")
        if jid in duplicates:
            where.setdefault(jid, []).append(f"{r.pos} from {r.headers.get('mailpush-source')}")
    assert not (duplicates or missing or unexpected), (
        f"expected={len(expected)} present={len(counts)} duplicates={len(duplicates)} "
        f"missing={len(missing)} unexpected={len(unexpected)}; e.g. duplicates {list(duplicates)[:3]}, "
        f"missing {sorted(missing)[:3]}; duplicate copies (job record, source): "
        f"{sorted(where.values())[:12]}")
    return jobs
