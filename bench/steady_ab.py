#!/usr/bin/env python3
"""Compares two mailpush binaries under `make bench`'s steady load, in alternating runs.

The steady load's figures move with the machine's other load more than with most changes, so one report
before and one after cannot judge a change. This runs the steady load alone (bench.py's `steady_run`: a fresh
devbroker and service, every topic with 64 partitions, 5,000 events/s for 8 s) for A then B, then B then A, and
so on, and prints each pair and the medians, so both binaries meet the same moods of the machine and neither
always runs second. The service runs in its
default mode (a consumer group; each run waits until its partitions are taken over), or with `--ownership static`.

    git stash && make release && cp .build/release/mailpush /tmp/mailpush-before && git stash pop && make release
    python3 bench/steady_ab.py --a /tmp/mailpush-before --b .build/release/mailpush --pairs 3

Each run takes about 20 s. `--service-arg` (repeatable) applies to both, `--b-service-arg` to B only, so one
binary can also be compared with itself under another setting. A side may name its own ownership after a colon,
so one binary can be compared with itself in both modes (issue 25's group against static ownership):

    python3 bench/steady_ab.py --a .build/release/mailpush:static --b .build/release/mailpush:group --pairs 40

A side may also be `relay`: the bare relay `make bench` measures beside the service (MailpushBench, which `make
bench` builds). With `--slices 2`, each run's p50/p99 by two-second slices of the load shows when its slow jobs
came; on the development broker every subject's latency rises as the load goes on, the relay's most
(docs/performance.md, session 23):

    python3 bench/steady_ab.py --a relay --b .build/release/mailpush:static --pairs 2 --seconds 16 --slices 2

`--perf DIR` records each run's service with `perf record` (cpu-clock, attached a second after it starts; the
settle is then at least 2 s, so the load comes after) and ends with each side's CPU µs per job by thread name and
library, largest differences first: where B's extra CPU goes (docs/performance.md, session 19: the group's is spread
over its own code, Swift's runtime and the kernel).
`$PERFG` adds options to `perf record`, such as `--call-graph dwarf,8192`, as for drain_ab.py.

    python3 bench/steady_ab.py --a .build/release/mailpush:static --b .build/release/mailpush:group --pairs 6 --perf /tmp/perf

After the runs it gives, per measure, the geometric mean of the pairs' B ÷ A ratios with its 95% interval, and with
`--limit` (say 1.05) whether B stays within that factor of A, judged as `make bench` judges (met, not met,
undecided).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import bench

MEASURES = [
    ("steadyP50", "steady p50 ms", "{:.0f}"),
    ("steadyP99", "steady p99 ms", "{:.0f}"),
    ("steadyMax", "steady max ms", "{:.0f}"),
    ("coldP99", "cold p99 ms", "{:.0f}"),
    ("coldMax", "cold max ms", "{:.0f}"),
    ("cpuMicrosPerJob", "service CPU µs per job", "{:.1f}"),
    ("serviceCores", "cores: service", "{:.2f}"),
    ("devbrokerCores", "cores: devbroker", "{:.2f}"),
    ("machineBusyCores", "cores: machine", "{:.2f}"),
    ("publisherAckP99", "publisher's own wait p99 ms", "{:.1f}"),
]


# When perf attaches to a service (`bench.perf_recorded`): after its first Kafka clients are made, which a perf
# attaching meanwhile does not follow.
PERF_ATTACH_AFTER = 1.0


def run_options(args, binary: str, service_args: list[str]) -> argparse.Namespace:
    return argparse.Namespace(bench_bin=args.bench_bin,
        bin=binary, devices=args.devices, steady_partitions=args.partitions, steady_owners=args.owners,
        steady_rate=args.rate, steady_seconds=args.seconds, steady_settle=args.settle, service_args=service_args)


def samples_by_thread_and_library(recording: Path) -> collections.Counter:
    """Samples of one recording by (thread name, library), from `perf report`: each sample once, by where it was
    taken, also when the recording has call graphs (`$PERFG`), which `perf report` otherwise adds up by caller."""
    bench.wait_for_recording(recording)
    report = subprocess.run(["perf", "report", "-i", str(recording), "-n", "--sort", "comm,dso", "--stdio",
                             "--no-children", "-g", "none"],
                            capture_output=True, text=True, check=True).stdout
    return parse_samples(report)


def parse_samples(report: str) -> collections.Counter:
    """(thread name, library) → samples, from the text of `perf report -n --sort comm,dso --stdio`."""
    counts = collections.Counter()
    for line in report.splitlines():
        found = re.match(r"\s*[\d.]+%\s+(\d+)\s+(.+?)\s{2,}(\S+)\s*$", line)
        if found:
            counts[(found.group(2), found.group(3))] += int(found.group(1))
    return counts


def compare_profiles(perf_dir: Path, results: dict[str, list[dict]]):
    """Each side's CPU µs per job (samples ÷ their rate ÷ jobs), by thread name and library, over all its runs: where
    B's CPU differs from A's."""
    per_job = {}
    for side, runs in results.items():
        total = collections.Counter()
        for run in runs:
            total.update(samples_by_thread_and_library(Path(run["profile"])))
        jobs = sum(run["jobs"] for run in runs)
        per_job[side] = {key: count / bench.PERF_HZ * 1e6 / jobs for key, count in total.items()}
    keys = sorted(set(per_job["A"]) | set(per_job["B"]),
                  key=lambda k: -abs(per_job["B"].get(k, 0) - per_job["A"].get(k, 0)))
    print()
    print(f"Profiles (`perf record`, {bench.PERF_HZ} Hz, in {perf_dir}): CPU µs per job by thread and library, "
          "largest differences first")
    print("| thread | library | A | B | B − A |")
    print("|---|---|---|---|---|")
    for thread, library in keys[:15]:
        a, b = per_job["A"].get((thread, library), 0), per_job["B"].get((thread, library), 0)
        print(f"| {thread} | {library} | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    a, b = sum(per_job["A"].values()), sum(per_job["B"].values())
    print(f"| all | all | {a:.2f} | {b:.2f} | {b - a:+.2f} |")


def slice_percentiles(series: list, width: float) -> str:
    """p50/p99 of the sampled jobs published in each `width`-second slice of the load, from its start (as the run's
    own p50 and p99: `bench.percentile_of_whole_ms`)."""
    return " | ".join(
        f"{bench.percentile_of_whole_ms(values, 50):.1f}/{bench.percentile_of_whole_ms(values, 99):.1f}" if values else "-"
        for values in bench.latency_slices(series, width))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="the binary before the change (binary[:group|static]), or relay")
    parser.add_argument("--b", required=True, help="the binary after the change (binary[:group|static]), or relay")
    parser.add_argument("--bench-bin", default=str(Path(__file__).resolve().parent.parent / ".build/release/MailpushBench"),
                        help="MailpushBench, for a side that is the bare relay (`make bench` builds it)")
    parser.add_argument("--slices", type=float, default=None, metavar="SECONDS",
                        help="also print each run's p50/p99 ms in slices of this many seconds of the load (when its slow jobs came)")
    parser.add_argument("--limit", type=float, default=None,
                        help="judge each measure's B ÷ A ratios against this factor (e.g. 1.05)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=5_000, help="events/s")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--owners", type=int, default=500)
    parser.add_argument("--devices", type=int, default=3, help="devices per owner (jobs per event)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds between ready (in a group: its partitions taken over) and the load")
    parser.add_argument("--ownership", choices=["group", "static"], default="group",
                        help="the service's mode: group (the default mode) or static (--instance 0 --instances 1)")
    parser.add_argument("--service-arg", dest="service_args", action="append", default=[])
    parser.add_argument("--b-service-arg", dest="b_service_args", action="append", default=[])
    parser.add_argument("--together", action="store_true",
                        help="run both sides of a pair at the same time, each on its own development broker at --rate, "
                             "their loads starting together: the machine's mood is the same for both (halve --rate "
                             "to keep the machine's load)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (service and devbroker logs)")
    parser.add_argument("--perf", metavar="DIR", default=None,
                        help="record every run's service with `perf record` into DIR and compare the sides' CPU per job "
                             "by thread and library (`perf report -i DIR/A1.perf` for the details)")
    parser.add_argument("--save", default=None, help="write every run's figures (with its latency histogram) to this JSON file")
    parser.add_argument("--series", action="store_true",
                        help="with --save: also every sampled job's (seconds into the load, latency ms), to see when the slow ones came")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    binaries, modes = {}, {}
    for side, given in (("A", args.a), ("B", args.b)):
        if given == "relay":
            if not Path(args.bench_bin).is_file():
                parser.error(f"--{side.lower()} relay needs MailpushBench: no such file {args.bench_bin} (make bench builds it)")
            modes[side] = "relay"
            continue
        binary, _, mode = given.partition(":")
        if not Path(binary).is_file():
            parser.error(f"no such binary: {binary} (--{side.lower()} {given})")
        if mode not in ("", "group", "static"):
            parser.error(f"--{side.lower()} {given}: the ownership after the colon must be group or static, got {mode!r}")
        binaries[side], modes[side] = binary, mode or args.ownership
    if len(binaries) == 0:
        parser.error("one side must be a mailpush binary: its `mailpush devbroker` serves both")
    # The relay's runs use the other side's binary for their development broker.
    for side in ("A", "B"):
        binaries.setdefault(side, binaries["B" if side == "A" else "A"])

    if args.perf:
        # perf attaches a second after the service starts (`PERF_ATTACH_AFTER`); a ready static service idles
        # `--settle` before its load, so the load starts after it.
        args.settle = max(args.settle, PERF_ATTACH_AFTER + 1.0)
    sides = {"A": run_options(args, binaries["A"], args.service_args),
             "B": run_options(args, binaries["B"], args.service_args + args.b_service_args)}
    spki = bench.spki_base64()
    work = Path(tempfile.mkdtemp(prefix="mailpush-steady-ab-"))
    results: dict[str, list[dict]] = {"A": [], "B": []}
    perf_dir = Path(args.perf) if args.perf else None
    if perf_dir:
        perf_dir.mkdir(parents=True, exist_ok=True)

    def prepared(side: str) -> tuple[argparse.Namespace, Path | None]:
        """The side's run options (its binary recorded by `perf` with --perf) and the recording's path."""
        profile = perf_dir / f"{side}{len(results[side]) + 1}.perf" if perf_dir else None
        options = sides[side]
        if profile:
            recorded = bench.perf_recorded(options.bin, profile, attach_after=PERF_ATTACH_AFTER)
            options = argparse.Namespace(**{**vars(options), "bin": recorded})
        return options, profile

    def record(pair: int, side: str, result: dict, profile: Path | None):
        if profile:
            result["profile"] = str(profile)
        results[side].append(result)
        shown = ", ".join(f"{label} {fmt.format(result[key])}" for key, label, fmt in MEASURES[:6])
        if waits := result.get("leaseWaitsMs"):
            shown += f", lease waits {waits['count']:.0f} (mean {waits['meanMs']:.1f} ms)"
        print(f"pair {pair + 1} {side}: {shown}", flush=True)
        if args.slices:
            print(f"  by {args.slices:g} s slices of the load, p50/p99 ms: {slice_percentiles(result['series'], args.slices)}",
                  flush=True)

    try:
        for pair in range(args.pairs):
            if args.together:
                # Which side's processes start first alternates, as one after the other: in A/A pairs of one binary
                # against itself the side started second measured up to 5% slower (docs/performance.md, session 43).
                runs = {side: prepared(side) for side in (sides if pair % 2 == 0 else reversed(sides))}
                together = bench.steady_together({side: (options, modes[side]) for side, (options, _) in runs.items()}, spki,
                                                 work, 2 * pair, args.rate)
                for side, (_, profile) in runs.items():
                    record(pair, side, together[side], profile)
                continue
            # A then B, then B then A: a side that always ran second would meet whatever the first one left behind.
            for side in sides if pair % 2 == 0 else reversed(sides):
                options, profile = prepared(side)
                result = bench.steady_run(options, len(results["A"]) + len(results["B"]), spki, work, modes[side])
                record(pair, side, result, profile)
    finally:
        if args.keep:
            print(f"logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"| measure | A: {args.a} | B: {args.b} | median A → B |")
    print("|---|---|---|---|")
    for key, label, fmt in MEASURES:
        a = [r[key] for r in results["A"]]
        b = [r[key] for r in results["B"]]
        print(f"| {label} | {' / '.join(fmt.format(v) for v in a)} | {' / '.join(fmt.format(v) for v in b)} | "
              f"{fmt.format(statistics.median(a))} → {fmt.format(statistics.median(b))} |")

    print()
    print("B ÷ A, pair by pair: geometric mean (95% interval)" + (f", judged against {args.limit}" if args.limit else ""))
    for key, label, _ in MEASURES:
        ratios = [b[key] / a[key] if a[key] else float("nan") for a, b in zip(results["A"], results["B"])]
        line = f"- {label}: {bench.interval_text(ratios)}"
        if args.limit:
            verdict, text = bench.within_limit(ratios, args.limit)
            line += f": {verdict} ({text})"
        print(line)

    print()
    print("Pooled: each side's steady latencies of all its runs together (B ÷ A, 95% interval from resampling the pairs)"
          + (f", judged against {args.limit}" if args.limit else ""))
    pairs = list(zip((r["steadyHistogram"] for r in results["A"]), (r["steadyHistogram"] for r in results["B"])))
    for p in (50, 99):
        a = bench.pooled_percentile((pair[0] for pair in pairs), p)
        b = bench.pooled_percentile((pair[1] for pair in pairs), p)
        centre, low, high = bench.pooled_ratio_interval(pairs, p)
        line = f"- steady p{p} ms: A {a:.2f}, B {b:.2f}; B ÷ A {centre:.3f} ({low:.3f}–{high:.3f})"
        if args.limit:
            line += ": " + bench.interval_verdict(centre, low, high, args.limit)[0]
        print(line)
    if perf_dir:
        compare_profiles(perf_dir, results)
    if args.save:
        if not args.series:
            for side in results.values():
                for result in side:
                    result.pop("series", None)
        Path(args.save).write_text(json.dumps({"a": args.a, "b": args.b, "rate": args.rate, "results": results}, indent=1))
        print(f"figures written to {args.save}")


if __name__ == "__main__":
    main()
