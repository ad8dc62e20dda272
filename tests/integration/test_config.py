"""Config topics (§3, §5, §8): tombstones, bad registrations, updates, restart survival."""

from __future__ import annotations

import signal
import time

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS


def jid(addr, msg, dev):
    return sudo_client.job_id(addr, msg, dev)


def test_device_tombstone_stops_its_jobs(world, kafka, keys):
    world.service()
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=2, timeout=60, idle=0.2)) == 2

    kafka.produce(DEVICES, "dev-ios-1", None)  # unregister
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-2"))
    h.sentinel(kafka, "em-add-1")
    jobs = kafka.consume(JOBS, min_count=3, timeout=30, idle=1.5)
    assert sorted(h.job_ids(jobs)) == sorted([
        jid("em-add-1", "em-msg-1", "dev-ios-1"), jid("em-add-1", "em-msg-1", "dev-android-1"),
        jid("em-add-1", "em-msg-2", "dev-android-1")])

    # Registering again brings it back.
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-3"))
    jobs = kafka.consume(JOBS, min_count=5, timeout=60, idle=1.0)
    assert jid("em-add-1", "em-msg-3", "dev-ios-1") in h.job_ids(jobs)
    assert len(jobs) == 5


def test_key_tombstone_makes_events_dead_letters_until_a_key_returns(world, kafka, keys):
    world.service()
    ios = h.ios_device("dev-ios-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    k1 = sudo_client.key_record(keys.a, "em-add-1", "k1")
    kafka.produce(KEYS, "em-add-1", k1)
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.2)) == 1

    kafka.produce(KEYS, "em-add-1", None)  # remove the key
    raw = h.encode_value(h.event("em-msg-2"))
    rec2 = kafka.produce(EVENTS, "em-add-1", raw)
    dead = kafka.consume(DEAD, min_count=1, timeout=60, idle=1.0)
    assert len(dead) == 1
    assert dead[0].value == raw and dead[0].key == b"em-add-1"
    assert dead[0].headers.get("mailpush-source") == rec2.pos
    assert "no public key for address em-add-1" in dead[0].headers.get("mailpush-error", "")

    # A new key (rotated keyId, other algorithm) applies to the next event.
    k2 = sudo_client.key_record(keys.b, "em-add-1", "k2", sudo_client.GCM, "RSA_PUBLIC_KEY")
    kafka.produce(KEYS, "em-add-1", k2)
    ev3 = h.event("em-msg-3")
    rec3 = kafka.produce(EVENTS, "em-add-1", ev3)
    jobs = kafka.consume(JOBS, min_count=2, timeout=60, idle=1.0)
    assert sorted(h.job_ids(jobs)) == sorted([jid("em-add-1", "em-msg-1", "dev-ios-1"),
                                              jid("em-add-1", "em-msg-3", "dev-ios-1")])
    job3 = [r for r in jobs if r.json()["jobId"] == jid("em-add-1", "em-msg-3", "dev-ios-1")][0]
    h.assert_job(job3, ev=ev3, ev_rec=rec3, device=ios, private_key=keys.b, key=k2)


def test_bad_registration_is_skipped_and_previous_stays(world, kafka, keys):
    svc = world.service()
    ios = h.ios_device("dev-ios-1", token="token-original")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    bad = [
        b"{not json",
        h.encode_value({"deviceId": "dev-ios-1", "owner": "user-1", "platform": "ios",
                        "bundleId": "com.example.mail"}),                       # no pushToken
        h.encode_value({"deviceId": "dev-ios-1", "platform": "ios", "pushToken": "token-bad"}),  # no owner
        h.encode_value({"owner": "user-1", "platform": "ios", "pushToken": "token-bad"}),        # no deviceId
        h.encode_value({"deviceId": "dev-ios-1", "owner": "user-1", "platform": "windows",
                        "pushToken": "token-bad"}),
        h.encode_value({"deviceId": "dev-ios-1", "owner": "user-1",
                        "comMethod": {"id": "x", "type": 7, "value": "token-bad"}}),
    ]
    for raw in bad:
        kafka.produce(DEVICES, "dev-ios-1", raw)
    ev = h.event("em-msg-1")
    rec = kafka.produce(EVENTS, "em-add-1", ev)
    jobs = kafka.consume(JOBS, min_count=1, timeout=60, idle=1.5)
    assert len(jobs) == 1
    h.assert_job(jobs[0], ev=ev, ev_rec=rec, device=ios, private_key=keys.a)
    assert jobs[0].json()["apns"]["deviceToken"] == "token-original"
    svc.assert_alive()
    # Bad config is not an event: it never becomes a dead letter.
    h.sentinel(kafka, "em-add-1")
    assert h.not_sentinel(kafka.consume(DEAD, timeout=2, idle=1.0)) == []

    # A valid update (new token, now Android) replaces the registration.
    moved = h.android_device("dev-ios-1", token="token-new")
    kafka.produce(DEVICES, "dev-ios-1", moved)
    ev2 = h.event("em-msg-2")
    rec2 = kafka.produce(EVENTS, "em-add-1", ev2)
    jobs = kafka.consume(JOBS, min_count=2, timeout=60, idle=1.0)
    j2 = [r for r in jobs if r.json()["jobId"] == jid("em-add-1", "em-msg-2", "dev-ios-1")]
    assert len(j2) == 1
    h.assert_job(j2[0], ev=ev2, ev_rec=rec2, device=moved, private_key=keys.a)


