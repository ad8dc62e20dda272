"""The black-box tests' HTTP ports come from below the kernel's ephemeral range: a port from `bind(0)` could be
taken by any outgoing connection (every Kafka client makes some) before the service under test binds it."""
import socket

import mailpush_harness as h


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound():
    low, _ = h.ephemeral_port_range()
    ports = {h.free_port() for _ in range(50)}
    assert all(10_000 <= port < low for port in ports), sorted(ports)
    assert len(ports) > 40, "picks are spread, so that tests side by side do not pick the same port"
    for port in list(ports)[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
