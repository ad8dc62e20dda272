"""Broker faults (CONTRACT §8, issue 3): the service retries with backoff, reports unready, never drops
or duplicates a job, and recovers by itself. Faults come from the devbroker's --control-stdin."""

from __future__ import annotations

import collections
import re
import time

import pytest

import mailpush_harness as h
import sudo_client
from guarantees import DEVICE_IDS, assert_exactly_once, publish, register
from mailpush_harness import DEAD, EVENTS, JOBS

# librdkafka API keys and broker error codes used below.
PRODUCE, LIST_OFFSETS, METADATA = 0, 2, 3
REQUEST_TIMED_OUT, NOT_LEADER, MESSAGE_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED = 7, 6, 10, 29


# The devbroker's injected errors hit whichever produce request comes next, from any client. These tests aim them
# at the service's outputs, so the service must be the only producer and its outputs its only records: static
# ownership, which writes no state records (a group member's claims would take the errors first).
ONLY_OUTPUTS_PRODUCED = ["--instance", "0", "--instances", "1"]


@pytest.fixture
def faulty(bare_world):
    bare_world.devbroker(control=True)
    return bare_world

def rejected_dead_letters(svc) -> float:
    """mailpush_dead_letters_total{reason="rejected"} (parse_metrics sums over labels)."""
    body = h.http_get(svc.port, "/metrics")[1]
    m = re.search(r'^mailpush_dead_letters_total\{[^}]*reason="rejected"[^}]*\} (\S+)$', body, re.M)
    return float(m.group(1)) if m else 0.0



def received(svc) -> float:
    """Events the service has read so far; 0 while its HTTP endpoint is not up yet."""
    try:
        return svc.metrics().get("mailpush_events_received_total", 0)
    except h.HarnessError:
        return 0


def inject(world, command: str) -> None:
    world.control(command)


