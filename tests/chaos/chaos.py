#!/usr/bin/env python3
"""Crash tester for mailpush's exactly-once promise (docs/contract.md §8).

Starts `mailpush devbroker`, registers devices of several owners (mixed platforms, simple
per-address ENABLE/DISABLE filters) and address keys, starts `mailpush run`, publishes events
in bursts (with some bad events and some duplicate publications), SIGKILLs `mailpush run` at
random moments and restarts it with the same state directory, waits until the output is
complete or idle, and compares `mailpush.push-jobs` and `mailpush.dead-letters` with the set
computed here, independently, from the generated configuration.

    python3 tests/chaos/chaos.py --events 3000 --devices 40 --kills 5 --seed 7
    python3 tests/chaos/chaos.py --events 3000 --kills 100 --pairs 30 --batch-size 16 --partitions 32   # make chaos

With --pairs, some kills come in pairs: the restarted process is killed again 0-50 ms after it logged its
first committed batch, while the first crash's unfinished batch may still be pending recovery.

With --fleet N, N instances of one consumer group (each with its own state directory) share the partitions,
and each disruption picks one at random: SIGKILL and restart on its state, SIGTERM and restart, SIGSTOP past
the group session timeout then SIGCONT, or SIGKILL for good and a new instance on an empty state directory
(CONTRACT §8.1). The same exactly-once check follows. With --cuts each instance runs in a network namespace of
its own (cut_off_host.py; needs root, ip and iptables), and a disruption may also cut an instance off the network
for 2-20 s and heal it: past the session timeout the others take its partitions over while it still runs.

With --config-changes K the configuration changes K times between bursts, each once every event published so far
is processed: a device registered, unregistered or given a new filter, an address key removed or added (none
added with --replays, whose replays would deliver dead letters it fixed). Each event's expected outputs follow the
configuration acknowledged before it was published (CONTRACT §8).

With --replays K (and --fleet) K `mailpush replay` commands (no --force, from offset 0 or part way) start at random
moments; each must finish, write every dead letter of its range once more and no job again.

    python3 tests/chaos/chaos.py --fleet 3 --events 3000 --kills 20 --partitions 16 --seed 7 --cuts --replays 4   # make chaos-fleet

Prints
    jobs: expected=N present=N duplicates=N missing=N unexpected=N
    dead-letters: expected=N present=N duplicates=N missing=N unexpected=N
and exits 0 only if nothing is duplicated, missing or unexpected (1 otherwise, 2 when the
run itself could not be carried out).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import mailpush_harness as h  # noqa: E402
import sudo_client  # noqa: E402
from cut_off_host import CutOffHost  # noqa: E402

WEBHOOK_URL = "https://sponsor.example/chaos"


class OutputCollector(threading.Thread):
    """Reads output topics from their beginning while a run goes on. The development broker keeps only about the
    last 5 MB of a partition, and jobs are keyed by device: with 40 devices a jobs partition can pass that, and
    outputs read only at the end would be gone (a run once counted 290 jobs missing that way)."""

    def __init__(self, bootstrap: str, topics: list[str]):
        super().__init__(daemon=True)
        self.bootstrap, self.topics = bootstrap, topics
        self.lock = threading.Lock()
        self.records: dict[str, list[h.Record]] = {t: [] for t in topics}
        #: Per (topic, partition), the first offset read: anything but 0 means records were gone before.
        self.first: dict[tuple[str, int], int] = {}
        self.last = time.monotonic()
        self.halt = threading.Event()
        self.error: Exception | None = None
        self.start()

    def run(self):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        try:
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"chaos-collector-{uuid.uuid4()}",
                          "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
            try:
                parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in self.topics
                         for p in c.list_topics(t, timeout=10).topics[t].partitions]
                c.assign(parts)
                while not self.halt.is_set():
                    m = c.poll(0.1)
                    if m is None or m.error():
                        continue
                    headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (m.headers() or [])}
                    with self.lock:
                        self.first.setdefault((m.topic(), m.partition()), m.offset())
                        self.records[m.topic()].append(h.Record(m.topic(), m.partition(), m.offset(), m.key(),
                                                                m.value(), headers, m.timestamp()[1]))
                        self.last = time.monotonic()
            finally:
                c.close()
        except Exception as e:  # noqa: BLE001
            self.error = e

    def wait(self, counts: dict[str, int], timeout: float, idle: float) -> dict[str, list[h.Record]]:
        """Waits until each topic has at least its count and nothing arrived for `idle` seconds, or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.error is None:
            with self.lock:
                enough = all(len(self.records[t]) >= n for t, n in counts.items())
                quiet = time.monotonic() - self.last >= idle
            if enough and quiet:
                break
            time.sleep(0.2)
        self.halt.set()
        self.join(10)
        if self.error is not None:
            raise h.HarnessError(f"reading the outputs failed: {self.error}")
        with self.lock:
            return {t: sorted(rs, key=lambda r: (r.partition, r.offset)) for t, rs in self.records.items()}

    def gone_before_read(self) -> dict[tuple[str, int], int]:
        with self.lock:
            return {k: first for k, first in self.first.items() if first > 0}


