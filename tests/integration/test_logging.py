"""Logs (issue 4): structured JSON lines, and never a secret, token or email content, even at trace."""

from __future__ import annotations

import json
import signal

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
