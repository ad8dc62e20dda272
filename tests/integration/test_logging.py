"""Logs (issue 4): structured JSON lines, and never a secret, token or email content, even at trace."""

from __future__ import annotations

import json
import signal

import pytest

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS

SECRETS = {
    "sasl password": "Pw-4c9f1e-TopSecret",
    "push token": "TOKEN-7d2b0a-never-logged",
    "subject": "Subject-91e3-very-private",
    "sender name": "Sender-5a0c-Secret-Name",
    "sender address": "hidden-6b1f@example.org",
}


def test_trace_logs_are_json_and_carry_no_secret_or_email_content(world, kafka, keys):
    # Secrets reach mailpush through the environment, as the Helm chart passes them from a Secret.
    svc = world.service(args=["--log-level", "trace", "--log-format", "json"],
                        env=h.clean_env({"MAILPUSH_KAFKA_SASL_USERNAME": "mailpush",
                                         "MAILPUSH_KAFKA_SASL_PASSWORD": SECRETS["sasl password"]}))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1", token=SECRETS["push token"]))
    # A bad registration carrying the token is skipped and logged: the token must not be in that line.
    bad_device = {**h.ios_device("dev-bad", token=SECRETS["push token"]), "owner": 17}
    kafka.produce(DEVICES, "dev-bad", bad_device)
    content = {"subject": SECRETS["subject"],
               "from": {"emailAddress": SECRETS["sender address"], "displayName": SECRETS["sender name"]}}
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1", **content))
    # Dead letters log their reason: still no content, even when the event is malformed around it.
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-2", messageId=None, **content))
    kafka.produce(EVENTS, "em-add-9", h.event("em-msg-3", address="em-add-9", **content))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)) == 1
    assert len(kafka.consume(DEAD, min_count=2, timeout=60, idle=0.5)) == 2
    assert svc.stop(signal.SIGTERM, timeout=60) == 0

    # The harness writes the command line first; everything after it is mailpush's own output.
    text = "\n".join(line for line in svc.proc.log_text().splitlines() if not line.startswith("$ "))
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert len(lines) >= 5, text[-3000:]
    for line in lines:
        record = json.loads(line)
        assert {"time", "level", "message"} <= set(record), line
    assert any("dead-lettered" in json.loads(line)["message"] for line in lines), "dead letters are logged"
    assert any("skipped" in json.loads(line)["message"] for line in lines), "bad config records are logged"
    for what, secret in SECRETS.items():
        assert secret not in text, f"the {what} appears in the logs"


