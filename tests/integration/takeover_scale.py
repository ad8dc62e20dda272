#!/usr/bin/env python3
"""Takeover of a partition that carries many dedupe entries (CONTRACT §8.1: processed again within 10 s of
the assignment). One instance of a group processes `--entries` distinct emails on one event partition; a
second instance joins; the first is then stopped (SIGTERM: a graceful handover) or killed (SIGKILL: the new
owner also waits out the old owner's lease). Reports, from the new owner's log and an independent consumer:
restore time and bytes, takeover time (assignment acted on → processing), and the first job of an event
published right after the handover.

    python3 tests/integration/takeover_scale.py --bin .build/release/mailpush --entries 100000 --mode term
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mailpush_harness as h  # noqa: E402
import sudo_client  # noqa: E402

GROUP = ["--group", "takeover"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=".build/release/mailpush")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--mode", choices=["term", "kill"], default="term")
    parser.add_argument("--rate", type=int, default=4000, help="events/s published (the development broker keeps ~5 MB a partition)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (state directories and logs)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="takeover-"))
    world = h.World(workdir, binary=str(Path(args.bin).resolve()))
    try:
        bootstrap = world.devbroker(partitions=1)
        kafka = h.Kafka(bootstrap)
        key = sudo_client.generate_key()
        # One owner with one iOS device; the events' address has a key. Every event is a distinct email.
        kafka.produce(h.DEVICES, "dev-1", h.ios_device("dev-1", owner="user-1"))
        kafka.produce(h.KEYS, "em-add-1", sudo_client.key_record(key, "em-add-1", "k1", owner="user-1"))
        a = world.service(args=GROUP, name="a")
        h.wait_for(lambda: a.metrics().get("mailpush_owned_partitions", 0) == 1, 60, "a owns the partition")

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 200000},
                            logger=h.KAFKA_LOG)
        started = time.monotonic()
        template = h.event("m", "em-add-1", owner="user-1")
        for i in range(args.entries):
            template["messageId"] = f"msg-{i}"
            while True:
                try:
                    producer.produce(h.EVENTS, key=b"em-add-1", value=json.dumps(template).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 1000 == 999:
                producer.poll(0)
                behind = (i + 1) / args.rate - (time.monotonic() - started)
                if behind > 0:
                    time.sleep(behind)
        producer.flush(60)
        h.wait_for(lambda: a.metrics().get("mailpush_events_received_total", 0) >= args.entries, 600,
                   f"a processed {args.entries} events", interval=1.0)
        print(f"published and processed {args.entries} events in {time.monotonic() - started:.1f} s")

        b = world.service(args=GROUP, name="b")
        time.sleep(8)  # b joins (it gets nothing: one partition)
        handed = time.monotonic()
        if args.mode == "term":
            a.stop(signal.SIGTERM)
        else:
            a.kill()
        h.wait_for(lambda: any(l["message"] == "processing taken-over event partitions" for l in b.proc.log_lines()), 120,
                   "b took the partition over", interval=0.2, on_fail=b.proc.log_tail)
        assigned = time.monotonic()
        probe = h.event("probe", "em-add-1", owner="user-1")
        kafka.produce(h.EVENTS, "em-add-1", probe)
        want = sudo_client.job_id("em-add-1", "probe", "dev-1")
        h.wait_for(lambda: want in {r.headers.get("mailpush-job-id") for r in kafka.consume(h.JOBS, min_count=0, timeout=2, idle=0.3)[-5:]},
                   60, "the probe's job")
        first_job = time.monotonic()
        done = [l for l in b.proc.log_lines() if l["message"] == "processing taken-over event partitions"][0]
        taken = [l for l in b.proc.log_lines() if l["message"] == "event partition taken over"][0]
        print(json.dumps({
            "mode": args.mode, "dedupeEntries": int(taken["dedupeEntries"]), "stateRecords": int(taken["stateRecords"]),
            "restoreMs": int(done["restoreMs"]), "restoreBytes": int(done["restoreBytes"]), "waitedMs": int(done["waitedMs"]),
            "takeoverMs": int(done["takeoverMs"]), "readBack": int(done["readBack"]),
            "handoverToProcessingS": round(assigned - handed, 2), "handoverToProbeJobS": round(first_job - handed, 2),
        }, indent=1))
        b.stop(signal.SIGTERM)
        return 0
    finally:
        world.close()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
