"""Many registered devices: publish them fast, then time `mailpush run` from start to ready and read
its peak RSS. Used by test_directory_scale.py and by bench/directory_scale.py (the 1M-device run)."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import mailpush_harness as h
import sudo_client

def owner_of(index: int, per_owner: int) -> str:
    return f"owner-{index // per_owner}"


_FILTERS = [json.dumps(h.init_filter(android=android), separators=(",", ":")) for android in (False, True)]


def device_value(index: int, per_owner: int) -> bytes:
    """A registration like the Sudo SDK's: two filter items (one DISABLE, one ENABLE)."""
    android = index % 2
    return (f'{{"deviceId":"dev-{index}","owner":"{owner_of(index, per_owner)}","bundleId":"com.example.mail",'
            f'"platform":"{"android" if android else "ios"}",'
            f'"pushToken":"token-{index:012d}-0123456789abcdef0123456789abcdef","filter":{_FILTERS[android]}}}').encode()


def address_of(owner_index: int) -> str:
    return f"em-add-{owner_index}"


def publish(bootstrap: str, devices: int, per_owner: int, keyed_owners: int, private_key) -> float:
    """Publishes `devices` registrations and one address key for each of the first `keyed_owners`
    owners; returns the seconds it took (acknowledged by the broker)."""
    started = time.monotonic()
    devices_items = ((h.DEVICES, f"dev-{i}".encode(), device_value(i, per_owner), None) for i in range(devices))
    keys_items = ((h.KEYS, address_of(o).encode(),
                   json.dumps(sudo_client.key_record(private_key, address_of(o), "k1", owner=f"owner-{o}")).encode(), None)
                  for o in range(keyed_owners))
    h.publish_fast(bootstrap, itertools.chain(devices_items, keys_items), timeout=600)
    return time.monotonic() - started


@dataclass
class StartMeasure:
    #: Until /readyz answered 200. In a consumer group (the default) that includes the group's join, which the
    #: development broker holds for about 3 s after a member restarts (librdkafka's mock has no static membership).
    seconds_to_ready: float
    peak_rss_mb: float
    state_file_mb: float
    #: CPU time the service used up to ready (on a loaded machine, wall time says little).
    cpu_seconds_to_ready: float = 0.0
    #: Until the service logged that it processes events: its partitions resumed from the local state (a group
    #: member does this before its join, unless another owner claimed them since) or taken over, or, with static
    #: ownership, ready. What a restart costs the service itself.
    seconds_to_processing: float = float("nan")


def processing_logged(log: str) -> bool:
    """Whether the service's log says it processes events: a group member's partitions resumed or taken over, or,
    with static ownership (`"ownership":"static, …"`), readiness. A group member logs "ready" too, before its
    join, while it may own nothing yet."""
    if '"message":"processing taken-over event partitions"' in log:
        return True
    static = any('"message":"state loaded"' in line and '"ownership":"static, ' in line for line in log.splitlines())
    return static and '"message":"ready"' in log


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise h.HarnessError(f"no VmHWM for pid {pid}")


def start_and_measure(world: h.World, state_dir: Path, settle: float = 1.0,
                      ready_timeout: float = 600) -> tuple[h.Service, StartMeasure]:
    """Starts `mailpush run` on `state_dir`, times it to the first 200 of /readyz and to its log's first line
    that says it processes events (both polled every 20 ms), and reads its peak RSS `settle` seconds later."""
    started = time.monotonic()
    service = world.service(state_dir=state_dir, wait_ready=False)
    processing = float("nan")
    deadline = started + ready_timeout
    while True:
        service.assert_alive()
        if math.isnan(processing) and processing_logged(service.proc.log_text()):
            processing = time.monotonic() - started
        try:
            if h.http_get(service.port, "/readyz", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise h.HarnessError(f"not ready within {ready_timeout}s\n{service.proc.log_tail()}")
        time.sleep(0.02)
    ready = time.monotonic() - started
    if math.isnan(processing) and processing_logged(service.proc.log_text()):
        processing = ready
    cpu = cpu_seconds(service.proc.pid)
    time.sleep(settle)
    rss = peak_rss_mb(service.proc.pid)
    size = sum(f.stat().st_size for f in Path(state_dir).glob("mailpush.sqlite*")) / 1e6
    return service, StartMeasure(ready, rss, size, cpu, processing)


def events_reach_devices(world: h.World, owners: list[int], per_owner: int, timeout: float = 120) -> float:
    """Publishes one email for each owner in `owners` (all keyed) and waits for a job per device;
    returns the seconds it took. Fails unless exactly the expected jobs arrive."""
    kafka = world.kafka
    expected = set()
    started = time.monotonic()
    tag = f"{time.time_ns()}"
    items = []
    for o in owners:
        message = f"msg-{tag}-{o}"
        items.append((h.EVENTS, address_of(o), h.event(message, address=address_of(o), owner=f"owner-{o}")))
        for d in range(o * per_owner, (o + 1) * per_owner):
            expected.add(sudo_client.job_id(address_of(o), message, f"dev-{d}"))
    kafka.produce_many(items)
    # The topic holds earlier runs' jobs too: wait for these ones.
    jobs = kafka.consume(h.JOBS, timeout=timeout, idle=0.5, until=lambda recs: expected <= set(h.job_ids(recs)))
    missing = expected - set(h.job_ids(jobs))
    if missing:
        raise h.HarnessError(f"{len(missing)} of {len(expected)} jobs missing, e.g. {sorted(missing)[:3]}")
    return time.monotonic() - started


def stop(service: h.Service) -> None:
    rc = service.proc.stop(signal.SIGTERM, timeout=60)
    if rc != 0:
        raise h.HarnessError(f"mailpush run exited {rc}\n{service.proc.log_tail()}")
