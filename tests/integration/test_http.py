"""HTTP endpoints (§9): /healthz, /readyz, /metrics in Prometheus text format."""

from __future__ import annotations

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS

COUNTERS = ("mailpush_events_received_total", "mailpush_jobs_produced_total",
            "mailpush_dead_letters_total")


def test_health_ready_and_metrics(world, kafka, keys):
    svc = world.service()
    assert h.http_get(svc.port, "/healthz")[0] == 200
    assert h.http_get(svc.port, "/readyz")[0] == 200
    status, body = h.http_get(svc.port, "/metrics")
    assert status == 200
    for c in COUNTERS:
        assert c in body, f"/metrics lacks {c}"

    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    kafka.produce(EVENTS, "em-add-1", b"{oops")
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-2"))
    assert len(kafka.consume(JOBS, min_count=4, timeout=60, idle=0.5)) == 4
    assert len(kafka.consume(DEAD, min_count=1, timeout=30, idle=0.5)) == 1

    # Every event polled has its age at planning recorded, the one that is dead-lettered too.
    want = {"mailpush_events_received_total": 3, "mailpush_jobs_produced_total": 4,
            "mailpush_dead_letters_total": 1, "mailpush_event_age_at_planning_seconds_count": 3}
    last = {}

    def counters_match():
        last.clear()
        m = svc.metrics()
        last.update({k: m.get(k) for k in want})
        return all(last[k] == v for k, v in want.items())
    h.wait_for(counters_match, 15, "metric counters",
               on_fail=lambda: f"got {last}, expected {want}")
    assert h.http_get(svc.port, "/healthz")[0] == 200



def test_with_http_port_0_the_log_names_the_port_the_system_chose(bare_world, tmp_path):
    # `--http-port 0` is accepted and the system picks a free port, but the log said `"httpPort":"0"`: the
    # endpoints were there, and nobody could tell where.
    state = tmp_path / "state"
    proc = bare_world.spawn("run", [bare_world.bin, "run", "--state-dir", str(state), "--http-port", "0"])
    starting = h.wait_for(lambda: next((l for l in proc.log_lines() if l.get("message") == "starting"), None), 60,
                          "the starting line", on_fail=proc.log_tail)
    port = int(starting["httpPort"])
    assert port > 0, starting
    assert h.wait_for(lambda: h.http_get(port, "/healthz")[0] == 200, 30, "/healthz on the port named")
    proc.stop()
