#!/usr/bin/env python3
"""Many registered devices: first start (catch-up of every registration), restart with local state,
peak RSS and state file size of `mailpush run`, on a `mailpush devbroker --partitions 128`.

    nice -n 5 swift build -c release --product mailpush
    python3 bench/directory_scale.py --devices 1000000 --bin .build/release/mailpush

Prints one Markdown table row per start. Each start is followed by emails to a sample of owners, to
show the directory still finds every device (4 jobs per email by default)."""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

import directory_scale as scale  # noqa: E402
import mailpush_harness as h  # noqa: E402
import sudo_client  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1_000_000)
    parser.add_argument("--per-owner", type=int, default=4)
    parser.add_argument("--keyed-owners", type=int, default=1000, help="owners that get an address key")
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--sample", type=int, default=200, help="emails sent after each start")
    parser.add_argument("--bin", default=str(Path(__file__).resolve().parents[1] / ".build" / "release" / "mailpush"))
    parser.add_argument("--workdir", default=None, help="where the state and logs go (kept); default: a temporary "
                        "directory, removed at the end unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (state and logs)")
    parser.add_argument("--broker-bin", default=None, help="binary for the devbroker (default: --bin)")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mailpush-directory-"))
    world = h.World(workdir, args.broker_bin or args.bin)
    try:
        world.devbroker(partitions=args.partitions, timeout=120)
        world.bin = args.bin
        key = sudo_client.generate_key()
        published = scale.publish(world.bootstrap, args.devices, args.per_owner, args.keyed_owners, key)
        print(f"published {args.devices} devices ({args.per_owner} per owner) and {args.keyed_owners} keys "
              f"in {published:.1f} s; {args.partitions} partitions; binary {args.bin}", flush=True)
        while not Path(args.bin).exists():  # publishing may overlap the build of the binary under test
            time.sleep(2)
        # "To processing": until the service logged that it processes events (a restarted group member resumes its
        # partitions from the local state before its join); "to ready": /readyz 200, which in a group also waits
        # for the join (the development broker holds it about 3 s after a member restarts).
        print("| start | to processing (s) | to ready (s) | CPU to ready (s): service / broker | peak RSS (MB) | state file (MB) | sample emails → jobs (s) |")
        print("|---|---|---|---|---|---|---|")
        state = workdir / "state"
        for attempt in range(1 + args.restarts):
            broker_cpu = scale.cpu_seconds(world.broker_proc.pid)
            service, measure = scale.start_and_measure(world, state)
            broker_cpu = scale.cpu_seconds(world.broker_proc.pid) - broker_cpu
            owners = random.sample(range(args.keyed_owners), min(args.sample, args.keyed_owners))
            delivered = scale.events_reach_devices(world, owners, args.per_owner)
            rss_after = scale.peak_rss_mb(service.proc.pid)
            scale.stop(service)
            label = "first (catch-up)" if attempt == 0 else f"restart {attempt}"
            print(f"| {label} | {measure.seconds_to_processing:.2f} | {measure.seconds_to_ready:.2f} | {measure.cpu_seconds_to_ready:.2f} / {broker_cpu:.2f} | {measure.peak_rss_mb:.0f} "
                  f"(after emails: {rss_after:.0f}) | {measure.state_file_mb:.0f} | {delivered:.1f} |", flush=True)
            time.sleep(0.5)
    finally:
        world.close()
        # A million devices leave about 460 MB of state and broker logs behind.
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            print(f"kept {workdir}")


if __name__ == "__main__":
    main()