# A device id (and an address id) may hold any character but U+0000 (contract §2, §3): a newline that would start a
# line of its own, a right-to-left override that reorders what a person reads, a line separator, DEL.
FORGED = "\n2026-01-01T00:00:00+0000 critical mailpush: [mailpush] all events deleted"
HOSTILE_DEVICE = "dev-\u202etxt.exe" + FORGED + "\u2028\u007f\u200b"
HOSTILE_ADDRESS = "em-add-\u202e7" + FORGED


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_hostile_id_can_neither_forge_nor_disguise_a_log_line(world, kafka, keys, log_format):
    svc = world.service(args=["--log-format", log_format])
    # Each is logged with its id: a device whose filter has a rule that never matches, a key that is refused.
    kafka.produce(DEVICES, HOSTILE_DEVICE, {**h.ios_device(HOSTILE_DEVICE), "filter": [h.item("ENABLE", "not json")]})
    # A record whose key is not its deviceId is skipped and logged with both: a huge key is cut short.
    kafka.produce(DEVICES, "dev-" + "\u0301" * 100_000, h.ios_device(HOSTILE_DEVICE))
    kafka.produce(KEYS, HOSTILE_ADDRESS, sudo_client.key_record(keys.a, HOSTILE_ADDRESS, "k7", algorithm="ROT13"))
    # An address id no event can have (over 256 bytes): its key is refused, and the line that says so is short.
    huge_address = "em-" + "a" * 100_000
    kafka.produce(KEYS, huge_address, sudo_client.key_record(keys.a, huge_address, "k8", algorithm="ROT13"))
    # A job after them shows all were read.
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)) == 1
    assert svc.stop(signal.SIGTERM, timeout=60) == 0

    lines = [line for line in svc.proc.log_text().splitlines() if not line.startswith("$ ")]
    device_lines = [line for line in lines if "never match" in line]
    key_lines = sorted((line for line in lines if "address key rejected" in line), key=lambda line: "em-aaa" in line)
    skipped_lines = [line for line in lines if "does not match deviceId" in line]
    assert len(device_lines) == 1 and len(key_lines) == 2 and len(skipped_lines) == 1, "\n".join(lines[-40:])
    for line in lines:
        assert len(line.encode()) < 3_000, line[:300]
    for line in lines:
        assert "all events deleted" not in line or line in device_lines + key_lines + skipped_lines, f"forged: {line!r}"
        for raw in "\u202e\u2028\u007f\u200b":
            assert raw not in line, f"U+{ord(raw):04X} raw in {line!r}"
        if log_format == "json":
            json.loads(line)
        else:
            assert line[:4].isdigit(), f"a line that does not start with a time: {line!r}"
    if log_format == "json":
        # The escapes are JSON's: a log collector reads each id back exactly.
        assert json.loads(device_lines[0])["deviceId"] == HOSTILE_DEVICE
        assert json.loads(key_lines[0])["emailAddressId"] == HOSTILE_ADDRESS
        assert json.loads(key_lines[1])["emailAddressId"] == huge_address[:512] + "…"
    else:
        assert "deviceId=dev-\\u202etxt.exe\\u000a2026-01-01T00:00:00+0000 critical" in device_lines[0]
        assert "\\u2028\\u007f\\u200b" in device_lines[0]
        assert "emailAddressId=em-add-\\u202e7\\u000a2026" in key_lines[0]


def test_a_flood_of_bad_records_logs_a_few_lines_and_counts_every_one(world, kafka):
    svc = world.service()
    # A producer writing the wrong format to the events topic, and one registering devices under the wrong keys.
    bad_events, bad_devices = 3000, 300
    kafka.produce_many((EVENTS, f"em-add-{i % 7}", f"not json {i}".encode()) for i in range(bad_events))
    kafka.produce_many((DEVICES, f"dev-key-{i}", h.ios_device(f"dev-other-{i}")) for i in range(bad_devices))
    assert len(kafka.consume(DEAD, min_count=bad_events, timeout=120, idle=0.5)) == bad_events
    # Every one counted (the metrics summed over their labels: nothing else was published).
    h.wait_for(lambda: svc.metrics().get("mailpush_config_records_total") == bad_devices, 60, "every registration counted")
    assert svc.metrics()["mailpush_dead_letters_total"] == bad_events
    assert svc.stop(signal.SIGTERM, timeout=60) == 0

    lines = svc.proc.log_lines()

    def logged_and_summed(message: str, **kind) -> tuple[int, int]:
        logged = [line for line in lines if line["message"] == message]
        summaries = [line for line in lines if f'more "{message}" lines were not logged' in line["message"]]
        assert all(all(s.get(k) == v for k, v in kind.items()) for s in summaries), summaries
        return len(logged), sum(int(s["notLogged"]) for s in summaries)

    logged, summed = logged_and_summed("event dead-lettered", reason="invalid_json")
    # Ten lines a kind per ten seconds: the whole flood took well under a minute.
    assert 10 <= logged <= 60 and logged + summed == bad_events, (logged, summed)
    logged, summed = logged_and_summed("config record skipped; the previous registration stays in force",
                                       topic=DEVICES)
    assert 10 <= logged <= 60 and logged + summed == bad_devices, (logged, summed)
    assert len(lines) < 300, "the log stays short"
