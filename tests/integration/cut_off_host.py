"""A network namespace to run a `mailpush run` in, whose network can be cut off and healed (test_network_cut.py,
`chaos.py --fleet N --cuts`).

The development broker listens on 127.0.0.1; NAT takes the namespace's TCP connections to 127.0.0.1 across a veth
pair to this namespace's 127.0.0.1, and this namespace reaches the service's HTTP port at `address`. The cut drops
every packet the namespace sends, as a network partition does: nothing is refused and nothing arrives, and the
namespace's kernel keeps retransmitting what was not acknowledged until the cut heals. Needs root, `ip` and
`iptables`."""
from __future__ import annotations

import os
import shutil
import subprocess

import mailpush_harness as h


def sh(*argv: str, check: bool = True) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise h.HarnessError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}")


class CutOffHost:
    """A network namespace whose processes reach this namespace's 127.0.0.1 (TCP) through NAT over a veth pair.
    `cut()` drops everything they send from then on; `heal()` lets it through again."""

    def __init__(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"):
            raise h.HarnessError("a network namespace needs root, ip and iptables (make deps installs them)")
        used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        k = next(n for n in [(os.getpid() + i) % 250 for i in range(250)] if f"10.77.{n}.1/" not in used)
        self.ns, self.outer, self.inner = f"mpcut{k}", f"mpco{k}", f"mpci{k}"
        self.outer_ip, self.address = f"10.77.{k}.1", f"10.77.{k}.2"
        self.nat = ["PREROUTING", "-i", self.outer, "-p", "tcp", "-d", self.outer_ip, "-j", "DNAT",
                    "--to-destination", "127.0.0.1"]
        self.drop = ["PREROUTING", "-i", self.outer, "-j", "DROP"]
        inside = ["ip", "netns", "exec", self.ns]
        self.close()  # a namespace or rule of this name that a run killed half way left
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
