"""Malformed or unprocessable events become dead letters (§1, §2, §5, §7); the service goes on."""

from __future__ import annotations

import base64
import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS


def _without(ev: dict, field: str) -> dict:
    return {k: v for k, v in ev.items() if k != field}


def test_each_bad_event_is_one_dead_letter_and_service_keeps_running(world, kafka, keys):
    svc = world.service()
    ios = h.ios_device("dev-ios-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    # em-add-7 has a key with an algorithm mailpush must reject.
    bad_alg = sudo_client.key_record(keys.a, "em-add-7", "k7")
    bad_alg["algorithm"] = "RSAEncryptionPKCS1v15"
    kafka.produce(KEYS, "em-add-7", bad_alg)

    good = h.event("em-msg-ok-0")
    # (key, raw value bytes, words the mailpush-error must contain)
    cases = [
        ("em-add-1", b'{"type":"messageReceived","owner":', ["json"]),
        ("em-add-1", b"\xff\xfe not even utf-8", []),
        ("em-add-1", b"[1,2,3]", []),
        ("em-add-1", h.encode_value(_without(h.event("x1"), "messageId")), ["messageId"]),
        ("em-add-1", h.encode_value(_without(h.event("x2"), "owner")), ["owner"]),
        ("em-add-1", h.encode_value({**h.event("x3"), "receivedAtEpochMs": "yesterday"}), ["receivedAtEpochMs"]),
        ("em-add-1", h.encode_value({**h.event("x4"), "hasAttachments": "no"}), ["hasAttachments"]),
        ("em-add-1", h.encode_value({**h.event("x5"), "encryptionStatus": "MAYBE"}), ["encryptionStatus"]),
        ("em-add-1", h.encode_value({**h.event("x6"), "from": {"displayName": "No Address"}}), ["emailAddress"]),
        ("em-add-1", h.encode_value({**h.event("x7"), "type": "messageDeleted"}), ["type"]),
        ("em-add-9", h.encode_value(h.event("x8", "em-add-9")), ["no public key for address em-add-9"]),
        ("em-add-7", h.encode_value(h.event("x9", "em-add-7")), ["key"]),
        ("em-add-1", h.encode_value(h.event("m" * 3500)), ["invalid field messageId", "256"]),
        ("em-add-1", h.encode_value(h.event("x11", **{"from": {"emailAddress": "a" * 5000 + "@example.com"}})),
         ["4096"]),
        ("em-add-1", h.encode_value(h.event("x12\u0000")), ["invalid field messageId", "U+0000"]),
        (None, h.encode_value(_without(h.event("x10"), "folderId")), ["folderId"]),
    ]
    inputs = [kafka.produce(EVENTS, key, raw) for key, raw, _ in cases]
    after = kafka.produce(EVENTS, "em-add-1", good)

    jobs = kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)
    dead = kafka.consume(DEAD, min_count=len(cases), timeout=60, idle=2.0)
    svc.assert_alive()

    by_source = {}
    for r in dead:
        src = r.headers.get("mailpush-source")
        assert src not in by_source, f"two dead letters for {src}"
        by_source[src] = r
    assert set(by_source) == {rec.pos for rec in inputs}, \
        f"dead letters for {sorted(by_source)}, expected {[rec.pos for rec in inputs]}"
    for (key, raw, words), rec in zip(cases, inputs):
        dl = by_source[rec.pos]
        err = dl.headers.get("mailpush-error", "")
        assert dl.value == raw, f"{rec.pos}: dead letter value is not the original bytes"
        assert dl.key == (key.encode() if key else None), f"{rec.pos}: key changed"
        assert err.strip() and "\n" not in err and "\r" not in err, f"{rec.pos}: bad reason {err!r}"
        for w in words:
            assert w.lower() in err.lower(), f"{rec.pos}: mailpush-error {err!r} should mention {w!r}"

    # The good event after all of them still gets its job.
    assert [r.json()["jobId"] for r in jobs] == [sudo_client.job_id("em-add-1", "em-msg-ok-0", "dev-ios-1")]
    h.assert_job(jobs[0], ev=good, ev_rec=after, device=ios, private_key=keys.a)