def test_produce_errors_retried_and_a_refused_request_becomes_dead_letters(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    expected = publish(kafka, "errors", 300)
    # Injected errors hit whichever client asks next: inject them while mailpush is the only one producing.
    # Retriable errors are retried inside librdkafka. MESSAGE_TOO_LARGE is permanent: producing the same
    # records again can only fail again (issue 9), so the jobs of that request are not retried; their
    # events become dead letters naming the device and the reason.
    inject(faulty, f"errors {PRODUCE} {REQUEST_TIMED_OUT} {NOT_LEADER} {MESSAGE_TOO_LARGE} {REQUEST_TIMED_OUT}")
    svc = faulty.service(args=ONLY_OUTPUTS_PRODUCED)
    h.wait_for(lambda: received(svc) >= 300, 120, "all events processed")

    dead = kafka.consume(DEAD, min_count=1, timeout=60, idle=1.5)
    sources = collections.Counter(r.headers.get("mailpush-source") for r in dead)
    assert dead, "the refused request's events became no dead letter"
    assert max(sources.values()) == 1, f"a dead letter written twice: {sources.most_common(2)}"
    refused_jobs = set()
    for r in dead:
        error = r.headers.get("mailpush-error", "")
        m = re.fullmatch(r"push job for device (dev-ios-1|dev-android-1) rejected by the broker: message too large"
                         r"( \(and 1 more jobs of this email\))?", error)
        assert m, f"dead letter reason {error!r}"
        message_id = r.json()["messageId"]
        refused_jobs |= {sudo_client.job_id("em-add-1", message_id, d) for d in DEVICE_IDS}
    # Every other job exactly once; a refused event's other job at most once (never twice, never invented).
    jobs = kafka.consume(JOBS, min_count=len(expected - refused_jobs), timeout=120, idle=1.5)
    counts = collections.Counter(r.headers.get("mailpush-job-id") for r in jobs)
    assert not {j for j, n in counts.items() if n > 1}, "a job written twice"
    assert set(counts) <= expected, "a job nobody expected"
    assert expected - refused_jobs <= set(counts), f"missing {sorted(expected - refused_jobs - set(counts))[:3]}"
    assert rejected_dead_letters(svc) == len(dead)
    svc.assert_alive()


def test_topic_authorization_failure_on_both_topics_stops_with_70(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    first = kafka.produce(EVENTS, "em-add-1", h.event("refused-0"))
    # mailpush is the only producer from here on: its jobs and then its dead letter are refused.
    # Three: the two jobs may go out in one produce request or in two; the dead letter follows them.
    inject(faulty, f"errors {PRODUCE} {TOPIC_AUTHORIZATION_FAILED} {TOPIC_AUTHORIZATION_FAILED} {TOPIC_AUTHORIZATION_FAILED}")
    svc = faulty.service(args=ONLY_OUTPUTS_PRODUCED, wait_ready=False)
    code = svc.proc.wait(60)
    assert code == 70, f"expected exit 70, got {code}\n{svc.proc.log_tail()}"
    log = svc.proc.log_text()
    assert f"the dead letter for {first.pos} cannot be written" in log, svc.proc.log_tail()
    assert "not authorized to write the topic" in log


def test_a_state_topic_this_client_may_not_use_stops_the_service_with_a_message_naming_it(faulty, keys):
    # An ACL missing for the state topic is the operator's to fix: retrying cannot help, so the service must not
    # retry it forever (it used to exit 70, "internal error"; retried at run time, it would have looped).
    inject(faulty, "topic-error mailpush.state 29")
    svc = faulty.service(wait_ready=False)
    code = svc.proc.wait(60)
    assert code == 64, f"expected exit 64 (configuration), got {code}\n{svc.proc.log_tail()}"
    log = svc.proc.log_text()
    assert "Kafka refused access" in log and "mailpush.state" in log and "ACLs" in log, svc.proc.log_tail()


def test_broker_down_then_up_reports_unready_and_recovers(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    svc = faulty.service()
    expected = publish(kafka, "before", 50)
    assert_exactly_once(kafka, expected)

    inject(faulty, "down 1")
    h.wait_for(lambda: h.http_get(svc.port, "/readyz")[0] == 503, 60, "/readyz 503 while the broker is down")
    time.sleep(2)
    svc.assert_alive()
    inject(faulty, "up 1")
    h.wait_for(lambda: h.http_get(svc.port, "/readyz")[0] == 200, 90, "/readyz 200 after the broker is back")
    expected |= publish(kafka, "after", 50)
    assert_exactly_once(kafka, expected)
    svc.assert_alive()


def test_slow_broker_still_exactly_once(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    svc = faulty.service()
    inject(faulty, "rtt 1 400")
    expected = publish(kafka, "slow", 100)
    assert_exactly_once(kafka, expected, timeout=180)
    inject(faulty, "rtt 1 0")
    svc.assert_alive()


def test_offset_and_metadata_errors_are_ridden_out(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    expected = publish(kafka, "lo", 100)
    inject(faulty, f"errors {LIST_OFFSETS} {NOT_LEADER} {NOT_LEADER} {REQUEST_TIMED_OUT} {NOT_LEADER}")
    inject(faulty, f"errors {METADATA} {REQUEST_TIMED_OUT} {REQUEST_TIMED_OUT}")
    svc = faulty.service(wait_ready=False)
    h.wait_for(lambda: received(svc) >= 100, 120, "all events processed")
    assert_exactly_once(kafka, expected)
    h.wait_for(lambda: h.http_get(svc.port, "/readyz")[0] == 200, 60, "/readyz 200 after the errors")
    svc.assert_alive()


def test_a_takeover_that_fails_is_retried_not_dropped(faulty, keys):
    """Errors that reach the takeover of newly assigned partitions (reading their state) are retried until the
    partitions are processed. Before, the assignment was taken from the group's news and then lost with the
    error: the partitions stayed unprocessed until the next rebalance."""
    kafka = faulty.kafka
    register(kafka, keys)
    expected = publish(kafka, "takeover", 60)
    svc = faulty.service(wait_ready=False)
    # Start-up done, the group's first join under way (about 3 s): the next offsets lookups are the takeover's.
    h.wait_for(lambda: "joining the consumer group" in svc.proc.log_text(), 30, "the service joining its group",
               on_fail=svc.proc.log_tail)
    inject(faulty, f"errors {LIST_OFFSETS} " + " ".join([str(NOT_LEADER), str(REQUEST_TIMED_OUT)] * 4))
    h.wait_for(lambda: received(svc) >= 60, 60, "every event processed", on_fail=svc.proc.log_tail)
    assert_exactly_once(kafka, expected)
    h.wait_for(lambda: h.http_get(svc.port, "/readyz")[0] == 200, 30, "/readyz 200 after the errors")
    assert "acting on a rebalance" in svc.proc.log_text(), "the injected errors reached the takeover"
    svc.assert_alive()


def test_produce_timeouts_while_events_stream_in_lose_no_job(faulty, keys):
    """The development broker checks no sequence numbers of an idempotent producer. With librdkafka's five
    requests in flight, a request answered REQUEST_TIMED_OUT while later ones of the same partition were in
    flight was reported delivered although its records never reached the log: 15, 17 and 19 of 3,600 jobs missing
    in three runs of this test with `-X max.in.flight=5`, without an error or a retry. The service keeps one
    request in flight on the development broker; this test holds it to that."""
    kafka = faulty.kafka
    register(kafka, keys)
    svc = faulty.service(args=ONLY_OUTPUTS_PRODUCED)
    expected = set()
    # One key, so every event's two jobs go to the same two partitions: requests for a partition follow each
    # other closely, and the next batch writes ahead while this one's requests are in flight.
    for burst in range(60):
        expected |= publish(kafka, f"stream-{burst}", 30)
        if burst % 3 == 1:
            inject(faulty, f"errors {PRODUCE} {REQUEST_TIMED_OUT}")
        time.sleep(0.05)
    assert_exactly_once(kafka, expected)
    svc.assert_alive()


def test_outputs_that_never_left_the_producer_are_produced_again_at_once(faulty, keys):
    """An output that timed out in librdkafka's own queue never reached the broker: it is produced again at once,
    without the pause and the read-back of the output topics that an output which may have landed needs. Those two,
    paid round after round, kept a saturated group member's next outputs timing out in the queue in turn
    (docs/performance.md, session 50). The broker answers slowly for a while with outputs queued; the message timeout is
    shortened so that they time out while it is slow."""
    kafka = faulty.kafka
    register(kafka, keys)
    svc = faulty.service(args=ONLY_OUTPUTS_PRODUCED + ["-X", "message.timeout.ms=1000"])
    expected = publish(kafka, "before", 20)
    assert_exactly_once(kafka, expected)
    # Each request takes 2 s: the one in flight may land after its output timed out (read back before producing it
    # again), the outputs queued behind it (one request in flight on the development broker) never leave.
    inject(faulty, "rtt 1 2000")
    for burst in range(20):
        expected |= publish(kafka, f"queued-{burst}", 5)
        time.sleep(0.3)
    inject(faulty, "rtt 1 0")
    expected |= publish(kafka, "after", 20)
    assert_exactly_once(kafka, expected, timeout=120)
    resent = [line for line in svc.proc.log_lines() if line.get("message") == "producing again outputs that never left the producer"]
    assert resent, "no output was produced again at once after timing out in the producer's queue"
    # Timed out in the queue, or purged from it when a failed round settled the producer before reading back.
    assert all(re.search(r"_MSG_TIMED_OUT|_PURGE_QUEUE", line.get("error", "")) for line in resent), resent
    svc.assert_alive()