def retention_losses(bootstrap: str, topics: list[str], timeout: float) -> dict:
    """Output partitions whose log no longer starts at 0, checked until output stops growing."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-watermarks",
                  "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + timeout
        last, dropped = None, {}
        while time.monotonic() < deadline:
            marks = {}
            for t in topics:
                md = c.list_topics(t, timeout=10).topics[t]
                for p in md.partitions:
                    marks[(t, p)] = c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            dropped = {k: lo for k, (lo, hi) in marks.items() if lo > 0}
            if dropped or marks == last:
                return dropped
            last = marks
            time.sleep(2)
        return dropped
    finally:
        c.close()


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Plan:
    """The generated configuration and the expected outcome of every event."""

    def __init__(self, rnd: random.Random, n_devices: int, keys: list):
        self.rnd = rnd
        self.private_keys = keys
        n_owners = max(3, n_devices // 6)
        self.owners = [f"user-{i}" for i in range(n_owners)]
        # Owners whose addresses may lack a key never have webhook devices, so that an event
        # for a key-less address is unambiguously one dead letter.
        self.nokey_owners = set(self.owners[:max(1, n_owners // 4)])
        self.addresses: dict[str, list[str]] = {}
        self.keys: dict[str, dict] = {}
        for o in self.owners:
            addrs = [f"em-{o}-{j}" for j in range(rnd.randint(2, 3))]
            self.addresses[o] = addrs
            for j, a in enumerate(addrs):
                if o in self.nokey_owners and j == len(addrs) - 1:
                    continue  # this address has no key
                priv = rnd.choice(keys)
                alg = rnd.choice([sudo_client.CBC, sudo_client.GCM])
                fmt = rnd.choice(["SPKI", "RSA_PUBLIC_KEY"])
                self.keys[a] = sudo_client.key_record(priv, a, f"key-{a}", alg, fmt, owner=o)
        self.devices: list[dict] = []
        self.wants: dict[str, set[str] | None] = {}  # deviceId -> enabled addresses (None: no config)
        self.kinds: dict[str, str] = {}
        for i in range(n_devices):
            o = self.owners[i % n_owners] if i < n_owners else rnd.choice(self.owners)
            kinds = ["ios", "android", "fcm"] + ([] if o in self.nokey_owners else ["webhook"])
            self.devices.append(self.registration(f"dev-{{}}-{i}", o, rnd.choice(kinds)))
        self.next_device = n_devices
        self.by_owner = collections.defaultdict(list)
        for d in self.devices:
            self.by_owner[d["owner"]].append(d)

    def registration(self, id_format: str, owner: str, kind: str) -> dict:
        """A registration of a device of `kind` (`id_format` gets the kind) with a random filter, its wants noted."""
        dev_id = id_format.format(kind)
        addrs = self.addresses[owner]
        if self.rnd.random() < 0.12:
            flt, wants = [], None
        else:
            disabled = [a for a in addrs if self.rnd.random() < 0.3]
            flt = h.init_filter(android=kind in ("android", "fcm"), disable_addresses=disabled)
            wants = set(addrs) - set(disabled)
        maker = {"ios": h.ios_device, "android": h.android_device,
                 "fcm": h.sponsor_fcm_device, "webhook": h.sponsor_webhook_device}[kind]
        self.wants[dev_id] = wants
        self.kinds[dev_id] = kind
        return maker(dev_id, owner=owner, filter=flt)

    def change(self, keep_dead_letters: bool) -> tuple[str, list[tuple[str, str, object]]]:
        """A random configuration change, applied to the plan: (what, the records that make it).

        With `keep_dead_letters` (replays run), nothing changes whether an event a replay may read again is a dead
        letter: no key is added, and the devices of owners with key-less addresses stay as they are."""
        rnd = self.rnd
        free = [o for o in self.owners if o not in self.nokey_owners] if keep_dead_letters else self.owners
        keyed = [a for o in self.nokey_owners for a in self.addresses[o] if a in self.keys]
        keyless = [a for o in self.nokey_owners for a in self.addresses[o] if a not in self.keys]
        devices = [d for d in self.devices if d["owner"] in free]
        options = ["register", "register"] + (["unregister", "refilter", "refilter"] if len(devices) > 3 else []) \
            + (["drop-key"] if keyed else []) + (["add-key"] if keyless and not keep_dead_letters else [])
        what = rnd.choice(options)
        if what == "register":
            owner = rnd.choice(free)
            kinds = ["ios", "android", "fcm"] + ([] if owner in self.nokey_owners else ["webhook"])
            device = self.registration(f"dev-{{}}-{self.next_device}", owner, rnd.choice(kinds))
            self.next_device += 1
            self.devices.append(device)
            self.by_owner[owner].append(device)
            return f"register {device['deviceId']}", [(h.DEVICES, device["deviceId"], device)]
        if what in ("unregister", "refilter"):
            old = rnd.choice(devices)
            self.devices.remove(old)
            self.by_owner[old["owner"]].remove(old)
            if what == "unregister":
                del self.wants[old["deviceId"]]
                return f"unregister {old['deviceId']}", [(h.DEVICES, old["deviceId"], None)]
            device = self.registration(old["deviceId"], old["owner"], self.kinds[old["deviceId"]])
            self.devices.append(device)
            self.by_owner[device["owner"]].append(device)
            return f"new filter for {device['deviceId']}", [(h.DEVICES, device["deviceId"], device)]
        if what == "drop-key":
            address = rnd.choice(keyed)
            del self.keys[address]
            return f"remove the key of {address}", [(h.KEYS, address, None)]
        address = rnd.choice(keyless)
        owner = next(o for o in self.nokey_owners if address in self.addresses[o])
        self.keys[address] = sudo_client.key_record(rnd.choice(self.private_keys), address, f"key-{address}-2",
                                                    rnd.choice([sudo_client.CBC, sudo_client.GCM]), "SPKI", owner=owner)
        return f"a key for {address}", [(h.KEYS, address, self.keys[address])]

    def outcome(self, ev: dict) -> tuple[list[str], bool]:
        """(jobIds, is_dead_letter) for a valid event published for the first time."""
        wanting = [d for d in self.by_owner.get(ev["owner"], [])
                   if self.wants[d["deviceId"]] and ev["emailAddressId"] in self.wants[d["deviceId"]]]
        if not wanting:
            return [], False
        if ev["emailAddressId"] not in self.keys:
            return [], True
        return [sudo_client.job_id(ev["emailAddressId"], ev["messageId"], d["deviceId"])
                for d in wanting], False


def make_events(plan: Plan, n: int, rnd: random.Random):
    """Yields (kind, key, value bytes, event or None). kind: good | bad | dup; a dup is a placeholder that
    `Expectations.resolve` fills, at publish time, with an email published and processed before."""
    for i in range(n):
        r = rnd.random()
        if r < 0.03:
            o = rnd.choice(plan.owners)
            a = rnd.choice(plan.addresses[o])
            if rnd.random() < 0.5:
                raw = f'{{"owner":"{o}","emailAddressId":"{a}","messageId":"bad-{i}"'.encode()
            else:
                ev = h.event(f"bad-{i}", a, owner=o)
                del ev["messageId"]
                ev["nonce"] = i
                raw = h.encode_value(ev)
            yield "bad", a, raw, None
        elif r < 0.06:
            yield "dup", None, None, None
        else:
            o = rnd.choice(plan.owners)
            a = rnd.choice(plan.addresses[o])
            ev = h.event(f"msg-{i}", a, owner=o, sudo=f"sudo-{o}",
                         subject=f"Chaos message {i} " + "x" * rnd.randint(0, 200),
                         receivedAtEpochMs=1718330541336 + i)
            yield "good", a, h.encode_value(ev), ev


class Expectations:
    """The outputs expected, event by event as it is published: the configuration the broker acknowledged before
    an event was published applies to it (CONTRACT §8), so each is judged by the plan as it is at that moment."""

    def __init__(self, plan: Plan, rnd: random.Random):
        self.plan = plan
        self.rnd = rnd
        self.jobs: dict[str, str] = {}  # jobId -> the mailpush-source of the publication that makes it
        self.dead: dict[str, bytes] = {}  # mailpush-source -> the original value
        self.also_from: dict[str, set[str]] = collections.defaultdict(set)  # jobId -> its email's later publications
        # Published emails that were processed (jobs, or no device wanted them): publishing one again is a duplicate.
        # Never one that became a dead letter: whether its second copy is a second dead letter is left open.
        self.processed: list[tuple[str, bytes, list[str]]] = []

    def resolve(self, burst: list) -> list:
        """The burst with each dup placeholder made a publication of an email processed before (or left out)."""
        out = []
        for kind, key, raw, ev in burst:
            if kind == "dup":
                if not self.processed:
                    continue
                key, raw, jobs = self.rnd.choice(self.processed)
                ev = jobs
            out.append((kind, key, raw, ev))
        return out

    def published(self, item, rec: h.Record, counts: collections.Counter) -> None:
        kind, key, raw, ev = item
        counts[kind] += 1
        if kind == "bad":
            self.dead[rec.pos] = raw
        elif kind == "good":
            jobs, dead = self.plan.outcome(ev)
            for j in jobs:
                self.jobs[j] = rec.pos
            if dead:
                self.dead[rec.pos] = raw
                counts["no-key"] += 1
            else:
                self.processed.append((key, raw, jobs))
        else:  # a replay may read the later publication first
            for j in ev:
                self.also_from[j].add(rec.pos)


def caught_up(world: h.World) -> bool:
    """Whether every event published so far is processed: each event partition's offset in the state topic (what
    `mailpush offsets --brokers` shows) has reached the partition's end."""
    ends = world.kafka.end_offsets(h.EVENTS)
    p = world.run_cli(["offsets", "--brokers", world.bootstrap, "--state-dir", str(world.workdir / "operator")],
                      timeout=60)
    if p.returncode != 0 or "\nfleet (" not in p.stdout:
        return False
    rows = [line.split() for line in p.stdout.split("\nfleet (", 1)[1].splitlines()[2:]]
    offsets = {int(r[0]): int(r[1]) for r in rows if len(r) > 1 and r[0].isdigit() and r[1].isdigit()}
    return all(offsets.get(partition, 0) >= end for partition, end in ends.items() if end > 0)