def test_oversized_ids_are_dead_letters_even_for_android(world, kafka, keys):
    world.service()
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    big_sudo = h.event("em-msg-big", sudo="s" * 4000)
    rec = kafka.produce(EVENTS, "em-add-1", big_sudo)
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=1, timeout=60, idle=1.0))
    assert [d.headers.get("mailpush-source") for d in dead] == [rec.pos]
    # Ids are bounded on input (CONTRACT §2) before any payload is rendered.
    assert dead[0].headers.get("mailpush-error", "") == "invalid field sudoId: 4000 UTF-8 bytes, at most 256 allowed"
    assert kafka.consume(JOBS, timeout=1, idle=0.5) == []


def test_unusable_key_then_usable_key(world, kafka, keys):
    """§5: a rejected key makes events dead letters until a usable key arrives."""
    world.service()
    ios = h.ios_device("dev-ios-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    weak = sudo_client.generate_key(1024)
    bad_keys = [
        {**sudo_client.key_record(keys.a, "em-add-1", "k-bad-alg"), "algorithm": "RSAEncryptionPKCS1v15"},
        {**sudo_client.key_record(keys.a, "em-add-1", "k-garbage"), "publicKey": "bm90IGEga2V5"},
        {**sudo_client.key_record(keys.a, "em-add-1", "k-wrong-format"), "keyFormat": "RSA_PUBLIC_KEY"},
        sudo_client.key_record(weak, "em-add-1", "k-1024"),
    ]
    # The contract promises that config acknowledged before an event applies to it; it does not
    # promise that later config does not. So each next key is sent only after the previous
    # event was handled.
    evs = []
    for i, bad in enumerate(bad_keys):
        kafka.produce(KEYS, "em-add-1", bad)
        ev = h.event(f"em-msg-bad-{i}")
        evs.append(kafka.produce(EVENTS, "em-add-1", ev))
        dead = kafka.consume(DEAD, min_count=i + 1, timeout=60, idle=0.2)
        assert [d.headers.get("mailpush-source") for d in dead] == [r.pos for r in evs], \
            (f"key {bad['keyId']} should be rejected: ",
             [(d.headers.get("mailpush-source"), d.headers.get("mailpush-error")) for d in dead])
        assert "key" in dead[-1].headers.get("mailpush-error", "").lower()
    good_key = sudo_client.key_record(keys.a, "em-add-1", "k-good", sudo_client.GCM, "SPKI")
    kafka.produce(KEYS, "em-add-1", good_key)
    ev = h.event("em-msg-good")
    rec = kafka.produce(EVENTS, "em-add-1", ev)

    jobs = kafka.consume(JOBS, min_count=1, timeout=60, idle=1.0)
    assert len(kafka.consume(DEAD, timeout=1, idle=0.5)) == len(bad_keys)
    assert len(jobs) == 1
    h.assert_job(jobs[0], ev=ev, ev_rec=rec, device=ios, private_key=keys.a, key=good_key)


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der(tag: int, content: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(content)) + content


def _unsigned(value: int) -> bytes:
    """A DER INTEGER's content for a non-negative value (a 0x00 in front when its top bit is set)."""
    return value.to_bytes(value.bit_length() // 8 + 1, "big")


def _pkcs1(n_content: bytes, e_content: bytes) -> bytes:
    return _der(0x30, _der(0x02, n_content) + _der(0x02, e_content))


def test_a_well_formed_key_the_crypto_library_refuses_is_rejected_and_the_service_goes_on(world, kafka, keys):
    """Each of these keys is well-formed DER that BoringSSL refuses to load. Before, swift-crypto freed the key it
    had begun twice on that path: the key record crashed every instance at ingest (the config topics are read
    whole at every start), so one registration stopped the whole fleet for good. Each is now a rejected key:
    events for its address are dead letters, and every other address goes on."""
    svc = world.service()
    ios = h.ios_device("dev-ios-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    n = keys.a.public_key().public_numbers().n
    n_content = _unsigned(n)
    e65537 = _unsigned(65537)
    ec_spki = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    # what is wrong -> (keyFormat, DER, the reason's end)
    odd_exponent = "public exponent must be odd, from 3 to 2^33 - 1"
    hostile = {
        "exponent of 64 bits": ("RSA_PUBLIC_KEY", _pkcs1(n_content, _unsigned((1 << 63) | 1)), odd_exponent),
        "even exponent": ("RSA_PUBLIC_KEY", _pkcs1(n_content, _unsigned(65536)), odd_exponent),
        "exponent 1": ("RSA_PUBLIC_KEY", _pkcs1(n_content, _unsigned(1)), odd_exponent),
        "even modulus": ("RSA_PUBLIC_KEY", _pkcs1(_unsigned(n - 1), e65537), "modulus is even"),
        "negative modulus": ("RSA_PUBLIC_KEY", _pkcs1(n.to_bytes(256, "big"), e65537),
                             "not an RSA public key in SPKI or PKCS#1 DER form"),
        "modulus of 16,400 bits": ("RSA_PUBLIC_KEY", _pkcs1(_unsigned((1 << 16399) | 1), e65537), "at most 16384 bits"),
        "modulus of 256 bits": ("RSA_PUBLIC_KEY", _pkcs1(_unsigned((1 << 255) | 1), e65537), "at least 2048 bits"),
        "an EC P-256 key": ("SPKI", ec_spki, "not an RSA key"),
    }
    sent = []
    for i, (what, (key_format, der, _)) in enumerate(hostile.items()):
        address = f"em-add-h{i}"
        record = {**sudo_client.key_record(keys.a, address, f"k-h{i}", key_format=key_format),
                  "publicKey": base64.b64encode(der).decode("ascii")}
        kafka.produce(KEYS, address, record)
        sent.append((what, address, kafka.produce(EVENTS, address, h.event(f"em-msg-h{i}", address))))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    good = h.event("em-msg-good")
    good_rec = kafka.produce(EVENTS, "em-add-1", good)

    jobs = kafka.consume(JOBS, min_count=1, timeout=60, idle=1.0)
    dead = kafka.consume(DEAD, min_count=len(hostile), timeout=60, idle=1.0)
    svc.assert_alive()
    by_source = {d.headers.get("mailpush-source"): d.headers.get("mailpush-error", "") for d in dead}
    for what, address, rec in sent:
        assert rec.pos in by_source, f"the event for the key with {what} is not a dead letter: {by_source}"
        reason = by_source[rec.pos]
        assert reason.startswith(f"unusable public key for address {address}: "), f"{what}: {reason!r}"
        assert reason.endswith(hostile[what][2]), f"{what}: {reason!r}"
    assert len(dead) == len(hostile)
    assert len(jobs) == 1
    h.assert_job(jobs[0], ev=good, ev_rec=good_rec, device=ios, private_key=keys.a)


def test_dead_letter_value_can_be_parsed_back_by_a_person(world, kafka, keys):
    """The bad example file becomes a dead letter whose value is that file, byte for byte."""
    world.service()
    raw = (h.EXAMPLES / "email-received-bad.json").read_bytes()
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    rec = kafka.produce(EVENTS, "em-add-1", raw)
    dead = kafka.consume(DEAD, min_count=1, timeout=60, idle=1.0)
    assert len(dead) == 1 and dead[0].value == raw and dead[0].key == b"em-add-1"
    assert dead[0].headers["mailpush-source"] == rec.pos
    assert "messageId" in dead[0].headers["mailpush-error"]
    assert json.loads(dead[0].value)["emailAddressId"] == "em-add-1"


def test_a_hostile_value_is_named_in_one_short_line_that_hides_nothing(world, kafka):
    """A dead letter's reason quotes the bad value cut short, with every character that could hide, reorder or break
    the line escaped: before, one character of 5,000 combining marks went whole into the header (10 KB), and a
    right-to-left override went in raw, reordering what a person reads."""
    world.service()
    hostile = h.event("em-msg-hostile")
    hostile["type"] = "x" + "\u0301" * 5000
    reordering = h.event("em-msg-reordering")
    reordering["type"] = "ok\u202etxt.exe\u200b\u2028\x7f"
    recs = [kafka.produce(EVENTS, "em-add-1", hostile), kafka.produce(EVENTS, "em-add-1", reordering)]
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=2, timeout=60, idle=1.0))
    errors = {d.headers.get("mailpush-source"): d.headers.get("mailpush-error", "") for d in dead}
    assert set(errors) == {r.pos for r in recs}
    long_one, reordered = errors[recs[0].pos], errors[recs[1].pos]
    assert long_one == 'unsupported type "x' + "\u0301" * 63 + '…"'
    assert reordered == 'unsupported type "ok\\u202etxt.exe\\u200b\\u2028\\u007f"'


def test_an_address_without_a_key_is_named_with_nothing_hidden(world, kafka):
    """`no public key for address …` names the event's address id, which may hold any character but U+0000 (contract
    §2): a newline, a right-to-left override or a line separator went into the header raw before."""
    world.service()
    address = "em-\u202e7\n8\u2028\x7f"
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    rec = kafka.produce(EVENTS, address, h.event("em-msg-1", address=address))
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=1, timeout=60, idle=1.0))
    assert [d.headers.get("mailpush-source") for d in dead] == [rec.pos]
    assert dead[0].headers["mailpush-error"] == "no public key for address em-\\u202e7\\u000a8\\u2028\\u007f"
    assert json.loads(dead[0].value)["emailAddressId"] == address, "the dead letter's value is the event, unchanged"


