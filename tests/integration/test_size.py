"""Payload size (§7): shortening subject, then from.displayName, then replyTo.displayName."""

from __future__ import annotations

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS


def _setup(world, kafka, keys, algorithm=sudo_client.CBC):
    world.service()
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    key = sudo_client.key_record(keys.a, "em-add-1", "k1", algorithm)
    kafka.produce(KEYS, "em-add-1", key)
    return (ios, android), key


def _open(job_rec, priv):
    return sudo_client.open_data(priv, sudo_client.sudoplatform_of(job_rec.json())["data"])[1]


def test_long_subject_is_shortened_on_a_character_boundary(world, kafka, keys):
    devices, key = _setup(world, kafka, keys)
    subject = ("Grüße 👋 日本語 " * 400)[:5000]   # 1-, 2-, 3- and 4-byte UTF-8 characters
    ev = h.event("em-msg-long", subject=subject)
    rec = kafka.produce(EVENTS, "em-add-1", ev)
    jobs = h.by_job_id(kafka.consume(JOBS, min_count=2, timeout=60, idle=1.0))
    assert len(jobs) == 2
    for dev in devices:
        r = jobs[sudo_client.job_id("em-add-1", "em-msg-long", dev["deviceId"])]
        plain = h.assert_job(r, ev=ev, ev_rec=rec, device=dev, private_key=keys.a, key=key,
                             allow_shortened=True)
        got = _open(r, keys.a)
        assert got["subject"] != subject and got["subject"].endswith("\u2026")
        assert subject.startswith(got["subject"][:-1])
        assert got["from"] == ev["from"], "displayName is only cut after the subject"
        assert plain


def test_subject_then_display_name_then_reply_to(world, kafka, keys):
    devices, key = _setup(world, kafka, keys, sudo_client.GCM)
    ev = h.event("em-msg-long2", subject="S" * 3000,
                 **{"from": {"emailAddress": "alice@example.com", "displayName": "D" * 3000},
                    "replyTo": {"emailAddress": "reply@example.com", "displayName": "Reply Desk"}})
    rec = kafka.produce(EVENTS, "em-add-1", ev)
    jobs = h.by_job_id(kafka.consume(JOBS, min_count=2, timeout=60, idle=1.0))
    for dev in devices:
        r = jobs[sudo_client.job_id("em-add-1", "em-msg-long2", dev["deviceId"])]
        h.assert_job(r, ev=ev, ev_rec=rec, device=dev, private_key=keys.a, key=key,
                     allow_shortened=True)
        got = _open(r, keys.a)
        # Even an empty subject leaves 3000 bytes of displayName: the subject is cut to nothing
        # first, then the displayName; replyTo's short displayName is untouched.
        assert got["subject"] == "\u2026"
        assert got["from"]["displayName"].endswith("\u2026") and len(got["from"]["displayName"]) < 3000
        assert got["from"]["emailAddress"] == "alice@example.com"
        assert got["replyTo"] == ev["replyTo"]
        assert got["messageId"] == "em-msg-long2"


def test_payload_that_cannot_fit_is_a_dead_letter(world, kafka, keys):
    _setup(world, kafka, keys)
    # Addresses are never cut (ids cannot be this long: CONTRACT §2 bounds them to 256 bytes).
    ev = h.event("em-msg-huge", **{"from": {"emailAddress": "f" * 5000 + "@example.com"}})
    raw = h.encode_value(ev)
    rec = kafka.produce(EVENTS, "em-add-1", raw)
    dead = kafka.consume(DEAD, min_count=1, timeout=60, idle=1.0)
    assert len(dead) == 1
    assert dead[0].value == raw and dead[0].headers.get("mailpush-source") == rec.pos
    assert "4096" in dead[0].headers.get("mailpush-error", "")
    assert kafka.consume(JOBS, timeout=1, idle=0.5) == []