def change_config(world: h.World, plan: Plan, counts: collections.Counter, keep_dead_letters: bool,
                  timeout: float) -> None:
    """A configuration change, once every event published so far is processed (the contract fixes the config an
    event sees from below only: what the broker acknowledged before it was published; an event processed later
    sees newer config too), acknowledged by the broker before the next events are published."""
    h.wait_for(lambda: caught_up(world), timeout, "every event published so far processed, before a config change",
               interval=0.5)
    what, records = plan.change(keep_dead_letters)
    world.kafka.produce_many(records)
    counts["config"] += 1
    log(f"config change #{counts['config']}: {what}")


def tally(name: str, expected: set | collections.Counter, ids: list) -> tuple[str, bool]:
    """Each expected id present once, or as many times as a Counter says (a dead letter that replays wrote again)."""
    wanted = expected if isinstance(expected, collections.Counter) else collections.Counter(expected)
    counts = collections.Counter(ids)
    dups = sum(c - wanted[i] for i, c in counts.items() if i in wanted and c > wanted[i])
    missing = sum(n - counts[i] for i, n in wanted.items() if counts[i] < n)
    unexpected = sum(c for i, c in counts.items() if i not in wanted)
    line = (f"{name}: expected={sum(wanted.values())} present={len(ids)} duplicates={dups} "
            f"missing={missing} unexpected={unexpected}")
    return line, dups == 0 and missing == 0 and unexpected == 0


