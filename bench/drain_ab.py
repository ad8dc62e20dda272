#!/usr/bin/env python3
"""Compares the CPU per job of several `mailpush` binaries on the benchmark's drain, A/B interleaved.

`make bench` runs one binary; comparing two of its reports taken at different times on this shared machine
mixes the change with the machine's mood. This runs only the drain of bench.py's `one_run` (a fresh
development broker, config and a backlog of --events events × 3 devices published first, `mailpush run` in its
default mode, CPU utime+stime from ready to the last job), for each binary in turn, --rounds times (each round
starting with the next binary, so that none always follows the same one), and prints each run and the medians,
with the peak RSS. The first binary's development broker serves all of them.

    python3 bench/drain_ab.py /tmp/mailpush-before .build/release/mailpush --rounds 8
    python3 bench/drain_ab.py .build/release/mailpush .build/release/mailpush:static --rounds 6
    PERFG="--call-graph dwarf,16384" python3 bench/drain_ab.py .build/release/mailpush --rounds 1 --perf /tmp/drain.perf

A binary may end in `:group` or `:static` (its ownership; --ownership otherwise), so one binary's two modes
can be compared side by side.

--together drains every binary at the same time, each on its own development broker (`bench.drain_together`): the
machine's mood of the moment is then the same for all of them, and with two binaries the round-by-round ratio's
interval is a few times narrower than one after another (issue 25's group against static: 1.016, 1.005–1.027 over
six rounds). Each drain has about one core, so its CPU per job is not the drain's alone on the machine.

    python3 bench/drain_ab.py .build/release/mailpush:static .build/release/mailpush:group --together --rounds 6

--dedupe-entries N starts every drain with N entries in its dedupe window (a state directory made by the first
binary's `mailpush offsets`, filled once and copied for each drain), as a service that has run for a while has: every
new entry then lands on a random leaf of the window's B-tree (docs/performance.md, session 28).

    python3 bench/drain_ab.py /tmp/mailpush-before .build/release/mailpush --together --rounds 6 --dedupe-entries 1000000

--perf records the first binary's first run with `perf record -e cpu-clock`, attached to the service (`$PERFG` adds
options, such as a call graph); that run's CPU per job is printed but left out of the medians.
"""
import argparse
import secrets
import shutil
import sqlite3
import subprocess
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
from confluent_kafka import Consumer  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("bins", nargs="+")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--events", type=int, default=40_000)
parser.add_argument("--owners", type=int, default=200)
parser.add_argument("--ownership", default="group", choices=["group", "static"])
parser.add_argument("--together", action="store_true",
                    help="drain every subject at the same time, each on its own broker (see `together`)")
parser.add_argument("--perf", default="", help="perf.data path: record the first binary's first run")
parser.add_argument("--service-arg", action="append", default=[],
                    help="an argument for every `mailpush run` (repeat it); with `--service-arg=--log-level=debug` "
                         "each run also prints its batches' count and median size")
parser.add_argument("--keep", action="store_true", help="keep the working directory (service and devbroker logs, state)")
parser.add_argument("--dedupe-entries", type=int, default=0,
                    help="entries in every drain's dedupe window before it starts (0: an empty window, as `make bench`)")
args = parser.parse_args()
if args.dedupe_entries < 0:
    parser.error(f"--dedupe-entries must not be negative, got {args.dedupe_entries}")


def binary_and_ownership(subject: str) -> tuple[str, str]:
    binary, colon, ownership = subject.rpartition(":")
    if not colon:
        return subject, args.ownership
    if ownership not in ("group", "static"):
        parser.error(f"{subject}: the ownership after ':' must be group or static, got {ownership!r}")
    return binary, ownership


subjects = {subject: binary_and_ownership(subject) for subject in args.bins}
spki = B.spki_base64()
work = Path(tempfile.mkdtemp(prefix="drain-ab-"))
results: dict[str, list[float]] = {b: [] for b in args.bins}


def events_dropped(brokers: str) -> int:
    """How many of the published events the development broker no longer holds."""
    client = Consumer({"bootstrap.servers": brokers, "group.id": "drain-ab-check", "log_level": 0})
    try:
        return B.topic_start(client, B.EVENTS, list(range(B.PARTITIONS)))
    finally:
        client.close()


