#!/usr/bin/env python3
"""A soak: one `mailpush run` with default settings under a steady load for many minutes, its memory sampled.

What a benchmark of seconds cannot show: memory that grows with time. The service runs on its own development
broker (16 partitions a topic; 500 owners × 3 devices); events are published at `--rate` per second, and every 30 s
some registrations are published again (config churn) and a few events for addresses with no device (the path of
events that need nothing). After each 30 s the service's RSS, peak RSS, CPU and state file sizes are printed.

Expect RSS to rise while the SQLite page cache fills (64 MB at most, the writer's `cache_size`: the dedupe window's
rows grow the state file by about 100 bytes per email) and then to stay flat. The verdict compares the last third
of the samples with the middle third: growth of more than 5% there is reported as `GROWING` (exit 1).

    python3 bench/soak.py --bin .build/release/mailpush --minutes 12 --rate 1500
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

OWNERS, DEVICES_PER_OWNER, PARTITIONS, CHUNK_SECONDS = 500, 3, 16, 30


def http_port(log: Path) -> int | None:
    for line in log.read_text(errors="replace").splitlines():
        if (m := re.search(r'"httpPort":"(\d+)"', line)) and m.group(1) != "0":
            return int(m.group(1))
    return None


def wait_ready(log: Path, timeout: float = 90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            port = http_port(log)
            if port and urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the service was not ready within {timeout:.0f} s; see {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="the mailpush binary (a release build)")
    parser.add_argument("--minutes", type=float, default=12)
    parser.add_argument("--rate", type=int, default=1500, help="events per second (3 jobs each)")
    parser.add_argument("--work", help="working directory (default: a new temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="mailpush-soak-"))
    work.mkdir(parents=True, exist_ok=True)

    broker, brokers = bench.start_devbroker(args, PARTITIONS, work, "soak")
    service = None
    try:
        bench.publish_config(brokers, OWNERS, DEVICES_PER_OWNER, bench.spki_base64())
        state, log = work / "state", work / "service.log"
        service = subprocess.Popen([args.bin, "run", "--brokers", brokers, "--state-dir", str(state), "--http-port", "0"],
                                   stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_ready(log)
        publisher = bench.RatePublisher(brokers, OWNERS, 0)
        churn = Producer({"bootstrap.servers": brokers, "log_level": 0})
        started, cpu_before = time.time(), bench.proc_cpu_seconds(service.pid)
        samples: list[float] = []
        chunk = 0
        print(f"work directory {work}; {args.rate} events/s for {args.minutes:g} min", flush=True)
        while time.time() - started < args.minutes * 60:
            publisher.publish(args.rate, CHUNK_SECONDS)
            for k in range(50):
                churn.produce(bench.EVENTS, key=f"em-none-{k}", value=bench.event_record(10**9 + chunk * 100 + k, 10**6 + k))
            for owner in range(0, OWNERS, 10):
                churn.produce(bench.DEVICES, key=f"dev-{owner}-0", value=bench.device_record(owner, 0))
            churn.flush(10)
            chunk += 1
            if service.poll() is not None:
                raise SystemExit(f"the service exited with {service.returncode}; see {log}")
            samples.append(bench.proc_status_mb(service.pid, "VmRSS"))
            sizes = {p.name.removeprefix("mailpush."): p.stat().st_size / 1e6 for p in state.glob("mailpush.sqlite*")}
            print(f"t={time.time() - started:5.0f} s  rss={samples[-1]:6.1f} MB  peak={bench.proc_peak_rss_mb(service.pid):6.1f} MB  "
                  f"cpu={bench.proc_cpu_seconds(service.pid) - cpu_before:6.1f} s  events={publisher.next_index}  "
                  + "  ".join(f"{name}={size:.0f} MB" for name, size in sorted(sizes.items())), flush=True)
        service.send_signal(15)
        status = service.wait(60)
        errors = sum('"level":"error"' in line or '"level":"critical"' in line for line in log.read_text(errors="replace").splitlines())
        third = max(1, len(samples) // 3)
        middle, last = samples[third:2 * third] or samples, samples[-third:]
        growth = max(last) / max(middle) - 1
        verdict = "flat" if growth <= 0.05 else "GROWING"
        print(f"exit status {status}, {errors} error lines; RSS last third max {max(last):.1f} MB against middle third max "
              f"{max(middle):.1f} MB ({growth:+.1%}): {verdict}")
        return 0 if verdict == "flat" and status == 0 and errors == 0 else 1
    finally:
        if service and service.poll() is None:
            service.kill()
        bench.stop_devbroker(broker)


if __name__ == "__main__":
    sys.exit(main())