def test_a_received_time_a_job_cannot_expire_from_is_a_dead_letter(world, kafka, keys):
    """A job expires `receivedAtEpochMs` + TTL: from a time before 1970 or past 9999 that expiry was negative or
    wrapped around (an `apns-expiration` of "-9223372034435577"), a job no push service accepts."""
    world.service()
    ios, android = h.ios_device("dev-ios-1"), h.android_device("dev-android-1")
    kafka.produce(DEVICES, "dev-ios-1", ios)
    kafka.produce(DEVICES, "dev-android-1", android)
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    last_ms_of_9999 = 253402300799999
    events = {f"em-msg-at-{t}": h.event(f"em-msg-at-{t}", receivedAtEpochMs=t) for t in (0, last_ms_of_9999)}
    fine = {m: kafka.produce(EVENTS, "em-add-1", ev) for m, ev in events.items()}
    outside = [kafka.produce(EVENTS, "em-add-1", h.event(f"em-msg-out-{i}", receivedAtEpochMs=t))
               for i, t in enumerate((-1, -86_400_000 * 40, last_ms_of_9999 + 1, 2**63 - 1))]

    jobs = h.by_job_id(kafka.consume(JOBS, min_count=4, timeout=60, idle=2.0))
    dead = h.not_sentinel(kafka.consume(DEAD, min_count=len(outside), timeout=60, idle=1.0))

    assert sorted(d.headers.get("mailpush-source") for d in dead) == sorted(r.pos for r in outside)
    for d in dead:
        assert d.headers.get("mailpush-error") == \
            "invalid field receivedAtEpochMs: must be 0…253402300799999 (1970 to 9999)"
    expected = {sudo_client.job_id("em-add-1", m, dev["deviceId"]): (m, dev) for m in fine for dev in (ios, android)}
    assert set(jobs) == set(expected)
    for jid, (m, dev) in expected.items():
        # Checks the job against schemas/push-job.v1.schema.json and its expiry against received + TTL.
        h.assert_job(jobs[jid], ev=events[m], ev_rec=fine[m], device=dev, private_key=keys.a)
