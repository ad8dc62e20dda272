"""The same email published twice gives its jobs once (§7 jobId, §8 dedupe)."""

from __future__ import annotations

import threading
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


def test_dedupe_window_expires_while_events_never_stop(world, kafka):
    """Housekeeping (dedupe expiry, lag gauges) must not wait for a quiet moment: a busy mail system may
    never leave the service a poll without events, and its dedupe table would grow without end."""
    service = world.service(args=["--dedupe-window-seconds", "1"])
    stop = threading.Event()
    published = [0]

    def publish():
        # No device wants these, so each costs the service little, but each is an email it remembers. About
        # 1,000 a second: never 100 ms without one (the bug showed from ~50/s), and never so many that the
        # development broker's ~5 MB per partition drops events before the service has read them (the service
        # then stops rather than skip them: an unthrottled publisher made this test fail 2 runs in 7).
        while not stop.wait(0.001):
            kafka.produce(EVENTS, "em-add-busy", h.event(f"em-msg-busy-{published[0]}", address="em-add-busy",
                                                         owner="user-without-devices"))
            published[0] += 1

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        last: dict = {}

        def expired_and_lag_recorded():
            last.clear()
            last.update(service.metrics())
            return (last.get("mailpush_dedupe_entries_expired_total", 0) > 0 and "mailpush_consumer_lag" in last
                    and "mailpush_dedupe_entries" in last)
        h.wait_for(expired_and_lag_recorded, 40, "dedupe expiry and lag gauges under continuous load",
                   on_fail=lambda: f"after {published[0]} events: expired "
                                   f"{last.get('mailpush_dedupe_entries_expired_total')}, "
                                   f"lag gauges {'present' if 'mailpush_consumer_lag' in last else 'absent'}")
        assert publisher.is_alive(), "the load stopped before housekeeping ran: the test proves nothing"
    finally:
        stop.set()
        publisher.join(10)
    service.assert_alive()
    log = service.proc.log_text()
    assert '"message":"expired dedupe entries"' in log
    assert "state checkpoint failed" not in log, "a checkpoint colliding with another one is no failure"
