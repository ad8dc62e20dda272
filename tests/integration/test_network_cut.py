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
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

import mailpush_harness as h
import sudo_client
from guarantees import assert_exactly_once
from mailpush_harness import DEAD, EVENTS, JOBS
from test_fleet import GROUP, Publisher, setup_config

STATE = "mailpush.state"


def sh(*argv: str, check: bool = True) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise h.HarnessError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}")


class CutOffHost:
    """A network namespace whose processes reach this namespace's 127.0.0.1 (TCP) through NAT over a veth pair.
    `cut()` drops everything they send from then on; `heal()` lets it through again."""

    def __init__(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"):
            pytest.skip("needs root, ip and iptables (make deps)")
        used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        k = next(n for n in [(os.getpid() + i) % 250 for i in range(250)] if f"10.77.{n}.1/" not in used)
        self.ns, self.outer, self.inner = f"mpcut{k}", f"mpco{k}", f"mpci{k}"
        self.outer_ip, self.address = f"10.77.{k}.1", f"10.77.{k}.2"
        self.nat = ["PREROUTING", "-i", self.outer, "-p", "tcp", "-d", self.outer_ip, "-j", "DNAT",
                    "--to-destination", "127.0.0.1"]
        self.drop = ["PREROUTING", "-i", self.outer, "-j", "DROP"]
        inside = ["ip", "netns", "exec", self.ns]
        self.close()  # what a killed earlier run of this process id left
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        sh("ip", "link", "set", self.inner, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.outer_ip}/30", "dev", self.outer)
        sh("ip", "link", "set", self.outer, "up")
        sh("ip", "-n", self.ns, "addr", "add", f"{self.address}/30", "dev", self.inner)
        sh("ip", "-n", self.ns, "link", "set", self.inner, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")
        # Packets to and from 127.0.0.1 may cross the pair only with route_localnet on both ends.
        sh("sysctl", "-qw", f"net.ipv4.conf.{self.outer}.route_localnet=1")
        sh("iptables", "-t", "nat", "-A", *self.nat)
        sh(*inside, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1")
        sh(*inside, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", "127.0.0.1", "-p", "tcp", "-j", "DNAT",
           "--to-destination", self.outer_ip)
        sh(*inside, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", self.inner, "-j", "MASQUERADE")

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns] + argv

    def cut(self) -> None:
        sh("iptables", "-t", "raw", "-I", *self.drop)

    def heal(self) -> None:
        sh("iptables", "-t", "raw", "-D", *self.drop)

    def close(self) -> None:
        sh("iptables", "-t", "raw", "-D", *self.drop, check=False)
        sh("iptables", "-t", "nat", "-D", *self.nat, check=False)
        sh("ip", "link", "del", self.outer, check=False)
        sh("ip", "netns", "del", self.ns, check=False)


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


def test_a_member_cut_off_while_writing_has_nothing_land_once_the_network_heals(request, tmp_path, keys):
    host = CutOffHost()
    request.addfinalizer(host.close)
    import conftest
    world = conftest._new_world(request, tmp_path, broker=True, partitions=12)
    kafka = world.kafka
    addrs = setup_config(kafka, keys)
    port = h.free_port()
    cut_off = world.spawn("cut-off", host.argv([world.bin, "run", "--brokers", world.bootstrap, "--state-dir",
                                                str(tmp_path / "state-cut-off"), "--http-port", str(port)] + GROUP))

    def owned_by_cut_off() -> int:
        try:
            with urllib.request.urlopen(f"http://{host.address}:{port}/metrics", timeout=2) as response:
                return int(h.parse_metrics(response.read().decode()).get("mailpush_owned_partitions", 0))
        except OSError:
            return -1

    h.wait_for(lambda: owned_by_cut_off() == 12, 60, "the member in its own namespace owning every partition",
               on_fail=cut_off.log_tail)
    publisher = Publisher(kafka, addrs, rate=50)
    publisher.start()
    other = world.service(args=GROUP, name="other")
    h.wait_for(lambda: 0 < owned_by_cut_off() < 12 and owned_by_cut_off() + other.metrics()["mailpush_owned_partitions"] == 12,
               90, "the two members sharing the partitions", on_fail=lambda: cut_off.log_tail() + other.proc.log_tail())
    # A burst keeps the cut-off member writing jobs and state records at the moment of the cut.
    burst = []
    for i in range(3000):
        addr = addrs[i % len(addrs)]
        owner = int(addr.split("-")[-1]) % 8
        burst.append((EVENTS, addr, h.event(f"burst-{i}", addr, owner=f"user-{owner}")))
        publisher.expected.add(sudo_client.job_id(addr, f"burst-{i}", f"dev-{owner}"))
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
    assert "state records not written: the lease of their partitions ended" in cut_off.log_text(), \
        "the cut did not land while the member was writing a batch: the test proved nothing\n" + cut_off.log_tail()
    late = late_records(kafka, cut_ms)
    assert not late, f"{len(late)} records the cut-off member wrote landed after the heal:\n" + "\n".join(late[:10])
    assert_exactly_once(kafka, publisher.expected, timeout=120, idle=3)
    assert other.stop() == 0
    assert cut_off.stop() == 0