def filled_state_directory(entries: int) -> Path:
    """A state directory whose dedupe window holds `entries` random keys, entered over the hour before now in the
    order a service enters them (the schema from the first binary's `mailpush offsets`)."""
    template = work / "filled-state"
    subprocess.run([subjects[args.bins[0]][0], "offsets", "--state-dir", str(template)], check=True, capture_output=True)
    db = sqlite3.connect(template / "mailpush.sqlite")
    now_ms = int(time.time() * 1000)
    with db:
        db.executemany("INSERT INTO processed_email (email_key, processed_at_ms) VALUES (?, ?)",
                       ((secrets.token_hex(16), now_ms - 3_600_000 + index * 3_600_000 // entries) for index in range(entries)))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return template


filled = filled_state_directory(args.dedupe_entries) if args.dedupe_entries else None


def new_drain(subject: str, prefix: str) -> B.Drain:
    binary, ownership = subjects[subject]
    if filled:
        shutil.copytree(filled, work / f"{prefix}-state")
    # The first binary's development broker serves all of them.
    drain = B.Drain(binary, ownership, subjects[args.bins[0]][0], args.events, args.owners, spki, work, prefix, args.service_arg)
    dropped = events_dropped(drain.brokers)
    if dropped:
        drain.end()
        sys.exit(f"the development broker dropped the oldest {dropped} of the {args.events} events (it keeps about "
                 f"5 MB per partition, {B.PARTITIONS} event partitions here): the drain would wait for jobs that can "
                 f"never come; use fewer --events (40,000 fit)")
    return drain


def report(round_index: int, subject: str, measured: dict):
    sizes = measured["batchSizes"]
    batches = f", {len(sizes)} batches of median {statistics.median(sizes):.0f} events" if sizes else ""
    print(f"round {round_index} {subject}: {measured['cpuMicrosPerJob']:.2f} µs/job, {measured['jobsPerSecond']:.0f} jobs/s, "
          f"peak RSS {measured['peakRssMb']:.0f} MB{batches}", flush=True)


def one_after_another(round_index: int):
    # Each round starts with the next binary: one that always ran after another would meet what that one left.
    shift = round_index % len(args.bins)
    numbered = list(enumerate(args.bins))
    for bin_index, subject in numbered[shift:] + numbered[:shift]:
        drain = new_drain(subject, f"r{round_index}-{bin_index}")
        profiled = bool(args.perf) and bin_index == 0 and round_index == 0
        try:
            drain.start(Path(args.perf) if profiled else None)
            B.wait_until(lambda: drain.done, 300, f"{drain.expected} jobs")
            time.sleep(0.1)
            measured = drain.measure()
            if not profiled:  # perf's sampling costs the recorded run some CPU of its own
                results[subject].append(measured["cpuMicrosPerJob"])
            report(round_index, subject, measured)
        finally:
            drain.end()
        if profiled:
            B.wait_for_recording(Path(args.perf))


def together(round_index: int):
    """Every subject drains at the same time, each on its own broker (`bench.drain_together`)."""
    drains = [new_drain(subject, f"r{round_index}-{index}") for index, subject in enumerate(args.bins)]
    for subject, measured in zip(args.bins, B.drain_together(drains, work)):
        results[subject].append(measured["cpuMicrosPerJob"])
        report(round_index, subject, measured)


ratios: list[float] = []  # the second binary's CPU per job ÷ the first's, round by round
try:
    for round_index in range(args.rounds):
        (together if args.together else one_after_another)(round_index)
        if len(args.bins) == 2 and all(len(results[b]) == round_index + 1 for b in args.bins):
            ratios.append(results[args.bins[1]][-1] / results[args.bins[0]][-1])
finally:
    # Each drain leaves its state directory (about 13 MB) and logs: hundreds of MB over a few rounds.
    if args.keep:
        print(f"logs in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)

for binary, values in results.items():
    if values:
        print(f"{binary}: median {statistics.median(values):.2f} µs/job  runs {', '.join(f'{v:.2f}' for v in values)}")
if ratios:
    centre, low, high = B.ratio_interval(ratios)
    print(f"{args.bins[1]} ÷ {args.bins[0]}, run by run: {centre:.3f} ({low:.3f}–{high:.3f})  "
          f"runs {', '.join(f'{r:.3f}' for r in ratios)}")
