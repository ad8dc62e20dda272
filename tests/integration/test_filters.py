"""Filter semantics (§4), driven through Kafka: who gets a job, who gets nothing."""

from __future__ import annotations

import json

import pytest

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS


def test_filter_vectors_end_to_end(world, kafka, keys):
    """Every case of vectors/filters.json as a device of one owner; one event with the vector's meta."""
    vec = json.loads(h.vector_path("filters.json").read_text())
    meta = vec["meta"]
    world.service()
    devices = {}
    for i, case in enumerate(vec["cases"]):
        dev = h.ios_device(f"dev-vec-{i:02d}", owner="user-vec", filter=case["filter"])
        devices[dev["deviceId"]] = (case, dev)
        kafka.produce(DEVICES, dev["deviceId"], dev)
    kafka.produce(KEYS, meta["emailAddressId"],
                  sudo_client.key_record(keys.a, meta["emailAddressId"], meta["keyId"], owner="user-vec"))
    ev = h.event("em-msg-vec", meta["emailAddressId"], owner="user-vec", sudo=meta["sudoId"],
                 folderId=meta["folderId"])
    kafka.produce(EVENTS, meta["emailAddressId"], ev)
    h.sentinel(kafka, meta["emailAddressId"])
    want = {d for d, (case, _) in devices.items() if case["send"]}
    # Until every wanted job is there (a job may land just after the sentinel's dead letter), then idle: a job
    # that should not have been sent has had its chance to appear.
    jobs = kafka.consume(JOBS, timeout=30, idle=1.5, until=lambda rs: want <= {r.key_str for r in rs})
    got = {r.key_str for r in jobs}
    wrong = sorted((devices[d][0]["name"], "sent" if d in got else "not sent")
                   for d in (got ^ want))
    assert not wrong, f"filter decisions differ from vectors/filters.json: {wrong}"
    assert len(jobs) == len(got), "duplicate jobs"


def test_address_disabled_device_gets_nothing_other_device_gets_job(world, kafka, keys):
    world.service()
    ios = h.ios_device("dev-ios-1", filter=h.init_filter(disable_addresses=["em-add-1"]))
    android = h.android_device("dev-android-1")
    no_config = h.ios_device("dev-ios-noconf", filter=[])
    other_service_only = h.android_device("dev-android-vc", filter=[
        h.item("ENABLE", h.IOS_CATCH_ALL, service="vcService")])
    no_filter_field = {k: v for k, v in h.ios_device("dev-ios-nofilter").items() if k != "filter"}
    for d in (ios, android, no_config, other_service_only, no_filter_field):
        kafka.produce(DEVICES, d["deviceId"], d)
    for addr in ("em-add-1", "em-add-2"):
        kafka.produce(KEYS, addr, sudo_client.key_record(keys.a, addr, f"k-{addr}"))

    e1 = h.event("em-msg-1", "em-add-1")
    e2 = h.event("em-msg-2", "em-add-2")
    kafka.produce(EVENTS, "em-add-1", e1)
    kafka.produce(EVENTS, "em-add-2", e2)
    h.sentinel(kafka, "em-add-1")
    h.sentinel(kafka, "em-add-2")
    jobs = kafka.consume(JOBS, min_count=3, timeout=30, idle=1.5)
    got = sorted((r.json()["deviceId"], r.json()["jobId"]) for r in jobs)
    want = sorted([
        ("dev-android-1", sudo_client.job_id("em-add-1", "em-msg-1", "dev-android-1")),
        ("dev-android-1", sudo_client.job_id("em-add-2", "em-msg-2", "dev-android-1")),
        ("dev-ios-1", sudo_client.job_id("em-add-2", "em-msg-2", "dev-ios-1")),
    ])
    assert got == want


def test_sudo_disabled(world, kafka, keys):
    world.service()
    ios = h.ios_device("dev-ios-1", filter=h.init_filter(disable_sudos=["sudo-2"]))
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(KEYS, "em-add-2", sudo_client.key_record(keys.a, "em-add-2", "k2"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1", "em-add-1", sudo="sudo-1"))
    kafka.produce(EVENTS, "em-add-2", h.event("em-msg-2", "em-add-2", sudo="sudo-2"))
    h.sentinel(kafka, "em-add-2")
    jobs = kafka.consume(JOBS, min_count=1, timeout=30, idle=1.5)
    assert [r.json()["jobId"] for r in jobs] == [sudo_client.job_id("em-add-1", "em-msg-1", "dev-ios-1")]


def test_unwanted_event_needs_no_key_and_is_not_a_dead_letter(world, kafka, keys):
    world.service()
    # user-2's only device disabled em-add-5; em-add-5 has no key.
    kafka.produce(DEVICES, "dev-ios-2",
                  h.ios_device("dev-ios-2", owner="user-2", filter=h.init_filter(disable_addresses=["em-add-5"])))
    kafka.produce(EVENTS, "em-add-5", h.event("em-msg-5", "em-add-5", owner="user-2"))
    # user-ghost has no device at all; em-add-6 has no key either.
    kafka.produce(EVENTS, "em-add-6", h.event("em-msg-6", "em-add-6", owner="user-ghost"))
    h.sentinel(kafka, "em-add-5")
    h.sentinel(kafka, "em-add-6")
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=2, timeout=10, idle=1.0))
    assert dead == [], [(r.key_str, r.headers.get("mailpush-error")) for r in dead]
    assert kafka.consume(JOBS, timeout=2, idle=1.0) == []


@pytest.mark.parametrize("catch_all", [h.IOS_CATCH_ALL, h.ANDROID_CATCH_ALL, '{"==":[ 1 ,1 ]}'])
def test_catch_all_in_the_middle_does_not_override_disable(world, kafka, keys, catch_all):
    world.service()
    flt = [h.item("DISABLE", h.RULE_NOT_MESSAGE_RECEIVED), h.item("ENABLE", catch_all),
           h.item("DISABLE", '{"==":[{"var":"meta.emailAddressId"},"em-add-1"]}'),
           h.item("ENABLE", h.IOS_CATCH_ALL)]
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1", filter=flt))
    for addr in ("em-add-1", "em-add-2"):
        kafka.produce(KEYS, addr, sudo_client.key_record(keys.a, addr, f"k-{addr}"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1", "em-add-1"))
    kafka.produce(EVENTS, "em-add-2", h.event("em-msg-2", "em-add-2"))
    h.sentinel(kafka, "em-add-1")
    jobs = kafka.consume(JOBS, min_count=1, timeout=30, idle=1.5)
    assert [r.json()["jobId"] for r in jobs] == [sudo_client.job_id("em-add-2", "em-msg-2", "dev-ios-1")]
