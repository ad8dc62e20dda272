"""Broker faults (CONTRACT §8, issue 3): the service retries with backoff, reports unready, never drops
or duplicates a job, and recovers by itself. Faults come from the devbroker's --control-stdin."""

from __future__ import annotations

import time

import pytest

import mailpush_harness as h
from guarantees import assert_exactly_once, publish, register

# librdkafka API keys and broker error codes used below.
PRODUCE, LIST_OFFSETS, METADATA = 0, 2, 3
REQUEST_TIMED_OUT, NOT_LEADER, MESSAGE_TOO_LARGE = 7, 6, 10


@pytest.fixture
def faulty(bare_world):
    bare_world.devbroker(control=True)
    return bare_world


def received(svc) -> float:
    """Events the service has read so far; 0 while its HTTP endpoint is not up yet."""
    try:
        return svc.metrics().get("mailpush_events_received_total", 0)
    except h.HarnessError:
        return 0


def inject(world, command: str) -> None:
    world.broker_proc.tell(command)


def test_produce_errors_are_retried_without_duplicates(faulty, keys):
    kafka = faulty.kafka
    register(kafka, keys)
    expected = publish(kafka, "errors", 300)
    # Injected errors hit whichever client asks next: inject them while mailpush is the only one producing.
    # Retriable errors are retried inside librdkafka; the permanent one fails a delivery, and the service
    # must read the output back before producing again.
    inject(faulty, f"errors {PRODUCE} {REQUEST_TIMED_OUT} {NOT_LEADER} {MESSAGE_TOO_LARGE} {REQUEST_TIMED_OUT}")
    svc = faulty.service()
    h.wait_for(lambda: received(svc) >= 300, 120, "all events processed")
    assert svc.metrics().get("mailpush_delivery_retries_total", 0) >= 1, "the permanent error was retried by mailpush"
    assert_exactly_once(kafka, expected)
    svc.assert_alive()


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