REPLAY_RANGE = re.compile(r"partition (\d+) \[(\d+), (\d+)\)")
REPLAY_DONE = re.compile(r"replayed (\d+) events: (\d+) jobs, (\d+) dead letters")


class FleetReplay:
    """A `mailpush replay` started beside the fleet, which executes it through the state topic."""

    def __init__(self, world: h.World, workdir: Path, n: int, from_offset: int):
        self.from_offset = from_offset
        self._ranges: dict[int, tuple[int, int]] = {}
        self.proc = world.spawn(f"replay{n}", [world.bin, "replay", "--brokers", world.bootstrap,
                                               "--from-offset", str(from_offset),
                                               "--state-dir", str(workdir / f"replay-{n}")])

    def ranges(self) -> dict[int, tuple[int, int]]:
        """The event partitions' ranges the command resolved (it prints them first)."""
        if not self._ranges:
            line = next((ln for ln in self.proc.log_text().splitlines() if ln.startswith("replay: partition")), "")
            self._ranges = {int(p): (int(a), int(b)) for p, a, b in REPLAY_RANGE.findall(line)}
        return self._ranges

    def covers(self, pos: str) -> bool:
        _, p, o = pos.rsplit("/", 2)
        lo, hi = self.ranges().get(int(p), (0, 0))
        return lo <= int(o) < hi

    def dead_letters(self) -> int | None:
        """The dead letters the command reported written, once it finished."""
        done = REPLAY_DONE.search(self.proc.log_text())
        return int(done.group(3)) if done else None


def open_world(args, prefix: str, what: str) -> tuple[h.World, Path] | None:
    """The binary checked, the work directory made and a World on it; None (after saying why) if no binary."""
    os.environ["MAILPUSH_BIN"] = os.path.abspath(args.bin)
    try:
        binary = h.require_bin()
    except h.HarnessError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"{what} seed={args.seed} events={args.events} devices={args.devices} workdir={workdir}")
    return h.World(workdir, binary), workdir


def register(world: h.World, args, rnd: random.Random) -> "Plan":
    """Starts the devbroker and publishes the plan's devices and keys."""
    world.devbroker(partitions=args.partitions)
    keys = [sudo_client.generate_key(), sudo_client.generate_key()]
    plan = Plan(rnd, args.devices, keys)
    world.kafka.produce_many([(h.DEVICES, d["deviceId"], d) for d in plan.devices] +
                             [(h.KEYS, a, k) for a, k in plan.keys.items()])
    return plan


