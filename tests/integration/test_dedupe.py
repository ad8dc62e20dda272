"""The same email published twice gives its jobs once (§7 jobId, §8 dedupe)."""

from __future__ import annotations

import time

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS


def test_duplicate_publication_gives_jobs_once(world, kafka, keys):
    world.service()
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))

    ev = h.event("em-msg-dup")
    first = kafka.produce(EVENTS, "em-add-1", ev)
    second = kafka.produce(EVENTS, "em-add-1", ev)                      # same bytes, new offset
    third = kafka.produce(EVENTS, "em-add-1", {**ev, "subject": "Re-sent with another subject",
                                               "receivedAtEpochMs": ev["receivedAtEpochMs"] + 5000})
    assert len({first.offset, second.offset, third.offset}) == 3
    other = h.event("em-msg-other")
    kafka.produce(EVENTS, "em-add-1", other)
    h.sentinel(kafka, "em-add-1")

    jobs = kafka.consume(JOBS, min_count=4, timeout=60, idle=2.0)
    got = h.by_job_id(jobs)  # fails on any duplicate
    assert set(got) == {sudo_client.job_id("em-add-1", m, d) for m in ("em-msg-dup", "em-msg-other")
                        for d in ("dev-ios-1", "dev-android-1")}
    # The jobs come from the first publication.
    for dev in (ios, android):
        r = got[sudo_client.job_id("em-add-1", "em-msg-dup", dev["deviceId"])]
        h.assert_job(r, ev=ev, ev_rec=first, device=dev, private_key=keys.a)
    # Duplicates are not errors.
    assert h.not_sentinel(kafka.consume(DEAD, timeout=2, idle=1.0)) == []


def test_same_message_id_on_another_address_is_another_email(world, kafka, keys):
    world.service()
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    for a in ("em-add-1", "em-add-2"):
        kafka.produce(KEYS, a, sudo_client.key_record(keys.a, a, f"k-{a}"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1", "em-add-1"))
    kafka.produce(EVENTS, "em-add-2", h.event("em-msg-1", "em-add-2"))
    jobs = kafka.consume(JOBS, min_count=2, timeout=60, idle=1.5)
    assert sorted(h.job_ids(jobs)) == sorted([sudo_client.job_id("em-add-1", "em-msg-1", "dev-ios-1"),
                                              sudo_client.job_id("em-add-2", "em-msg-1", "dev-ios-1")])


def test_copies_published_moments_apart_give_jobs_once(world, kafka, keys):
    """While one batch is delivered the next is already planned: a copy of an email in the next batch must
    count the first copy (planned, not yet committed) as processed. Copies follow each other by a few
    milliseconds, so that many pairs straddle two batches."""
    service = world.service()
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    h.sentinel(kafka, "em-add-1")

    pairs = 150
    for i in range(pairs):
        ev = h.event(f"em-msg-pair-{i}")
        kafka.produce(EVENTS, "em-add-1", ev)
        time.sleep(0.001 * (i % 8))
        kafka.produce(EVENTS, "em-add-1", ev)
    h.sentinel(kafka, "em-add-1")

    jobs = kafka.consume(JOBS, min_count=2 * pairs, timeout=60, idle=2.0)
    got = h.by_job_id(jobs)  # fails on any duplicate
    assert set(got) == {sudo_client.job_id("em-add-1", f"em-msg-pair-{i}", d)
                        for i in range(pairs) for d in ("dev-ios-1", "dev-android-1")}
    assert service.metrics().get("mailpush_duplicate_events_total", 0) == pairs
