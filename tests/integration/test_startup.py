"""Start-up: a service with a backlog waiting gets to work at once."""

from __future__ import annotations

import time

import mailpush_harness as h
from guarantees import publish, register


def test_with_static_ownership_the_first_job_of_a_waiting_backlog_comes_within_600_ms_of_the_start(world, kafka, keys):
    # librdkafka 2.0.2 learns a topic it was only told about (an assignment, a first produce) in its once-a-second
    # topic scan, and retries a start-offset query sent before the leader was known after 500 ms: a fresh service
    # was ready 0.55 s after its start and wrote its first job 1-2 s after it. Its clients now learn their topics
    # at once and the config topics are assigned at concrete offsets: a debug build writes it 140-190 ms after its
    # start (1,119 ms before).
    register(kafka, keys)
    publish(kafka, "waiting", 200)
    started_ms = time.time() * 1000
    # Static ownership joins no group: what is left is the pipeline's own start-up (the default, a group, adds
    # the group's first join: test_heal.py).
    svc = world.service(args=["--instance", "0", "--instances", "1"], wait_ready=False)
    jobs = kafka.consume(h.JOBS, min_count=1, timeout=30, idle=0.2)
    first = min(r.timestamp_ms for r in jobs) - started_ms
    assert first < 600, f"first job {first:.0f} ms after the start\n{svc.proc.log_tail()}"
