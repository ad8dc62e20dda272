"""Static partition ownership (§8): instance i of n owns event partitions p with p % n == i."""

from __future__ import annotations

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEVICES, EVENTS, JOBS, KEYS


def test_two_instances_split_the_partitions(world, kafka, keys):
    svcs = [world.service(args=["--instance", str(i), "--instances", "2"]) for i in range(2)]
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    addresses = [f"em-add-{i}" for i in range(16)]
    for a in addresses:
        kafka.produce(KEYS, a, sudo_client.key_record(keys.a, a, f"k-{a}"))
    recs = [kafka.produce(EVENTS, a, h.event(f"em-msg-{a}", a)) for a in addresses]
    parts = {r.partition for r in recs}
    assert len(parts) >= 2, "events should spread over several partitions"

    jobs = kafka.consume(JOBS, min_count=len(addresses), timeout=60, idle=2.0)
    got = h.by_job_id(jobs)  # no job twice, although both instances see all config
    assert set(got) == {sudo_client.job_id(a, f"em-msg-{a}", "dev-ios-1") for a in addresses}
    for r in recs:
        j = got[sudo_client.job_id(r.key_str, f"em-msg-{r.key_str}", "dev-ios-1")]
        assert j.headers["mailpush-source"] == r.pos

    # Each instance handled exactly the events of its partitions.
    want = [sum(1 for r in recs if r.partition % 2 == i) for i in range(2)]
    last = {}

    def counts_match():
        last["got"] = [s.metrics().get("mailpush_events_received_total", 0) for s in svcs]
        return last["got"] == want
    h.wait_for(counts_match, 15, "per-instance mailpush_events_received_total",
               on_fail=lambda: f"got {last.get('got')}, expected {want}")
