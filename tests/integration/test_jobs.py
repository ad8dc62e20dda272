"""Push jobs for every kind of device, opened like a Sudo client (§6, §7)."""

from __future__ import annotations

import json
import time

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEVICES, EVENTS, JOBS, KEYS

WEBHOOK_URL = "https://sponsor.example/push?tenant=1"


def test_jobs_for_all_platforms_and_both_algorithms(world, kafka, keys):
    svc = world.service(args=["--sponsor-webhook-url", WEBHOOK_URL])

    devices = [
        h.ios_device("dev-ios-1"),
        h.android_device("dev-android-1"),
        h.sponsor_fcm_device("dev-sponsor-fcm-1"),
        h.sponsor_webhook_device("dev-sponsor-webhook-1"),
    ]
    # Another owner's device must not get user-1's mail.
    other = h.ios_device("dev-ios-other", owner="user-2")
    for d in devices + [other]:
        kafka.produce(DEVICES, d["deviceId"], d)

    key_cbc = sudo_client.key_record(keys.a, "em-add-1", "key-cbc-1", sudo_client.CBC, "SPKI")
    key_gcm = sudo_client.key_record(keys.b, "em-add-2", "key-gcm-1", sudo_client.GCM, "RSA_PUBLIC_KEY")
    kafka.produce(KEYS, "em-add-1", key_cbc)
    kafka.produce(KEYS, "em-add-2", key_gcm)

    events = [
        # Full §2 event with replyTo and an unknown field (ignored, not sealed).
        (h.event("em-msg-1", "em-add-1", subject="Quarterly numbers for Bob",
                 replyTo={"emailAddress": "reply-here@example.com", "displayName": "Reply Desk"},
                 futureField={"ignored": True}), keys.a, key_cbc),
        # No `type` (defaults to messageReceived), no subject (sealed as null), no displayName,
        # ENCRYPTED, attachments; GCM key given as PKCS#1.
        (h.event("em-msg-2", "em-add-2", type=None, subject=None,
                 **{"from": {"emailAddress": "carol@example.org"}},
                 encryptionStatus="ENCRYPTED", hasAttachments=True,
                 sentAtEpochMs=1718000000000, receivedAtEpochMs=1718000001234), keys.b, key_gcm),
        # Non-ASCII subject survives sealing byte for byte.
        (h.event("em-msg-3", "em-add-1", subject="Grüße 👋 — ünïcödé 日本語"), keys.a, key_cbc),
    ]
    t0 = int(time.time() * 1000)
    produced = [(ev, kafka.produce(EVENTS, ev["emailAddressId"], ev), priv, key)
                for ev, priv, key in events]

    expected = {sudo_client.job_id(ev["emailAddressId"], ev["messageId"], d["deviceId"]): (ev, rec, d, priv, key)
                for ev, rec, priv, key in produced for d in devices}
    assert len(expected) == 12

    jobs = kafka.consume(JOBS, min_count=len(expected), timeout=60, idle=2.0)
    t1 = int(time.time() * 1000)
    got = h.by_job_id(jobs)  # fails on any duplicate jobId
    assert set(got) == set(expected), (
        f"missing {sorted(set(expected) - set(got))}, unexpected "
        f"{[(got[j].key_str, got[j].json()['source']) for j in set(got) - set(expected)]}")

    for jid, (ev, ev_rec, dev, priv, key) in expected.items():
        plain = h.assert_job(got[jid], ev=ev, ev_rec=ev_rec, device=dev, private_key=priv, key=key,
                             webhook_url=WEBHOOK_URL, created_window=(t0 - 5000, t1 + 5000))
        if plain:
            if ev["messageId"] == "em-msg-2":
                assert plain["subject"] is None and "replyTo" not in plain
                assert plain["type"] == "messageReceived"
            if ev["messageId"] == "em-msg-3":
                assert plain["subject"] == "Grüße 👋 — ünïcödé 日本語"

    # Fresh AES key per sealing: the same email sealed for two devices differs.
    sealed = {json.loads(sudo_client.sudoplatform_of(got[j].json())["data"])["sealed"]
              for j, (ev, *_r) in expected.items()
              if ev["messageId"] == "em-msg-1" and got[j].json()["platform"] != "webhook"}
    assert len(sealed) == 3

    assert svc.proc.alive()
    assert not h.not_sentinel(kafka.consume(h.DEAD, timeout=1, idle=0.5)), "no dead letters expected"


def test_alert_text_and_ttl_are_configurable(world, kafka, keys):
    """--alert-title/--alert-body set the iOS placeholder; MAILPUSH_TTL_SECONDS sets the TTL (§9)."""
    env = h.clean_env({"MAILPUSH_TTL_SECONDS": "3600"})
    world.service(args=["--alert-title", "New mail", "--alert-body", "Tap to read"], env=env)
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    key = sudo_client.key_record(keys.a, "em-add-1", "k1")
    kafka.produce(KEYS, "em-add-1", key)
    ev = h.event("em-msg-ttl")
    rec = kafka.produce(EVENTS, "em-add-1", ev)
    jobs = h.by_job_id(kafka.consume(JOBS, min_count=2, timeout=60))
    assert len(jobs) == 2
    for dev in (ios, android):
        jid = sudo_client.job_id("em-add-1", "em-msg-ttl", dev["deviceId"])
        h.assert_job(jobs[jid], ev=ev, ev_rec=rec, device=dev, private_key=keys.a, key=key,
                     ttl_ms=3600 * 1000, alert=("New mail", "Tap to read"))


def test_a_ttl_longer_than_fcm_allows_keeps_android_jobs_sendable(world, kafka, keys):
    """FCM refuses an `android.ttl` over 28 days: a 60-day TTL gave every Android job a request FCM rejects.
    The job's expiry keeps the configured TTL; FCM's ttl stops at its limit."""
    sixty_days = 60 * 86_400
    world.service(args=["--ttl-seconds", str(sixty_days)])
    android = h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-android-1", android)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    ev = h.event("em-msg-long-ttl")
    rec = kafka.produce(EVENTS, "em-add-1", ev)
    [job] = kafka.consume(JOBS, min_count=1, timeout=60)
    h.assert_job(job, ev=ev, ev_rec=rec, device=android, private_key=keys.a, ttl_ms=sixty_days * 1000)
    assert job.json()["fcm"]["message"]["android"]["ttl"] == "2419200s"
    assert job.json()["expiresAtEpochMs"] == ev["receivedAtEpochMs"] + sixty_days * 1000


def test_default_alert_is_a_neutral_placeholder(world, kafka, keys):
    world.service()
    ios = h.ios_device("dev-ios-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    ev = h.event("em-msg-alert", subject="Top secret merger plans")
    kafka.produce(EVENTS, "em-add-1", ev)
    jobs = kafka.consume(JOBS, min_count=1, timeout=60)
    assert len(jobs) == 1
    alert = jobs[0].json()["apns"]["payload"]["aps"]["alert"]
    assert alert["title"].strip() and alert["body"].strip()
    text = (alert["title"] + " " + alert["body"]).lower()
    for word in ("top secret", "merger", "alice", "example.com", "em-msg-alert"):
        assert word not in text