def run(args) -> int:
    rnd = random.Random(args.seed)
    opened = open_world(args, "mailpush-chaos-", f"kills={args.kills}")
    if opened is None:
        return 2
    world, workdir = opened
    ok = False
    try:
        plan = register(world, args, rnd)
        kafka = world.kafka
        log(f"registered {len(plan.devices)} devices of {len(plan.owners)} owners, "
            f"{len(plan.keys)} keys, {sum(len(v) for v in plan.addresses.values()) - len(plan.keys)} "
            f"addresses without key")

        state = workdir / "state"
        svc_args = ["--sponsor-webhook-url", WEBHOOK_URL] + list(args.extra or [])
        if args.batch_size:
            svc_args += ["--batch-size", str(args.batch_size)]
        if args.pairs:
            svc_args += ["--log-level", "debug"]  # "batch committed" tells when a restart took its first batch
        pairs_left = [args.pairs]
        svc = world.service(state_dir=state, args=svc_args)

        expect = Expectations(plan, rnd)
        expected_jobs, expected_dead = expect.jobs, expect.dead
        items = list(make_events(plan, args.events, rnd))
        bursts, i = [], 0
        while i < len(items):
            # Enough bursts that most kills land while events are still arriving (a backlog to crash in).
            n = rnd.randint(20, max(40, min(200, 2 * args.events // max(1, args.kills) - 20)))
            bursts.append(items[i:i + n])
            i += n
        n_publish_kills = min(len(bursts), (args.kills * 2 + 2) // 3)
        kill_after = set(rnd.sample(range(len(bursts)), n_publish_kills))
        change_before = set(rnd.sample(range(len(bursts)), min(len(bursts), args.config_changes)))
        kills_done = 0
        counts = collections.Counter()

        started = {"at": time.monotonic()}

        def kill_and_restart(svc):
            nonlocal kills_done
            # Mostly kill a process that has been up a while (mid-work); sometimes one that is
            # still starting or recovering.
            if rnd.random() < 0.75:
                min_up = rnd.uniform(0.5, 2.5)
                wait = started["at"] + min_up - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            time.sleep(rnd.uniform(0, args.max_kill_delay))
            if svc.proc.alive():
                svc.kill()
                kills_done += 1
                log(f"SIGKILL #{kills_done}")
            else:
                raise h.HarnessError(f"mailpush run had exited with {svc.proc.returncode}\n"
                                     f"{svc.proc.log_tail()}")
            restarted = svc.restart(wait_ready=False)
            if pairs_left[0] > 0 and rnd.random() < args.pair_fraction:
                # A pair: the second kill 0–50 ms after the restart committed its first batch, while the
                # first crash's unfinished batch may still be being recovered (CONTRACT §8).
                pairs_left[0] -= 1
                first_batch = wait_first_batch(restarted)
                time.sleep(rnd.uniform(0, 0.05))
                if not restarted.proc.alive():
                    raise h.HarnessError(f"mailpush run had exited with {restarted.proc.returncode}\n"
                                         f"{restarted.proc.log_tail()}")
                restarted.kill()
                kills_done += 1
                counts["pairs"] += 1
                log(f"SIGKILL #{kills_done} (pair, {'after the first batch' if first_batch else 'no batch yet'})")
                restarted = restarted.restart(wait_ready=False)
            if rnd.random() < 0.5:
                restarted.wait_ready(120)
            started["at"] = time.monotonic()
            return restarted

        def wait_first_batch(svc) -> bool:
            """Waits (up to 5 s: there may be nothing left to do) until the process logged its first batch."""
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if "batch committed" in svc.proc.log_text():
                    return True
                if not svc.proc.alive():
                    return False
                time.sleep(0.002)
            return False

        for b, burst in enumerate(bursts):
            if b in change_before:
                change_config(world, plan, counts, keep_dead_letters=False, timeout=args.timeout)
            burst = expect.resolve(burst)
            recs = kafka.produce_many([(h.EVENTS, key, raw) for _, key, raw, _ in burst])
            for item, rec in zip(burst, recs):
                expect.published(item, rec, counts)
            if b in kill_after:
                svc = kill_and_restart(svc)
            else:
                time.sleep(rnd.uniform(0, 0.2))
        log(f"published {dict(counts)} in {len(bursts)} bursts; expecting {len(expected_jobs)} "
            f"jobs and {len(expected_dead)} dead letters")

        while kills_done < args.kills:  # the rest while mailpush catches up
            svc = kill_and_restart(svc)
        if not svc.proc.alive():
            raise h.HarnessError(f"mailpush run exited with {svc.proc.returncode}\n{svc.proc.log_tail()}")
        svc.wait_ready(120)

        log("waiting for mailpush to catch up")
        t0 = time.monotonic()
        dropped = retention_losses(world.bootstrap,
                                   [h.JOBS, h.DEAD], timeout=min(args.timeout, 120))
        if dropped:
            log("the development broker's retention (about 5 MB per partition) dropped output records: "
                + ", ".join(f"{t}/{p} from offset 0 to {lo}" for (t, p), lo in sorted(dropped.items()))
                + "; rerun with more --partitions or fewer --events")
            return 2
        jobs = kafka.consume(h.JOBS, min_count=len(expected_jobs), timeout=args.timeout,
                             idle=args.idle)
        dead = kafka.consume(h.DEAD, min_count=len(expected_dead),
                             timeout=max(10, args.timeout - (time.monotonic() - t0)), idle=args.idle)
        log(f"read {len(jobs)} job records and {len(dead)} dead letters "
            f"after {time.monotonic() - t0:.1f}s")

        job_ids, wrong_source, wrong_key = [], 0, 0
        for r in jobs:
            try:
                j = r.json()
                jid = j["jobId"]
            except Exception:  # noqa: BLE001
                jid = f"unparsable@{r.pos}"
            job_ids.append(jid)
            if jid in expected_jobs:
                if r.headers.get("mailpush-source") != expected_jobs[jid]:
                    wrong_source += 1
                if r.key_str != j.get("deviceId") or r.headers.get("mailpush-job-id") != jid:
                    wrong_key += 1
        dl_ids, wrong_value = [], 0
        for r in dead:
            src = r.headers.get("mailpush-source", f"no-source@{r.pos}")
            dl_ids.append(src)
            if src in expected_dead and r.value != expected_dead[src]:
                wrong_value += 1
        line_j, ok_j = tally("jobs", set(expected_jobs), job_ids)
        line_d, ok_d = tally("dead-letters", set(expected_dead), dl_ids)
        print(line_j, flush=True)
        print(line_d, flush=True)
        print(f"checks: kills={kills_done} pairs={counts['pairs']} config_changes={counts['config']} "
              f"job_source_mismatch={wrong_source} "
              f"job_key_or_header_mismatch={wrong_key} dead_letter_value_mismatch={wrong_value}",
              flush=True)
        if args.verbose or not (ok_j and ok_d):
            c = collections.Counter(job_ids)
            for jid in sorted(set(expected_jobs) - set(c))[:10]:
                print(f"  missing job {jid} from {expected_jobs[jid]}")
            for jid, n in [(k, v) for k, v in c.items() if v > 1][:10]:
                print(f"  duplicate job {jid} x{n}")
            cd = collections.Counter(dl_ids)
            for src in sorted(set(expected_dead) - set(cd))[:10]:
                print(f"  missing dead letter for {src}")
            for src, n in [(k, v) for k, v in cd.items() if v > 1 or k not in expected_dead][:10]:
                print(f"  {'duplicate' if src in expected_dead else 'unexpected'} dead letter {src} x{n}")

        rc = svc.stop(signal.SIGTERM, timeout=60)
        print(f"final SIGTERM exit code={rc}", flush=True)
        ok = ok_j and ok_d and wrong_source == 0 and wrong_key == 0 and wrong_value == 0 and rc == 0
        return 0 if ok else 1
    except h.HarnessError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    finally:
        world.close()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs and state kept in {workdir}", flush=True)


FLEET_ARGS = ["--group", "chaos"]  # the default group timing: a 6 s session
DISRUPTIONS = ("kill", "term", "stop", "replace", "cut")


def run_fleet(args) -> int:
    """--fleet N: the group's instances are disrupted one at a time while events are published."""
    rnd = random.Random(args.seed)
    opened = open_world(args, "mailpush-chaos-fleet-", f"fleet={args.fleet} disruptions={args.kills}")
    if opened is None:
        return 2
    world, workdir = opened
    ok = False
    hosts: list[CutOffHost | None] = [None] * args.fleet
    try:
        plan = register(world, args, rnd)
        kafka = world.kafka
        svc_args = ["--sponsor-webhook-url", WEBHOOK_URL] + FLEET_ARGS + list(args.extra or [])
        if args.batch_size:
            svc_args += ["--batch-size", str(args.batch_size)]
        outputs = OutputCollector(world.bootstrap, [h.JOBS, h.DEAD])
        if args.cuts:  # one network namespace per place in the fleet; a replacement takes its predecessor's
            for n in range(args.fleet):
                hosts[n] = CutOffHost()
        fleet = [world.service(args=svc_args, name=f"i{n}", host=hosts[n]) for n in range(args.fleet)]
        born = [args.fleet]
        expect = Expectations(plan, rnd)
        expected_jobs, expected_dead = expect.jobs, expect.dead
        items = list(make_events(plan, args.events, rnd))
        bursts, i = [], 0
        while i < len(items):
            n = rnd.randint(20, 60)
            bursts.append(items[i:i + n])
            i += n
        disrupt_after = set(rnd.sample(range(len(bursts)), min(len(bursts), args.kills)))
        replay_after = set(rnd.sample(range(len(bursts)), min(len(bursts), args.replays)))
        replays: list[FleetReplay] = []
        change_before = set(rnd.sample(range(len(bursts)), min(len(bursts), args.config_changes)))
        counts = collections.Counter()

        def settled() -> bool:
            try:
                return sum(int(s.metrics().get("mailpush_owned_partitions", 0)) for s in fleet) == args.partitions \
                    and all(s.is_ready() for s in fleet)
            except h.HarnessError:
                return False

        def disrupt():
            k = rnd.randrange(len(fleet))
            svc = fleet[k]
            action = rnd.choice(["kill", "kill", "term", "stop", "replace"] + (["cut"] if args.cuts else []))
            counts[action] += 1
            if not svc.proc.alive():
                raise h.HarnessError(f"an instance had exited with {svc.proc.returncode}\n{svc.proc.log_tail()}")
            if action == "kill":
                svc.kill()
                fleet[k] = svc.restart(wait_ready=False)
            elif action == "term":
                # A signal that lands before the process reaches `run` (loading, argument parsing: a debug build
                # under this load can take a second) can only take its default action; what is tested is the
                # service's handling of it, from its first log line on.
                h.wait_for(lambda: '"level"' in svc.proc.log_text() or not svc.proc.alive(), 30,
                           "the instance's first log line", on_fail=svc.proc.log_tail)
                rc = svc.stop(signal.SIGTERM, timeout=60)
                if rc != 0:
                    raise h.HarnessError(f"SIGTERM exit code {rc}\n{svc.proc.log_tail()}")
                fleet[k] = svc.restart(wait_ready=False)
            elif action == "stop":
                svc.proc.send_signal(signal.SIGSTOP)
                time.sleep(rnd.uniform(7, 10))  # past the 6 s session timeout
                svc.proc.send_signal(signal.SIGCONT)
            elif action == "cut":
                # The development broker (librdkafka's mock cluster, 2.0.2 and later) aborts when a member whose
                # JoinGroup it still holds joins again on a new connection: a member cut off in the middle of a
                # rebalance does that once healed (`rd_kafka_mock_cgrp_member_add: Assertion !member->resp`).
                # A real broker answers the new request. So a cut waits for a settled fleet.
                h.wait_for(settled, 120, "a settled fleet before a cut",
                           on_fail=lambda: "\n".join(s.proc.log_tail(2000) for s in fleet))
                hosts[k].cut()
                time.sleep(rnd.uniform(2, 20))  # shorter and longer than the 6 s session timeout
                hosts[k].heal()
            else:
                svc.kill()
                fleet[k] = world.service(args=svc_args, name=f"i{born[0]}", wait_ready=False, host=hosts[k])
                born[0] += 1
            log(f"disruption #{sum(counts[a] for a in DISRUPTIONS)}: {action} instance {k}")

        for b, burst in enumerate(bursts):
            if b in change_before:
                change_config(world, plan, counts, keep_dead_letters=args.replays > 0, timeout=args.timeout)
            burst = expect.resolve(burst)
            recs = kafka.produce_many([(h.EVENTS, key, raw) for _, key, raw, _ in burst])
            for item, rec in zip(burst, recs):
                expect.published(item, rec, counts)
            if b in replay_after:
                # From the start, or from part way: every partition has about (published / partitions) events.
                published = sum(counts[k] for k in ("good", "bad", "dup"))
                start = rnd.choice([0, rnd.randrange(max(1, published // args.partitions))])
                replays.append(FleetReplay(world, workdir, len(replays), start))
                log(f"replay #{len(replays)} from offset {start}")
            if b in disrupt_after:
                disrupt()
            else:
                time.sleep(rnd.uniform(0.05, 0.3))
        disruptions = sum(counts[a] for a in DISRUPTIONS)
        while disruptions < args.kills:
            disrupt()
            disruptions += 1
        for r in replays:
            h.wait_for(lambda: not r.proc.alive(), args.timeout, f"{r.proc.name} to finish",
                       on_fail=lambda: r.proc.log_tail() + "\n".join(s.proc.log_tail(2000) for s in fleet))
            if r.proc.returncode != 0 or r.dead_letters() is None or not r.ranges():
                raise h.HarnessError(f"{r.proc.name} exited {r.proc.returncode}\n{r.proc.log_tail()}")
        # A replay (no --force) writes no job again, but an event it reads that is a dead letter becomes one again.
        covered = {r.proc.name: {pos for pos in expected_dead if r.covers(pos)} for r in replays}
        dead_wanted = collections.Counter({pos: 1 + sum(pos in c for c in covered.values()) for pos in expected_dead})
        replay_miscounts = [f"{r.proc.name}: reported {r.dead_letters()} dead letters, its ranges hold "
                            f"{len(covered[r.proc.name])}"
                            for r in replays if r.dead_letters() != len(covered[r.proc.name])]
        log(f"published {counts['good'] + counts['bad'] + counts['dup']} events; expecting {len(expected_jobs)} jobs and "
            f"{sum(dead_wanted.values())} dead letters ({len(replays)} replays)")
        read = outputs.wait({h.JOBS: len(expected_jobs), h.DEAD: sum(dead_wanted.values())}, timeout=args.timeout,
                            idle=max(args.idle, 8))
        jobs, dead = read[h.JOBS], read[h.DEAD]
        gone = outputs.gone_before_read()
        if gone:
            log("the development broker's retention (about 5 MB per partition) dropped output records before they "
                "were read: " + ", ".join(f"{t}/{p} before offset {lo}" for (t, p), lo in sorted(gone.items()))
                + "; rerun with more --partitions or fewer --events")
            return 2
        dropped_since = retention_losses(world.bootstrap, [h.JOBS, h.DEAD], timeout=15)
        if dropped_since:
            log("read in time, though the broker has dropped the oldest records since: "
                + ", ".join(f"{t}/{p} before offset {lo}" for (t, p), lo in sorted(dropped_since.items())))
        job_ids = [r.headers.get("mailpush-job-id") for r in jobs]
        dl_ids = [r.headers.get("mailpush-source", f"no-source@{r.pos}") for r in dead]
        wrong_source = 0
        for r in jobs:
            jid, source = r.headers.get("mailpush-job-id"), r.headers.get("mailpush-source")
            # Without replays an email's first publication makes its jobs; a replay may read a later one first.
            if jid in expected_jobs and source != expected_jobs[jid] and not (replays and source in expect.also_from[jid]):
                wrong_source += 1
        line_j, ok_j = tally("jobs", set(expected_jobs), job_ids)
        line_d, ok_d = tally("dead-letters", dead_wanted, dl_ids)
        print(line_j, flush=True)
        print(line_d, flush=True)
        print(f"checks: instances={args.fleet} started={born[0]} kills={counts['kill']} terms={counts['term']} "
              f"pauses={counts['stop']} replaced={counts['replace']} cuts={counts['cut']} replays={len(replays)} "
              f"config_changes={counts['config']} job_source_mismatch={wrong_source}", flush=True)
        for line in replay_miscounts:
            print(f"  replay count mismatch: {line}", flush=True)
        if not (ok_j and ok_d):
            c = collections.Counter(job_ids)
            for jid, n in [(k, v) for k, v in c.items() if v > 1][:10]:
                where = [f"{r.pos}<-{r.headers.get('mailpush-source')}" for r in jobs if r.headers.get("mailpush-job-id") == jid]
                print(f"  duplicate job {jid} x{n}: {where}")
            for jid in sorted(set(expected_jobs) - set(c))[:10]:
                print(f"  missing job {jid} from {expected_jobs[jid]}")
        rcs = [svc.stop(signal.SIGTERM, timeout=60) for svc in fleet]
        print(f"final SIGTERM exit codes={rcs}", flush=True)
        ok = ok_j and ok_d and wrong_source == 0 and not replay_miscounts and all(rc == 0 for rc in rcs)
        return 0 if ok else 1
    except h.HarnessError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    finally:
        world.close()
        for host in hosts:
            if host:
                host.close()
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs and state kept in {workdir}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=3000, help="events to publish (default 3000)")
    ap.add_argument("--devices", type=int, default=40, help="devices to register (default 40)")
    ap.add_argument("--kills", type=int, default=5, help="minimum number of SIGKILLs (default 5)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="of the kills, up to this many are pairs: a second kill 0-50 ms after the restart's "
                         "first batch (default 0)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="mailpush run --batch-size (default: its own); small batches make a restart re-read "
                         "only part of an unfinished batch at first")
    ap.add_argument("--pair-fraction", type=float, default=0.5,
                    help="chance that a kill is followed by a second one while pairs remain (default 0.5)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    ap.add_argument("--bin", default=h.mailpush_bin(), help="mailpush binary (default $MAILPUSH_BIN "
                    "or <repo>/.build/debug/mailpush)")
    ap.add_argument("--partitions", type=int, default=4, help="devbroker partitions (default 4)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for catch-up (default 300)")
    ap.add_argument("--idle", type=float, default=5, help="output idle seconds that end the wait (default 5)")
    ap.add_argument("--max-kill-delay", type=float, default=0.8,
                    help="a kill comes up to this many seconds after a burst (default 0.8)")
    ap.add_argument("--workdir", help="where logs and state go (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir even on success")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--fleet", type=int, default=0,
                    help="run N instances of one consumer group and disrupt them one at a time (default: one instance)")
    ap.add_argument("--cuts", action="store_true",
                    help="with --fleet: each instance in a network namespace of its own, and some disruptions cut one "
                         "off the network for 2-20 s (needs root, ip and iptables)")
    ap.add_argument("--replays", type=int, default=0,
                    help="with --fleet: start this many `mailpush replay` commands (no --force) at random moments, "
                         "from offset 0 or part way, and check that each writes every dead letter of its range once "
                         "more and no job again")
    ap.add_argument("--config-changes", type=int, default=0,
                    help="change the configuration this many times between bursts (register, unregister or re-filter "
                         "a device, remove or add an address key); each event's outputs follow the configuration "
                         "acknowledged before it was published")
    ap.add_argument("extra", nargs="*", help="extra `mailpush run` flags, after --")
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    if args.events < 1 or args.devices < 1 or min(args.kills, args.replays, args.config_changes) < 0:
        ap.error("--events and --devices must be positive, --kills, --replays and --config-changes not negative")
    if args.replays and not args.fleet:
        ap.error("--replays needs --fleet")
    # A crash of mailpush that its own backtrace cannot report (a stack overflow, say) leaves a core dump in the
    # work directory (kept when a run fails) where the kernel writes one there (core_pattern `core`).
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    # A SIGTERM (a CI job's timeout, `kill`) unwinds like Ctrl-C, so the processes, network namespaces and NAT
    # rules of the run are removed, not left behind for the next run to trip over.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    return run_fleet(args) if args.fleet else run(args)


if __name__ == "__main__":
    sys.exit(main())
