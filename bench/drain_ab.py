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

--perf records the first binary's first run with `perf record -e cpu-clock`, attached to the service (`$PERFG` adds
options, such as a call graph); that run's CPU per job is printed but left out of the medians.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
from confluent_kafka import Consumer, Producer  # noqa: E402

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
args = parser.parse_args()


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


class BrokerArgs:
    bin = subjects[args.bins[0]][0]


class Drain:
    """One subject's drain: its own development broker with config and the backlog published, an independent job
    counter and a CPU sampler, then the service."""

    def __init__(self, subject: str, prefix: str):
        self.subject, self.prefix = subject, prefix
        self.binary, self.ownership = subjects[subject]
        self.broker, self.brokers = B.start_devbroker(BrokerArgs, B.PARTITIONS, work, prefix)
        self.service = self.counter = self.sampler = None
        self.expected = args.events * 3
        try:
            self._publish()
            self.counter = B.JobCounter(self.brokers)
            self.counter.start()
            self.sampler = B.Sampler(self.counter)
            self.sampler.start()
        except BaseException:
            self.end()
            raise

    def _publish(self):
        B.publish_config(self.brokers, args.owners, 3, spki)
        backlog = Producer({"bootstrap.servers": self.brokers, "log_level": 0, "linger.ms": 5, "acks": "all",
                            "enable.idempotence": True, "queue.buffering.max.messages": 200_000,
                            "batch.num.messages": 10_000})
        for index in range(args.events):
            owner = index % args.owners
            backlog.produce(B.EVENTS, key=f"em-{owner}", value=B.event_record(index, owner))
            if index % 10_000 == 9_999:
                backlog.poll(0)
        backlog.flush(120)
        dropped = events_dropped(self.brokers)
        if dropped:
            sys.exit(f"the development broker dropped the oldest {dropped} of the {args.events} events (it keeps about "
                     f"5 MB per partition, {B.PARTITIONS} event partitions here): the drain would wait for jobs that can "
                     f"never come; use fewer --events (40,000 fit)")

    def start(self, recording: Path | None = None):
        run_binary = B.perf_recorded(self.binary, recording) if recording else self.binary
        self.service = B.Service(run_binary, self.brokers, work / f"{self.prefix}-state",
                                 work / f"{self.prefix}-service.log", args.service_arg, self.ownership)
        self.sampler.service = self.service

    @property
    def done(self) -> bool:
        return self.counter.count >= self.expected

    def measure(self) -> tuple[float, float, float, str]:
        """CPU µs per job from ready to the last job, jobs/s, peak RSS MB, and the batches' sizes."""
        samples = list(self.sampler.samples)
        cpu = self.service.cpu_since_ready(samples) * 1e6 / self.expected
        busy = [s for s in samples if 0 < s[2] < self.expected]
        rate = (busy[-1][2] - busy[0][2]) / (busy[-1][0] - busy[0][0]) if len(busy) > 1 else float("nan")
        batches = [b["events"] for b in self.service.batches]
        sizes = f", {len(batches)} batches of median {statistics.median(batches):.0f} events" if batches else ""
        return cpu, rate, B.proc_peak_rss_mb(self.service.pid), sizes

    def end(self):
        B.end_run(self.broker, self.service, self.counter, self.sampler)


def one_after_another(round_index: int):
    # Each round starts with the next binary: one that always ran after another would meet what that one left.
    shift = round_index % len(args.bins)
    numbered = list(enumerate(args.bins))
    for bin_index, subject in numbered[shift:] + numbered[:shift]:
        drain = Drain(subject, f"r{round_index}-{bin_index}")
        profiled = bool(args.perf) and bin_index == 0 and round_index == 0
        try:
            drain.start(Path(args.perf) if profiled else None)
            B.wait_until(lambda: drain.done, 300, f"{drain.expected} jobs")
            time.sleep(0.1)
            cpu, rate, rss, sizes = drain.measure()
            if not profiled:  # perf's sampling costs the recorded run some CPU of its own
                results[subject].append(cpu)
            print(f"round {round_index} {subject}: {cpu:.2f} µs/job, {rate:.0f} jobs/s, peak RSS {rss:.0f} MB{sizes}",
                  flush=True)
        finally:
            drain.end()
        if profiled:
            B.wait_for_recording(Path(args.perf))


def together(round_index: int):
    """Every subject drains at the same time, each on its own broker: the machine's mood of the moment is the same
    for all of them, and each one's CPU per job is measured while the others take their share. The group members
    start first; the others once every group member is ready (has taken over its partitions), so that the drains
    overlap instead of one running alone through a group's first join."""
    drains = [Drain(subject, f"r{round_index}-{index}") for index, subject in enumerate(args.bins)]
    try:
        for drain in drains:
            if drain.ownership == "group":
                drain.start()
        for drain in drains:
            if drain.service is not None:
                drain.service.wait_ready(work)
        for drain in drains:
            if drain.service is None:
                drain.start()
        B.wait_until(lambda: all(d.done for d in drains), 600, "every drain's jobs")
        time.sleep(0.1)
        for drain in drains:
            cpu, rate, rss, sizes = drain.measure()
            results[drain.subject].append(cpu)
            print(f"round {round_index} {drain.subject}: {cpu:.2f} µs/job, {rate:.0f} jobs/s, peak RSS {rss:.0f} MB{sizes}",
                  flush=True)
    finally:
        for drain in drains:
            drain.end()


ratios: list[float] = []  # the second binary's CPU per job ÷ the first's, round by round
for round_index in range(args.rounds):
    (together if args.together else one_after_another)(round_index)
    if len(args.bins) == 2 and all(len(results[b]) == round_index + 1 for b in args.bins):
        ratios.append(results[args.bins[1]][-1] / results[args.bins[0]][-1])

for binary, values in results.items():
    if values:
        print(f"{binary}: median {statistics.median(values):.2f} µs/job  runs {', '.join(f'{v:.2f}' for v in values)}")
if ratios:
    centre, low, high = B.ratio_interval(ratios)
    print(f"{args.bins[1]} ÷ {args.bins[0]}, run by run: {centre:.3f} ({low:.3f}–{high:.3f})  "
          f"runs {', '.join(f'{r:.3f}' for r in ratios)}")