def test_config_survives_restart_and_nothing_is_emitted_twice(world, kafka, keys):
    svc = world.service()
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    key = sudo_client.key_record(keys.a, "em-add-1", "k1")
    kafka.produce(KEYS, "em-add-1", key)
    e1 = h.event("em-msg-1")
    kafka.produce(EVENTS, "em-add-1", e1)
    kafka.produce(EVENTS, "em-add-1", b"{broken")
    assert len(kafka.consume(JOBS, min_count=2, timeout=60, idle=0.5)) == 2
    assert len(kafka.consume(DEAD, min_count=1, timeout=30, idle=0.5)) == 1

    rc = svc.stop(signal.SIGTERM, timeout=60)
    assert rc == 0, f"mailpush run exited {rc} on SIGTERM, expected 0"

    # While it is down: one more event, and a re-publication of the first one.
    e2 = h.event("em-msg-2")
    rec2 = kafka.produce(EVENTS, "em-add-1", e2)
    kafka.produce(EVENTS, "em-add-1", e1)

    svc2 = svc.restart()
    e3 = h.event("em-msg-3")
    rec3 = kafka.produce(EVENTS, "em-add-1", e3)
    h.sentinel(kafka, "em-add-1")

    jobs = kafka.consume(JOBS, min_count=6, timeout=60, idle=2.0)
    got = h.by_job_id(jobs)  # fails on duplicates
    want = {jid("em-add-1", m, d) for m in ("em-msg-1", "em-msg-2", "em-msg-3")
            for d in ("dev-ios-1", "dev-android-1")}
    assert set(got) == want
    for ev, rec in ((e2, rec2), (e3, rec3)):
        for dev in (ios, android):
            h.assert_job(got[jid("em-add-1", ev["messageId"], dev["deviceId"])], ev=ev, ev_rec=rec,
                         device=dev, private_key=keys.a, key=key)
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=1, timeout=10, idle=1.0))
    assert len(dead) == 1 and dead[0].value == b"{broken"

    assert svc2.stop(signal.SIGINT, timeout=60) == 0, "SIGINT should also shut down cleanly with 0"


def test_config_published_right_before_an_event_applies_to_it_after_quiet_spells(world, kafka, keys):
    """A quiet spell (no config for over a second) lets the service plan a batch while it asks where the config
    topics end; a registration or tombstone acknowledged just before an event must still decide its jobs."""
    world.service()
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-0"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.2)) == 1
    want = {jid("em-add-1", "em-msg-0", "dev-android-1")}
    registered = False
    for n in range(1, 7):
        time.sleep(1.3)
        registered = not registered
        kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1") if registered else None)
        kafka.produce(EVENTS, "em-add-1", h.event(f"em-msg-{n}"))
        want.add(jid("em-add-1", f"em-msg-{n}", "dev-android-1"))
        if registered:
            want.add(jid("em-add-1", f"em-msg-{n}", "dev-ios-1"))
    h.sentinel(kafka, "em-add-1")
    jobs = kafka.consume(JOBS, min_count=len(want), timeout=60, idle=1.0)
    assert set(h.by_job_id(jobs)) == want


def test_config_removed_before_it_was_read_is_skipped_with_a_warning_and_the_rest_applied(world, kafka, keys):
    """Retention (here the development broker's, which keeps about the last 5 MB of a partition) removed config
    records the stopped service had not read. The restart continues from the partition's log start, says what it
    skipped, and applies what follows. Before, the catch-up waited for ever for records librdkafka had stopped
    fetching, and the restarted service never became ready."""
    svc = world.service()
    ios = h.ios_device("dev-ios-1")
    partition = kafka.produce(DEVICES, "dev-ios-1", ios).partition
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.2)) == 1
    assert svc.stop(signal.SIGTERM) == 0
    stored = kafka.watermarks(DEVICES)[partition][1]

    # About 9 MB of registrations (each within the 4 KB token limit) into the same partition, then one more device.
    kafka.produce_many([(DEVICES, f"filler-{i}", h.ios_device(f"filler-{i}", owner="user-filler", token="t" * 4000))
                        for i in range(2000)], partition=partition)
    late = h.android_device("dev-late")
    kafka.produce(DEVICES, "dev-late", late, partition=partition)
    log_start = kafka.log_starts(DEVICES)[partition]
    assert log_start > stored, (log_start, stored)

    svc2 = svc.restart()
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-2"))
    jobs = kafka.consume(JOBS, min_count=3, timeout=60, idle=1.0)
    assert sorted(h.job_ids(jobs)) == sorted([
        jid("em-add-1", "em-msg-1", "dev-ios-1"), jid("em-add-1", "em-msg-2", "dev-ios-1"),
        jid("em-add-1", "em-msg-2", "dev-late")])
    warned = [l for l in svc2.proc.log_lines()
              if l.get("message") == "config records were removed before they were read; continuing from the partition's log start"]
    assert len(warned) == 1, svc2.proc.log_tail()
    assert warned[0]["partition"] == f"{DEVICES}[{partition}]" and int(warned[0]["storedOffset"]) == stored \
        and int(warned[0]["logStart"]) == log_start, warned
    assert svc2.stop(signal.SIGTERM) == 0
