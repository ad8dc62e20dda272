"""Healing with default settings (§8.1 "Restarts heal in seconds", "Ready means working"): how long after a start,
a restart or the loss of a fleet member an event published right then, on every event partition, becomes a job.

Every service here runs with no ownership or group-timing flag: what a user gets. The bounds are the issue's
goals on the development broker, whose group rounds are slow by design (its first join takes about 3 s, every
later rebalance round waits session timeout - 1 s); docs/operations.md ("Group timing") has the arithmetic."""

from __future__ import annotations

import signal
import time

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEVICES, EVENTS, JOBS, KEYS


def setup(kafka, keys):
    kafka.produce(DEVICES, "dev-1", h.ios_device("dev-1", owner="user-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1", owner="user-1"))


class Probe:
    """Publishes one event on every event partition and tells how long after a moment each became a job (the
    job's CreateTime, stamped by mailpush's producer, so that the reader's own pace does not count)."""

    def __init__(self, kafka):
        self.kafka = kafka
        self.partitions = kafka.partitions(EVENTS)
        self.n = 0

    def heal_seconds(self, since: float, timeout: float = 90) -> float:
        """Publishes the events now; the seconds from `since` (time.time()) until the last of them is a job."""
        wanted = set()
        for p in self.partitions:
            self.n += 1
            mid = f"probe-{self.n}"
            self.kafka._producer.produce(EVENTS, key=b"em-add-1", value=h.encode_value(h.event(mid, "em-add-1")),
                                         partition=p)
            wanted.add(sudo_client.job_id("em-add-1", mid, "dev-1"))
        self.kafka._producer.flush(10)
        jobs = self.kafka.consume(JOBS, timeout=timeout, idle=0.2,
                                  until=lambda rs: wanted <= {r.headers.get("mailpush-job-id") for r in rs})
        found = {r.headers.get("mailpush-job-id"): r.timestamp_ms for r in jobs}
        missing = wanted - set(found)
        assert not missing, f"{len(missing)} probe events got no job within {timeout} s"
        return max(found[j] for j in wanted) / 1000 - since


def test_a_first_start_and_restarts_heal_in_seconds(world, kafka, keys):
    setup(kafka, keys)
    probe = Probe(kafka)
    started = time.time()
    svc = world.service(wait_ready=False)
    first = probe.heal_seconds(started)
    assert first <= 3.5, f"first start: every partition processed {first:.2f} s after the start\n{svc.proc.log_tail()}"
    svc.wait_ready(10)

    svc.stop(signal.SIGTERM)
    stopped = time.time()
    svc = svc.restart(wait_ready=False)
    term = probe.heal_seconds(stopped)
    assert term <= 6, f"restart after SIGTERM: {term:.2f} s\n{svc.proc.log_tail()}"
    svc.wait_ready(10)

    svc.kill()
    killed = time.time()
    svc = svc.restart(wait_ready=False)
    kill = probe.heal_seconds(killed)
    # The group keeps the killed member until its session ends, then runs a round (11-12 s on the development
    # broker): the restarted instance resumes the partitions it held at once instead of waiting for that.
    assert kill <= 6, f"restart after SIGKILL: {kill:.2f} s\n{svc.proc.log_tail()}"
    # Ready means joined as well: the group hands the partitions back once the killed member's session ended.
    svc.wait_ready(30)
    print(f"heal: first start {first:.2f} s, restart after SIGTERM {term:.2f} s, after SIGKILL {kill:.2f} s")


