"""Copies a state topic into another one the way Kafka's log compaction leaves it: per partition, the latest
record of each key at its original position (in the original order), keys whose latest record is a tombstone
dropped with it. The development broker never compacts; a restore from the copy is a restore after compaction.

    python3 tests/integration/compact_state_topic.py --brokers HOST:PORT [--source mailpush.state] --target COPY

prints the records and bytes (keys and values) per state partition before and after.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mailpush_harness as h  # noqa: E402


def compacted(records: list[h.Record]) -> list[h.Record]:
    """Kafka's compaction of one partition's records (in log order)."""
    last = {r.key: r.offset for r in records}
    return [r for r in records if last[r.key] == r.offset and r.value is not None]


def size(records: list[h.Record]) -> int:
    return sum(len(r.key or b"") + len(r.value or b"") for r in records)


def compact_copy(kafka: h.Kafka, source: str, target: str) -> dict:
    """Copies `source` compacted into `target` (same partition numbers); returns per partition the records and
    bytes before and after, and the copied records."""
    by_partition: dict[int, list[h.Record]] = collections.defaultdict(list)
    for record in kafka.consume(source, idle=1.0):
        by_partition[record.partition].append(record)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "message.max.bytes": 2000000}, logger=h.KAFKA_LOG)
    failures: list = []
    kafka.partitions(target)  # made on first use, with as many partitions as the broker's default
    report = {}
    for partition, records in sorted(by_partition.items()):
        records.sort(key=lambda r: r.offset)
        kept = compacted(records)
        for r in kept:
            producer.produce(target, key=r.key, value=r.value, partition=partition,
                             on_delivery=lambda err, msg: err and failures.append(err))
            producer.poll(0)
        report[partition] = {"records": len(records), "bytes": size(records), "liveRecords": len(kept),
                             "liveBytes": size(kept), "live": [json.loads(r.value) for r in kept]}
    deadline = time.monotonic() + 60
    while producer.flush(1) and time.monotonic() < deadline:
        pass
    assert not failures and not len(producer), f"copying {source} into {target}: {failures[:3]}"
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--source", default="mailpush.state")
    parser.add_argument("--target", required=True)
    args = parser.parse_args()
    report = compact_copy(h.Kafka(args.brokers), args.source, args.target)
    for partition, numbers in report.items():
        print(f"state partition {partition}: {numbers['records']} records, {numbers['bytes']} bytes; "
              f"compacted: {numbers['liveRecords']} records, {numbers['liveBytes']} bytes")


if __name__ == "__main__":
    main()
