"""A member cut off from the network (§8.1): not a crash and not a pause, a partition between it and the brokers.

Its kernel keeps what the brokers have not acknowledged and retransmits it for up to about 100 s, also after
librdkafka has given the request up and closed the connection. A network that heals after another member took the
partitions over would then deliver records the cut-off member wrote before the cut, after the new owner's own:
jobs written twice, state records out of place. The member's producers close their connections with a reset, which
discards those bytes.

The member runs in a network namespace of its own, joined to this one by a veth pair; NAT takes its connections
to the development broker (which listens on 127.0.0.1 here) across the pair, and the cut drops every packet it
sends, as a partition does: nothing is refused, nothing arrives. Needs root, `ip` and `iptables` (`make deps`
installs them)."""
from __future__ import annotations

import collections
import time

import pytest

import mailpush_harness as h
from cut_off_host import CutOffHost
from guarantees import assert_exactly_once
from mailpush_harness import DEAD, EVENTS, JOBS
from test_fleet import GROUP, Publisher, email, owned, setup_config

STATE = "mailpush.state"


def late_records(kafka, cut_ms: int) -> list[str]:
    """Records created before the cut's first 2 s were over that lie after a record created 4 s or more after the
    cut, in every topic mailpush writes. Nothing the cut-off member sends arrives during the cut, and it writes
    nothing once its lease has run out (1 s); the other member writes only after it took the partitions over,
    at least a session timeout (6 s) after the cut. So these are what the cut-off member sent before the cut and
    the network delivered once it healed."""
    late = []
    for topic in (JOBS, DEAD, STATE):
        newest: dict[int, int] = collections.defaultdict(int)
        for r in sorted(kafka.consume(topic, timeout=60, idle=1.5), key=lambda r: (r.partition, r.offset)):
            if r.timestamp_ms < cut_ms + 2000 and newest[r.partition] >= cut_ms + 4000:
                late.append(f"{r.pos} created {(r.timestamp_ms - cut_ms) / 1000:+.1f} s from the cut, after one "
                            f"created {(newest[r.partition] - cut_ms) / 1000:+.1f} s from it")
            newest[r.partition] = max(newest[r.partition], r.timestamp_ms)
    return late


@pytest.mark.runs_for(65)
def test_a_member_cut_off_while_writing_has_nothing_land_once_the_network_heals(request, tmp_path, keys):
    try:
        host = CutOffHost()
    except h.HarnessError as e:
        pytest.skip(str(e))
    request.addfinalizer(host.close)
    import conftest
    world = conftest._new_world(request, tmp_path, broker=True, partitions=12)
    kafka = world.kafka
    addrs = setup_config(kafka, keys)
    cut_off = world.service(args=GROUP, name="cut-off", host=host)

    h.wait_for(lambda: owned(cut_off) == 12, 60, "the member in its own namespace owning every partition",
               on_fail=cut_off.proc.log_tail)
    publisher = Publisher(kafka, addrs, rate=50)
    publisher.start()
    other = world.service(args=GROUP, name="other")
    h.wait_for(lambda: 0 < owned(cut_off) < 12 and owned(cut_off) + owned(other) == 12, 90,
               "the two members sharing the partitions", on_fail=lambda: cut_off.proc.log_tail() + other.proc.log_tail())
    # A burst keeps the cut-off member writing jobs and state records at the moment of the cut.
    burst = []
    for i in range(3000):
        addr = addrs[i % len(addrs)]
        event, job = email(addr, f"burst-{i}")
        burst.append((EVENTS, addr, event))
        publisher.expected.add(job)
    kafka.produce_many(burst)
    cut_ms = int(time.time() * 1000)
    host.cut()
    h.wait_for(lambda: other.metrics()["mailpush_owned_partitions"] == 12, 60,
               "the other member taking over every partition", on_fail=other.proc.log_tail)
    # The kernel retransmits at 0.2 s × (2^n − 1) after a send, the last of them 25.6 and 51 s after: healed
    # at 20 s, bytes kept from the cut arrive within seconds.
    time.sleep(max(0.0, cut_ms / 1000 + 20 - time.time()))
    host.heal()
    time.sleep(15)
    publisher.stop()
    assert "state records not written: the lease of their partitions ended" in cut_off.proc.log_text(), \
        "the cut did not land while the member was writing a batch: the test proved nothing\n" + cut_off.proc.log_tail()
    late = late_records(kafka, cut_ms)
    assert not late, f"{len(late)} records the cut-off member wrote landed after the heal:\n" + "\n".join(late[:10])
    assert_exactly_once(kafka, publisher.expected, timeout=120, idle=3)
    assert other.stop() == 0
    assert cut_off.stop() == 0