def test_a_fleet_of_two_heals_when_a_member_stops_or_dies(world, kafka, keys):
    setup(kafka, keys)
    probe = Probe(kafka)
    a = world.service(name="a")
    b = world.service(name="b")
    h.wait_for(lambda: a.metrics().get("mailpush_owned_partitions") == 2 == b.metrics().get("mailpush_owned_partitions")
               and h.http_get(a.port, "/readyz")[0] == 200 == h.http_get(b.port, "/readyz")[0], 60,
               "two members owning two partitions each")
    probe.heal_seconds(time.time())

    a.stop(signal.SIGTERM)
    stopped = time.time()
    term = probe.heal_seconds(stopped)
    assert term <= 6, f"a member stopped: the other processes its partitions {term:.2f} s later\n{b.proc.log_tail()}"

    c = world.service(name="c")
    h.wait_for(lambda: b.metrics().get("mailpush_owned_partitions") == 2 == c.metrics().get("mailpush_owned_partitions")
               and h.http_get(b.port, "/readyz")[0] == 200 == h.http_get(c.port, "/readyz")[0], 60,
               "two members owning two partitions each again")
    probe.heal_seconds(time.time())
    c.kill()
    killed = time.time()
    kill = probe.heal_seconds(killed)
    assert kill <= 15, f"a member killed: the other processes its partitions {kill:.2f} s later\n{b.proc.log_tail()}"
    print(f"fleet heal: after SIGTERM {term:.2f} s, after SIGKILL {kill:.2f} s")


def partitions_in(svc, phase: str) -> float:
    """`mailpush_event_partitions{phase=...}` (parse_metrics sums over labels)."""
    import re
    m = re.search(r'^mailpush_event_partitions\{phase="%s"\} (\S+)$' % phase, h.http_get(svc.port, "/metrics")[1], re.M)
    return float(m.group(1)) if m else -1


def readyz(svc) -> tuple[int, str]:
    try:
        return h.http_get(svc.port, "/readyz", timeout=2)
    except Exception as e:  # noqa: BLE001 - not listening yet
        return 0, str(e)


def test_ready_means_joined_and_every_assigned_partition_processing(world, kafka, keys):
    setup(kafka, keys)
    # A member is not ready while it joins: the development broker's first join takes about 3 s.
    svc = world.service(wait_ready=False)
    seen = []
    h.wait_for(lambda: seen.append(readyz(svc)) or seen[-1][0] == 200, 30, "/readyz 200")
    waiting = [body for status, body in seen if status == 503]
    assert any("joining the consumer group" in body for body in waiting), seen[:5]
    assert "processing event partitions [0, 1, 2, 3]" in seen[-1][1], seen[-1]
    assert partitions_in(svc, "processing") == 4
    assert svc.metrics()["mailpush_group_joined"] == 1

    # Four partitions, five members: one is assigned none, and is ready all the same.
    others = [world.service(name=f"m{n}", wait_ready=False) for n in range(4)]
    members = [svc] + others
    h.wait_for(lambda: all(readyz(m)[0] == 200 for m in members)
               and sorted(m.metrics().get("mailpush_owned_partitions", -1) for m in members) == [0, 1, 1, 1, 1],
               90, "five ready members, one of them with no partition",
               on_fail=lambda: "\n".join(f"{readyz(m)}" for m in members))
    idle = [m for m in members if m.metrics().get("mailpush_owned_partitions") == 0]
    assert "the group assigned no event partition" in readyz(idle[0])[1]

    # A member that takes over a killed member's partition waits out the lease, not ready, and says so.
    for m in others:
        if m is not idle[0]:
            m.stop(signal.SIGTERM)
    survivors = [m for m in members if m.proc.alive()]
    h.wait_for(lambda: sum(m.metrics().get("mailpush_owned_partitions", 0) for m in survivors) == 4
               and all(readyz(m)[0] == 200 for m in survivors), 60, "two members owning every partition")
    victim, heir = (svc, idle[0]) if svc.metrics().get("mailpush_owned_partitions") else (idle[0], svc)
    victim.kill()
    states = []

    def taken_over():
        status, body = readyz(heir)
        states.append((status, body, partitions_in(heir, "waiting_for_lease")))
        return heir.metrics().get("mailpush_owned_partitions") == 4 and status == 200
    h.wait_for(taken_over, 60, "the heir owning every partition, ready", interval=0.05)
    waits = [s for s in states if s[0] == 503 and "waiting_for_lease" in s[1]]
    assert waits, f"the heir never said it waits out the previous owner's lease: {states[-5:]}"
    assert any(w[2] > 0 for w in waits), "mailpush_event_partitions{phase=\"waiting_for_lease\"} said so too"
