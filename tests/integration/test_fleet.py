"""Group ownership (§8.1): instances of one consumer group share the event partitions; a partition's state
moves with it through the state topic, and every expected job is written exactly once across joins, graceful
stops, kills and pauses."""

from __future__ import annotations

import collections
import json
import signal
import threading
import time

import pytest

import guarantees
import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS

# The default group timing (session 6 s): the development broker waits session timeout - 1 s in each rebalance round.
GROUP = ["--group", "fleet-test"]


def owned(svc) -> int:
    try:
        return int(svc.metrics().get("mailpush_owned_partitions", 0))
    except Exception:
        return -1


def ready(svc) -> bool:
    try:
        return svc.is_ready()
    except Exception:
        return False


def wait_owned(svcs, total, timeout=60, steady=3.0):
    """Until the instances own `total` partitions between them, each some, all ready (no takeover under way),
    for `steady` seconds in a row (a process just resumed from SIGSTOP reports its old gauge for a moment)."""
    last = {"since": None}

    def done():
        last["got"] = [owned(s) for s in svcs]
        settled = sum(last["got"]) == total and all(n > 0 for n in last["got"]) and all(ready(s) for s in svcs)
        if not settled:
            last["since"] = None
            return False
        last["since"] = last["since"] or time.monotonic()
        return time.monotonic() - last["since"] >= steady
    h.wait_for(done, timeout, f"{len(svcs)} instances owning {total} partitions",
               on_fail=lambda: f"owned: {last.get('got')}\n" + "\n".join(s.proc.log_tail(3000) for s in svcs))


def state_records(kafka, min_count: int, idle: float) -> list[tuple[h.Record, dict]]:
    """The state topic's records with values, decoded and checked against schemas/partition-state.v1, in
    partition and log order."""
    state = kafka.consume("mailpush.state", min_count=min_count, timeout=30, idle=idle)
    decoded = [(r, json.loads(r.value)) for r in sorted(state, key=lambda r: (r.partition, r.offset)) if r.value]
    validator = h.load_schema_validator("partition-state.v1.schema.json")
    for record, value in decoded:
        problems = [e.message for e in validator.iter_errors(value)]
        assert not problems, (record.partition, record.offset, problems, value)
    return decoded


def email(addr: str, message_id: str) -> tuple[dict, str]:
    """The event of email `message_id` to `addr`, for `setup_config`'s owner of it (user-N, N = the address's
    number mod 8), and the job id of that owner's one device."""
    o = int(addr.split("-")[-1]) % 8
    return h.event(message_id, addr, owner=f"user-{o}"), sudo_client.job_id(addr, message_id, f"dev-{o}")


def setup_config(kafka, keys, owners=8, addresses=32):
    for o in range(owners):
        kafka.produce(DEVICES, f"dev-{o}", h.ios_device(f"dev-{o}", owner=f"user-{o}"))
    addrs = [f"em-add-{i}" for i in range(addresses)]
    for a in addrs:
        kafka.produce(KEYS, a, sudo_client.key_record(keys.a, a, f"k-{a}", owner=f"user-{int(a.split('-')[-1]) % owners}"))
    return addrs


def test_one_instance_in_a_group_processes_every_partition(world, kafka, keys):
    addrs = setup_config(kafka, keys)
    svc = world.service(args=GROUP)
    wait_owned([svc], len(kafka.partitions(EVENTS)))
    expected = set()
    for i, a in enumerate(addrs):
        event, job = email(a, f"m-{i}")
        kafka.produce(EVENTS, a, event)
        expected.add(job)
    jobs = kafka.consume(JOBS, min_count=len(expected), timeout=60, idle=2.0)
    got = h.by_job_id(jobs)
    assert set(got) == expected
    assert svc.stop() == 0
    assert "left the consumer group" in svc.proc.log_text()


def test_the_claim_of_a_partition_nobody_processed_bounds_where_its_outputs_can_lie(world, kafka, keys):
    """A successor that finds only the claim (its owner died before any batch record landed) reads the output
    topics back from the claim's marks: they must name every output partition, at or before the first output the
    claimer can write. Before, a fresh claim carried no marks, the successor read back from its own marks, past
    the dead owner's first outputs, and wrote them again (27 duplicate jobs in a `make chaos-fleet` run)."""
    setup_config(kafka, keys)
    # The output topics already hold records (an earlier deployment): a read-back from 0 would be wasted work.
    for i in range(60):
        kafka.produce(JOBS, f"old-{i}", b"{}")
        kafka.produce(DEAD, f"old-{i}", b"{}")
    ends = {f"{topic}/{p}": end for topic in (JOBS, DEAD) for p, end in kafka.end_offsets(topic).items()}
    assert any(ends.values())
    svc = world.service(args=GROUP)
    partitions = len(kafka.partitions(EVENTS))
    wait_owned([svc], partitions)
    claims = [value for _, value in state_records(kafka, min_count=partitions, idle=1.0) if value["kind"] == "claim"]
    assert len(claims) == partitions
    for claim in claims:
        assert claim["marks"] == ends, claim
    assert svc.stop() == 0


def test_a_graceful_stop_leaves_each_state_partition_an_unbroken_chain_ending_in_its_release(world, kafka, keys):
    """Batch records are written while the next batch is delivered; still, per state partition they land in batch
    order, a checkpoint holds the state of the last one before it, and the release comes after the last of them: a
    new owner follows the chain to the end, reading nothing back."""
    addrs = setup_config(kafka, keys)
    svc = world.service(args=GROUP)
    wait_owned([svc], len(kafka.partitions(EVENTS)))
    publisher = Publisher(kafka, addrs, rate=400)
    publisher.start()
    time.sleep(4)
    publisher.stop()
    kafka.consume(JOBS, min_count=len(publisher.expected), timeout=60, idle=1.0)
    assert svc.stop() == 0

    chains: dict[int, list[dict]] = collections.defaultdict(list)
    for record, value in state_records(kafka, min_count=1, idle=2.0):
        chains[record.partition].append(value)
    ends = kafka.end_offsets(EVENTS)
    batches = 0
    for partition, records in chains.items():
        kinds = [r["kind"] for r in records]
        assert kinds[0] == "claim" and kinds[-1] == "release" and set(kinds[1:-1]) <= {"batch", "checkpoint"}, (partition, kinds)
        at, marks = records[0]["offset"], records[0]["marks"]
        for batch in records[1:-1]:
            if batch["kind"] == "checkpoint":
                # The state of the last batch record before it: never ahead of a record it stands for.
                assert (batch["offset"], batch["marks"]) == (at, marks), (partition, "a checkpoint out of order", records)
                continue
            assert batch["from"] == at, (partition, "a batch record out of order or missing", records)
            at, marks = batch["offset"], batch["marks"]
            batches += 1
        assert records[-1]["offset"] == at == ends[partition], (partition, records[-1], ends[partition])
    assert batches > len(chains), "the load made several batches per partition"


class Publisher(threading.Thread):
    """Publishes events at about `rate` a second until stopped; `expected` collects their jobIds."""

    def __init__(self, kafka, addrs, rate=100):
        super().__init__(daemon=True)
        self.kafka, self.addrs, self.rate = kafka, addrs, rate
        self.expected: set[str] = set()
        #: Sources of the events that must become dead letters (every 50th is not JSON).
        self.dead: set[str] = set()
        self.sent = 0
        self.stopping = threading.Event()

    def run(self):
        i = 0
        while not self.stopping.is_set():
            a = self.addrs[i % len(self.addrs)]
            if i % 50 == 49:
                self.dead.add(self.kafka.produce(EVENTS, a, b"{not json").pos)
            else:
                event, job = email(a, f"p-{i}")
                self.kafka.produce(EVENTS, a, event)
                self.expected.add(job)
            i += 1
            self.sent = i
            time.sleep(1 / self.rate)

    def stop(self):
        self.stopping.set()
        self.join(10)


@pytest.mark.runs_for(85)
def test_fleet_grows_loses_members_and_pauses_one_exactly_once(request, tmp_path, keys):
    import conftest
    world = conftest._new_world(request, tmp_path, broker=True, partitions=12)
    kafka = world.kafka
    from guarantees import assert_exactly_once
    addrs = setup_config(kafka, keys)
    a = world.service(args=GROUP, name="a")
    wait_owned([a], 12)
    pub = Publisher(kafka, addrs)
    pub.start()
    try:
        b = world.service(args=GROUP, name="b")
        c = world.service(args=GROUP, name="c")
        wait_owned([a, b, c], 12, timeout=90)
        # A graceful stop hands its partitions over at once.
        disruptions = [("SIGTERM b", time.time())]
        assert b.stop() == 0
        wait_owned([a, c], 12, timeout=60)
        # A pause longer than the session timeout: the others take its partitions; resumed, it writes nothing
        # for them.
        disruptions.append(("SIGSTOP c", time.time()))
        c.proc.send_signal(signal.SIGSTOP)
        time.sleep(12)
        c.proc.send_signal(signal.SIGCONT)
        # Each disruption settles before the next, so that every event's wait is bounded by one of them.
        wait_owned([a, c], 12, timeout=90)
        time.sleep(2)
        # A kill, and one that never comes back; a new member joins.
        disruptions.append(("SIGKILL a, d joins", time.time()))
        a.kill()
        d = world.service(args=GROUP, name="d")
        wait_owned([c, d], 12, timeout=90)
        time.sleep(2)
    finally:
        pub.stop()
    assert pub.sent > 500
    jobs = assert_exactly_once(kafka, pub.expected, timeout=120, idle=3)
    dead = collections.Counter(r.headers.get("mailpush-source") for r in kafka.consume(h.DEAD, min_count=len(pub.dead), timeout=60, idle=1))
    assert set(dead) == pub.dead and all(n == 1 for n in dead.values()), \
        f"dead letters: {len(pub.dead)} expected, {sum(dead.values())} present, twice: {[s for s, n in dead.items() if n > 1][:5]}"
    # Max wait of an event: detection (session timeout, 6 s) + the rebalance rounds (session - 1 s each on the
    # development broker; three when a paused member resumes and rejoins while its partitions are being taken
    # over) + 10 s to resume (CONTRACT §8.1). A job's CreateTime is stamped when it is produced.
    events = {r.pos: r.timestamp_ms for r in kafka.consume(EVENTS, min_count=pub.sent, timeout=60, idle=0.5)}

    def wait_s(job) -> float:
        return (job.timestamp_ms - events[job.headers["mailpush-source"]]) / 1000
    waits = [wait_s(j) for j in jobs]
    bound = 6 + 3 * 5 + 10
    slowest = max(jobs, key=wait_s)
    published = events[slowest.headers["mailpush-source"]] / 1000
    after = [f"{published - at:+.1f} s after {what}" for what, at in disruptions]
    assert max(waits) <= bound, \
        f"an event waited {max(waits):.1f} s for its job (bound {bound} s): {slowest.headers['mailpush-source']}, " \
        f"published {', '.join(after)}"
    print(f"max wait {max(waits):.1f} s ({', '.join(after)}), median {sorted(waits)[len(waits) // 2]:.2f} s")


def publish_processed(kafka, addrs, prefix: str, count: int) -> set[str]:
    """Publishes `count` emails over `addrs` (one device each) and waits for their jobs; returns the job ids."""
    expected = set()
    items = []
    for i in range(count):
        addr = addrs[i % len(addrs)]
        event, job = email(addr, f"{prefix}-{i}")
        items.append((EVENTS, addr, event))
        expected.add(job)
    kafka.produce_many(items)
    kafka.consume(JOBS, min_count=len(expected), timeout=120, idle=1.0)
    return expected


def forced_replay(world, tmp_path) -> h.Proc:
    """`mailpush replay --from-offset 0 --force`, run from outside the fleet (a state directory of its own)."""
    return world.spawn("replay", [world.bin, "replay", "--brokers", world.bootstrap, "--from-offset", "0", "--force",
                                  "--state-dir", str(tmp_path / "replay-state")])


def assert_replayed_once_more(replay, kafka, expected: set[str], timeout: float, what: str, on_fail) -> None:
    """The forced replay of `expected`'s emails finishes and writes each of their jobs exactly once more."""
    h.wait_for(lambda: not replay.alive(), timeout, what, on_fail=on_fail)
    assert replay.returncode == 0, replay.log_tail()
    assert f"replayed {len(expected)} events: {len(expected)} jobs" in replay.log_text(), replay.log_tail()
    counts = collections.Counter(r.headers.get("mailpush-job-id")
                                 for r in kafka.consume(JOBS, min_count=2 * len(expected), timeout=60, idle=2.0))
    assert set(counts) == expected and set(counts.values()) == {2}, counts.most_common(3)


def requested_replay(world, tmp_path) -> h.Proc:
    """`forced_replay`, once it has written its request to the state topic."""
    replay = forced_replay(world, tmp_path)
    h.wait_for(lambda: "requested from the fleet" in replay.log_text(), 60, "the replay request written",
               on_fail=replay.log_tail)
    return replay


def pause_past_the_session(svc, meanwhile=lambda: None):
    """SIGSTOP, `meanwhile()`, 8 s in all past the default 6 s session (the group drops the member), SIGCONT
    whatever happens; returns what `meanwhile` returned."""
    svc.proc.send_signal(signal.SIGSTOP)
    try:
        result = meanwhile()
        time.sleep(8)
        return result
    finally:
        svc.proc.send_signal(signal.SIGCONT)


@pytest.mark.runs_for(50)
def test_replay_covers_every_partition_of_the_fleet_across_a_kill(request, tmp_path, keys):
    """One `mailpush replay` reaches every partition whichever instance owns it; an owner killed mid-replay
    hands its progress over: every job is written exactly once more (--force), none twice, none lost."""
    import conftest
    world = conftest._new_world(request, tmp_path, broker=True, partitions=12)
    kafka = world.kafka
    addrs = setup_config(kafka, keys)
    # Small batches make the replay last long enough for the kill to land in it.
    args = GROUP + ["--batch-size", "10"]
    a = world.service(args=args, name="a")
    b = world.service(args=args, name="b")
    wait_owned([a, b], 12, timeout=90)
    expected = publish_processed(kafka, addrs, "r", 2400)

    replay = forced_replay(world, tmp_path)
    import re

    def replayed() -> int:
        counts = [int(n) for n in re.findall(r"replay: (\d+)/2400 events", replay.log_text())]
        return max(counts, default=0)
    # Killed once the replay is well under way: the new owner must continue the killed owner's parts.
    h.wait_for(lambda: replayed() >= 600, 120, "the replay under way", on_fail=replay.log_tail)
    a.kill()
    h.wait_for(lambda: not replay.alive(), 180, "the replay command to finish", on_fail=lambda: replay.log_tail() + b.proc.log_tail())
    assert replay.returncode == 0, replay.log_tail()
    assert "replayed 2400 events: 2400 jobs" in replay.log_text(), replay.log_tail()
    jobs = kafka.consume(JOBS, min_count=2 * len(expected), timeout=120, idle=3.0)
    counts = collections.Counter(r.headers.get("mailpush-job-id") for r in jobs)
    assert set(counts) == expected
    wrong = {j: n for j, n in counts.items() if n != 2}
    assert not wrong, f"{len(wrong)} jobs not written exactly twice, e.g. {list(wrong.items())[:3]}"
    assert "fleet replay recorded for an owned partition" in b.proc.log_text()


@pytest.mark.runs_for(40)
def test_a_replay_while_no_member_runs_says_so_and_is_done_once_one_does(world, kafka, keys, tmp_path):
    """The fleet's only member is stopped: `mailpush replay` does not wait silently. After 30 s without progress
    it says what it waits for, and the request, kept in the state topic, is executed once a member runs again."""
    addrs = setup_config(kafka, keys)
    svc = world.service()
    expected = publish_processed(kafka, addrs, "q", 40)
    assert svc.stop(signal.SIGTERM) == 0

    replay = forced_replay(world, tmp_path)
    h.wait_for(lambda: "is the fleet running" in replay.log_text(), 60, "the replay saying what it waits for",
               on_fail=replay.log_tail)
    assert replay.alive(), replay.log_tail()
    svc.restart()
    assert_replayed_once_more(replay, kafka, expected, 120, "the replay to finish once a member runs", replay.log_tail)


def test_a_replay_requested_while_its_owner_is_paused_is_done_once_the_owner_resumes(world, kafka, keys, tmp_path):
    """`mailpush replay` asks while the only member is paused past the session timeout. Resumed, the member reads the
    request in a lease renewal and loses its partitions at about the same moment, then gets them back. The replay
    must still run, each of its jobs written exactly once more (--force)."""
    addrs = setup_config(kafka, keys)
    svc = world.service()
    expected = publish_processed(kafka, addrs, "z", 200)
    replay = pause_past_the_session(svc, meanwhile=lambda: requested_replay(world, tmp_path))
    assert_replayed_once_more(replay, kafka, expected, 90, "the replay command to finish",
                              lambda: replay.log_tail() + svc.proc.log_tail())


@pytest.mark.runs_for(30)
def test_a_replay_a_new_owner_took_over_and_lost_before_running_it_is_run_when_the_partitions_come_back(
        world, kafka, keys, tmp_path):
    """A new owner's takeover records the replay its restore found, then waits out the killed owner's lease; paused
    past the session timeout there, it loses the partitions and leaves the replay to their next owner, which is
    itself again. Its restore must find the replay once more: each job written exactly once more (--force)."""
    addrs = setup_config(kafka, keys)
    first = world.service(name="first")
    expected = publish_processed(kafka, addrs, "w", 200)
    first.kill()
    replay = requested_replay(world, tmp_path)
    second = world.service(name="second", wait_ready=False)
    h.wait_for(lambda: "fleet replay recorded for an owned partition" in second.proc.log_text(), 60,
               "the takeover recording the replay", on_fail=second.proc.log_tail, interval=0.02)
    pause_past_the_session(second)  # from within the ~3 s wait for the killed owner's lease
    assert_replayed_once_more(replay, kafka, expected, 90, "the replay command to finish",
                              lambda: replay.log_tail() + second.proc.log_tail())
    assert "are left to their owner" in second.proc.log_text(), "the pause did not land before the replay ran"


@pytest.mark.runs_for(50)
def test_a_former_owner_restores_only_the_tail(world, kafka, keys):
    """A partition that comes back to the instance that owned it reads only the state records written since."""
    from guarantees import assert_exactly_once
    addrs = setup_config(kafka, keys)
    expected = set()

    def publish(prefix, n):
        for i in range(n):
            a = addrs[i % len(addrs)]
            event, job = email(a, f"{prefix}-{i}")
            kafka.produce(EVENTS, a, event)
            expected.add(job)

    a = world.service(args=GROUP, name="a")
    wait_owned([a], 4)
    publish("one", 200)
    kafka.consume(JOBS, min_count=len(expected), timeout=60, idle=0.5)
    b = world.service(args=GROUP, name="b")
    assert a.stop() == 0  # b takes everything over
    wait_owned([b], 4)
    publish("two", 200)
    kafka.consume(JOBS, min_count=len(expected), timeout=60, idle=0.5)
    a2 = a.restart(wait_ready=True)
    assert b.stop() == 0  # and hands everything back to a
    wait_owned([a2], 4)
    publish("three", 100)
    assert_exactly_once(kafka, expected, timeout=60)

    taken = [l for l in a2.proc.log_lines() if l["message"] == "event partition taken over"]
    assert len(taken) == 4, taken
    first = [l for l in a.proc.log_lines() if l["message"] == "event partition taken over"]
    for t in taken:
        assert int(t["restoredFrom"]) > 0, f"partition {t['partition']} was restored from the beginning: {t}"
        assert t["previousOwner"] != "none" and t["released"] == "true", t
    # The first takeover read nothing (a new partition); the second only b's records, not a's own before them.
    assert all(int(t["stateRecords"]) == 0 for t in first), first


def set_fleet_offset(world, tmp_path, assignment):
    """`mailpush offsets --set` as an operator runs it: with --brokers, from a directory of its own (not a member's)."""
    p = world.run_cli(["offsets", "--brokers", world.bootstrap, "--state-dir", str(tmp_path / "operator"),
                       "--set", assignment], timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def fleet_row(world, tmp_path, partition):
    p = world.run_cli(["offsets", "--brokers", world.bootstrap, "--state-dir", str(tmp_path / "operator")], timeout=60)
    assert p.returncode == 0, p.stderr
    table = p.stdout.split("\nfleet (", 1)[1].splitlines()[2:]
    return next(line.split() for line in table if line.split() and line.split()[0] == str(partition))


def a_stopped_fleet_with_events_to_skip(world, kafka, keys):
    """A member processed m-0 (em-add-3) and stopped; m-1 and m-2 wait behind it, for an operator to skip."""
    setup_config(kafka, keys)
    svc = world.service()
    first = kafka.produce(EVENTS, "em-add-3", h.event("m-0", "em-add-3", owner="user-3"))
    kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)
    assert svc.stop() == 0
    for i in (1, 2):
        kafka.produce(EVENTS, "em-add-3", h.event(f"m-{i}", "em-add-3", owner="user-3"))
    return svc, first


def restarted_past_the_skipped_events(svc, kafka, first, end, timeout):
    """m-3 published and the member started again: only m-0 and m-3 became jobs, and its partition was taken over
    at `end`. Returns the member and the takeover's log line."""
    kafka.produce(EVENTS, "em-add-3", h.event("m-3", "em-add-3", owner="user-3"))
    svc = svc.restart()
    jobs = kafka.consume(JOBS, min_count=2, timeout=timeout, idle=2.0)
    assert sorted(h.by_job_id(jobs)) == sorted(sudo_client.job_id("em-add-3", f"m-{i}", "dev-3") for i in (0, 3))
    taken = [l for l in svc.proc.log_lines() if l["message"] == "event partition taken over"
             and l["partition"] == str(first.partition)]
    assert taken and taken[-1]["offset"] == str(end), taken
    return svc, taken[-1]


def test_offsets_set_moves_a_stopped_fleets_partition_for_whoever_claims_it(world, kafka, keys, tmp_path):
    """The events topic lost events, or some are to be skipped: `offsets --set` with a fleet moves the partition in
    the state topic, which the next owner restores from, not in a member's state directory. Before, it set only the
    directory it was given, and the member continued where the state topic said (it processed m-1 and m-2)."""
    svc, first = a_stopped_fleet_with_events_to_skip(world, kafka, keys)

    out = set_fleet_offset(world, tmp_path, f"{EVENTS}:{first.partition}=latest")
    end = first.offset + 3
    assert f"{EVENTS}/{first.partition}: {first.offset + 1} -> {end} (fleet, through mailpush.state)" in out, out
    assert "no running owner took the request up yet" in out, out
    assert not (tmp_path / "operator").exists(), "with a fleet, no state directory is touched"
    row = fleet_row(world, tmp_path, first.partition)
    assert row[1] == str(end) and row[5] == "moving", row
    for bad, named in ((f"{DEVICES}:0=0", DEVICES), (f"{EVENTS}:99=0", "no partition 99")):
        p = world.run_cli(["offsets", "--brokers", world.bootstrap, "--state-dir", str(tmp_path / "operator"),
                           "--set", bad], timeout=60)
        assert p.returncode == h.EXIT_USAGE and named in p.stderr, (bad, p.returncode, p.stderr)
    assert fleet_row(world, tmp_path, first.partition)[1] == str(end), "a refused --set writes nothing"

    svc, taken = restarted_past_the_skipped_events(svc, kafka, first, end, timeout=60)
    assert taken["offsetSetBy"] != "none", taken
    assert fleet_row(world, tmp_path, first.partition)[5] == "owned"
    assert svc.stop() == 0


def test_a_position_request_a_dead_members_claim_raced_is_taken_up_by_the_next_claim(world, kafka, keys, tmp_path):
    """A member restoring a partition when the request lands claims it after the request, without having read it,
    and dies before its first lease renewal (written here as that member would have: its claim's `restoredTo` is
    before the request). The request still waits: `offsets --brokers` shows the partition moving, and the next
    owner continues at the offset set. Before, any claim after a request counted as taking it up, and the next
    owner continued from the dead member's claim (it processed m-1 and m-2)."""
    svc, first = a_stopped_fleet_with_events_to_skip(world, kafka, keys)
    set_fleet_offset(world, tmp_path, f"{EVENTS}:{first.partition}=latest")
    end = first.offset + 3

    records = [(r, v) for r, v in state_records(kafka, min_count=1, idle=1.0) if r.partition == first.partition]
    request = next(r for r, v in records if v["kind"] == "position")
    release = next(v for r, v in reversed(records) if v["kind"] == "release")
    racing = {"v": 1, "kind": "claim", "topic": EVENTS, "partition": first.partition, "epoch": release["epoch"] + 1,
              "owner": "racing-member", "host": "pod-racing", "offset": release["offset"], "marks": release["marks"],
              "restoredTo": request.offset}
    assert not list(h.load_schema_validator("partition-state.v1.schema.json").iter_errors(racing))
    kafka.produce("mailpush.state", f"{EVENTS}/{first.partition}/head", racing, partition=first.partition)
    row = fleet_row(world, tmp_path, first.partition)
    assert row[1] == str(end) and row[5] == "moving", row

    svc, taken = restarted_past_the_skipped_events(svc, kafka, first, end, timeout=90)
    assert taken["previousOwner"] == "racing-member", taken
    assert svc.stop() == 0


def test_offsets_set_moves_a_running_fleets_partition_within_moments(world, kafka, keys, tmp_path):
    """A running owner takes the request up from its next lease renewal: here a partition moved back re-reads its
    events, which the dedupe window drops, and events after them are processed as before."""
    setup_config(kafka, keys)
    svc = world.service()
    sent = [kafka.produce(EVENTS, "em-add-5", h.event(f"r-{i}", "em-add-5", owner="user-5")) for i in range(5)]
    kafka.consume(JOBS, min_count=5, timeout=60, idle=0.5)
    partition = sent[0].partition

    out = set_fleet_offset(world, tmp_path, f"{EVENTS}:{partition}={sent[0].offset}")
    assert f"taken up by their owners: partitions [{partition}]" in out, out
    h.wait_for(lambda: svc.metrics().get("mailpush_duplicate_events_total", 0) == 5, 30,
               "the five re-read events dropped as duplicates")
    assert any(l["message"].startswith("moving event partitions") for l in svc.proc.log_lines())
    kafka.produce(EVENTS, "em-add-5", h.event("r-5", "em-add-5", owner="user-5"))
    counts = collections.Counter(r.headers.get("mailpush-job-id") for r in kafka.consume(JOBS, min_count=6, timeout=60, idle=2.0))
    assert set(counts) == {sudo_client.job_id("em-add-5", f"r-{i}", "dev-5") for i in range(6)}
    assert set(counts.values()) == {1}, counts
    row = fleet_row(world, tmp_path, partition)
    assert row[1] == str(sent[-1].offset + 2) and row[5] == "owned", row
    assert svc.stop() == 0


@pytest.mark.runs_for(35)
def test_a_recreated_events_topic_is_recovered_fleet_wide_without_mistaking_old_outputs_for_new(
        bare_world, tmp_path, keys):
    """docs/operations.md §7.5 with a fleet: the events topic was deleted and created again while the state topic
    and the output topics stayed (simulated: a second development broker holding copies of those three, offsets
    kept). The member stops with exit 64; `offsets --set 'email.received:*=earliest'` through the state topic lets
    it continue at the new log's start. The output topics already hold dead letters naming the new log's offsets
    (written for the old topic after the member's marks, by another member): the read-back of the moved partition
    starts where the request found the output topics, so the new events' dead letters are written all the same."""
    from confluent_kafka import Producer

    def devbroker(name):
        bfile = tmp_path / f"{name}.txt"
        proc = bare_world.spawn(name, [bare_world.bin, "devbroker", "--bootstrap-file", str(bfile)])
        return proc, h.wait_for(lambda: bfile.is_file() and bfile.read_text().strip(), 60, str(bfile), on_fail=proc.log_tail)

    state = tmp_path / "member"
    first, bs1 = devbroker("first")
    old = h.Kafka(bs1)
    old.produce(DEVICES, "dev-1", h.ios_device("dev-1", owner="user-1"))
    svc = bare_world.service(brokers=bs1, state_dir=state)
    # No key for the address: each event is dead-lettered.
    sent = [old.produce(EVENTS, "em-nokey", h.event(f"old-{i}", "em-nokey")) for i in range(3)]
    partition = sent[0].partition
    assert len(old.consume(DEAD, min_count=3, timeout=60, idle=0.5)) == 3
    assert svc.stop() == 0

    second, bs2 = devbroker("second")
    copier = Producer({"bootstrap.servers": bs2, "enable.idempotence": True})
    for topic in ("mailpush.state", JOBS, DEAD, DEVICES):
        for r in sorted(old.consume(topic, timeout=10, idle=0.5), key=lambda r: (r.partition, r.offset)):
            copier.produce(topic, key=r.key, value=r.value, partition=r.partition, headers=list(r.headers.items()))
        assert copier.flush(30) == 0
    first.stop(signal.SIGTERM, 30)
    new = h.Kafka(bs2)
    # Another member's last dead letters for the old topic, after this member's marks.
    for offset in range(3, 6):
        copier.produce(DEAD, key=b"x", value=b'{"reason":"old"}', partition=0,
                       headers=[("mailpush-source", f"{EVENTS}/{partition}/{offset - 3}")])
    assert copier.flush(30) == 0

    svc = bare_world.service(brokers=bs2, state_dir=state, wait_ready=False)
    h.wait_for(lambda: not svc.proc.alive(), 90, "mailpush run to stop", on_fail=svc.proc.log_tail)
    assert svc.proc.returncode == h.EXIT_USAGE, svc.proc.log_tail()

    p = bare_world.run_cli(["offsets", "--brokers", bs2, "--state-dir", str(tmp_path / "operator"),
                            "--set", f"{EVENTS}:*=earliest"], timeout=60)
    assert p.returncode == 0 and f"{EVENTS}/{partition}: 3 -> 0 (fleet, through mailpush.state)" in p.stdout, p.stdout + p.stderr
    for i in range(3):
        assert new.produce(EVENTS, "em-nokey", h.event(f"new-{i}", "em-nokey")).offset == i

    svc = bare_world.service(brokers=bs2, state_dir=state)
    dead = new.consume(DEAD, min_count=9, timeout=60, idle=2.0)
    fresh = [r for r in dead if b"new-" in (r.value or b"")]
    assert sorted(r.headers.get("mailpush-source") for r in fresh) == [f"{EVENTS}/{partition}/{i}" for i in range(3)], \
        [(r.partition, r.offset, r.headers.get("mailpush-source"), (r.value or b"")[-30:]) for r in dead]
    assert len(dead) == 9, len(dead)
    assert svc.stop() == 0


@pytest.mark.runs_for(35)
def test_moving_a_loaded_fleet_back_to_the_start_delivers_nothing_twice(world, kafka, keys, tmp_path):
    """Two members under a steady load; every partition is moved back to the start of its log while events keep
    coming. Each owner takes its requests up between two batches, re-reads what it had processed (the dedupe window
    drops it) and goes on: every event's job exactly once, none lost."""
    addrs = setup_config(kafka, keys)
    a = world.service(args=GROUP, name="a")
    b = world.service(args=GROUP, name="b")
    wait_owned([a, b], len(kafka.partitions(EVENTS)))
    pub = Publisher(kafka, addrs, rate=200)
    pub.start()
    time.sleep(3)
    out = set_fleet_offset(world, tmp_path, f"{EVENTS}:*=earliest")
    assert "taken up by their owners: partitions [0, 1, 2, 3]" in out, out
    time.sleep(3)
    pub.stop()
    counts = collections.Counter(r.headers.get("mailpush-job-id")
                                 for r in kafka.consume(JOBS, min_count=len(pub.expected), timeout=90, idle=3.0))
    assert set(counts) == pub.expected, (len(counts), len(pub.expected))
    assert set(counts.values()) == {1}, counts.most_common(3)
    reread = sum(s.metrics().get("mailpush_duplicate_events_total", 0) for s in (a, b))
    assert reread >= 400, reread
    assert a.stop() == 0 and b.stop() == 0


def test_two_deployments_sharing_the_state_topic_write_each_job_once_and_say_who_took_over(world, kafka, keys):
    """A second release installed with the first one's topics: two groups, each assigned every event partition,
    claim the same state partitions. The fence keeps every job single, and the instance that lost its partitions
    names who claimed them, so a person can tell another deployment from a successor in its own fleet."""
    guarantees.register(kafka, keys)
    first = world.service(args=["--group", "release-a"], name="release-a")
    expected = guarantees.publish(kafka, "before", 100)
    second = world.service(args=["--group", "release-b"], name="release-b")
    for round_ in range(3):
        expected |= guarantees.publish(kafka, f"r{round_}", 100)
        time.sleep(1)
    guarantees.assert_exactly_once(kafka, expected)

    def instance_id(svc) -> str:
        return next(l["instanceId"] for l in svc.proc.log_lines() if l.get("message") == "joining the consumer group")

    fenced = [(svc, l) for svc in (first, second) for l in svc.proc.log_lines()
              if l.get("message") == "a newer owner claimed event partitions; writing nothing more for them"]
    assert fenced, "one of the two lost partitions to the other"
    for svc, line in fenced:
        other = second if svc is first else first
        assert f"instance {instance_id(other)} on " in line["claimedBy"], line


STATE = "mailpush.state"


def newer_version_record(partition: int, epoch: int | None, owner="instance-of-a-newer-release") -> dict:
    """A state record as a later mailpush with another record format (v 2) might write it: the fields this version
    knows, and one it does not."""
    value = {"v": 2, "kind": "claim", "topic": EVENTS, "partition": partition, "owner": owner,
             "host": "mp-mailpush-9", "offset": 0, "marks": {}, "layout": {"shards": 16}}
    if epoch is not None:
        value["epoch"] = epoch
    return value


def test_a_claim_a_newer_version_wrote_fences_this_one(world, kafka, keys, tmp_path):
    """A rolling upgrade, or a rollback that left a newer member running: a member of a newer release claims a
    partition with state records this version cannot read. This one must still step back from it (before, it
    skipped those records and went on writing jobs for the partition beside the newer owner)."""
    guarantees.register(kafka, keys)
    svc = world.service()
    for p in range(4):
        kafka.produce(EVENTS, "em-add-1", h.event(f"before-{p}"), partition=p)
    assert len(kafka.consume(JOBS, min_count=8, timeout=60, idle=0.5)) == 8
    # One claim with an epoch, one without: a newer format may carry it elsewhere, and it is taken as newer.
    kafka.produce(STATE, f"{EVENTS}/1/head", newer_version_record(1, epoch=10**6), partition=1)
    kafka.produce(STATE, f"{EVENTS}/3/head", newer_version_record(3, epoch=None), partition=3)

    def fenced_lines():
        return [l for l in svc.proc.log_lines()
                if l.get("message") == "a newer owner claimed event partitions; writing nothing more for them"]
    h.wait_for(lambda: sum(len(json.loads(l["partitions"])) for l in fenced_lines()) == 2, 30,
               "partitions 1 and 3 given up", on_fail=lambda: svc.proc.log_tail())
    assert sorted(p for l in fenced_lines() for p in json.loads(l["partitions"])) == [1, 3]
    for line in fenced_lines():
        assert "instance instance-of-a-newer-release on mp-mailpush-9, a newer mailpush (state record format 2" \
            in line["claimedBy"], line

    for p in range(4):
        kafka.produce(EVENTS, "em-add-1", h.event(f"after-{p}"), partition=p)
    jobs = kafka.consume(JOBS, min_count=12, timeout=60, idle=3)
    written = collections.Counter(r.headers["mailpush-job-id"] for r in jobs)
    assert len(jobs) == 12 and all(n == 1 for n in written.values()), written
    for p, expect in ((0, True), (1, False), (2, True), (3, False)):
        ids = {sudo_client.job_id("em-add-1", f"after-{p}", d) for d in guarantees.DEVICE_IDS}
        assert (ids <= set(written)) if expect else not (ids & set(written)), (p, written)
    svc.assert_alive()

    # The fleet view says who owns them now, though it cannot read their state.
    rows = {p: fleet_row(world, tmp_path, p) for p in range(4)}
    for p in (1, 3):
        assert rows[p][5] == "newer" and rows[p][6] == "mp-mailpush-9", rows[p]
    for p in (0, 2):
        assert rows[p][5] == "owned", rows[p]
    assert rows[1][4] == str(10**6) and rows[3][4] == "-", rows


def test_a_partition_a_newer_version_wrote_last_is_claimed_above_its_epochs_and_said_so(world, kafka, keys, tmp_path):
    """A rollback: a newer release owned the partitions last and wrote records this version cannot read. The member
    of this version that takes them over claims each with an epoch above the newer owner's (else the newer owner,
    were it still running, would take the claim for a replaced owner's and not step back), waits out that owner's
    in-flight outputs (its release cannot be read), says what it cannot know, and writes every job once. The owner
    after it follows this version's claims and pays for none of that."""
    guarantees.register(kafka, keys)
    first = world.service()
    expected = guarantees.publish(kafka, "before", 20)
    guarantees.assert_exactly_once(kafka, expected)
    assert first.stop(signal.SIGTERM) == 0
    for p in range(4):
        kafka.produce(STATE, f"{EVENTS}/{p}/head", newer_version_record(p, epoch=500 + p), partition=p)

    second = world.service(state_dir=tmp_path / "second")
    expected |= guarantees.publish(kafka, "after", 20)
    guarantees.assert_exactly_once(kafka, expected)
    warned = [l for l in second.proc.log_lines() if l.get("message", "").startswith(
        "event partition taken over from a newer mailpush")]
    assert sorted(int(l["partition"]) for l in warned) == [0, 1, 2, 3], second.proc.log_tail()
    assert all(l["format"] == "2" and l["newerOwner"] == "instance-of-a-newer-release" for l in warned), warned
    taken = {int(l["partition"]): int(l["epoch"]) for l in second.proc.log_lines()
             if l.get("message") == "event partition taken over"}
    assert all(taken[p] > 500 + p for p in range(4)), taken

    # Taken back: the newer version's records stay in the compacted topic, but the next owner follows this
    # version's claims after them, with no warning and no wait for an owner long gone.
    assert second.stop(signal.SIGTERM) == 0
    third = world.service(state_dir=tmp_path / "third")
    expected |= guarantees.publish(kafka, "later", 20)
    guarantees.assert_exactly_once(kafka, expected)
    assert not [l for l in third.proc.log_lines() if "newer mailpush" in l.get("message", "")], third.proc.log_tail()
    taken = {int(l["partition"]): int(l["epoch"]) for l in third.proc.log_lines()
             if l.get("message") == "event partition taken over"}
    assert sorted(taken) == [0, 1, 2, 3] and all(taken[p] > 501 + p for p in range(4)), taken


def test_state_records_no_instance_wrote_are_skipped_and_said_so_not_followed(world, kafka, keys):
    """A state-topic record that no instance can have written (hand-made, or damaged) is skipped with a warning
    that names it and why. Before, one claim with an epoch at 2^63 - 1 made every member that took the partition
    over crash on the claim after it, a replay record with a range near 2^63 crashed the member that recorded it,
    and a claim with a negative offset left its partition unprocessed while the member said it was ready."""
    guarantees.register(kafka, keys)
    top = 2**63 - 1
    forged = {
        0: {"v": 1, "kind": "claim", "topic": EVENTS, "partition": 0, "epoch": top, "owner": "x", "offset": 0,
            "marks": {}},
        1: {"v": 1, "kind": "replay", "topic": EVENTS, "partition": 1, "epoch": -1, "owner": "replay",
            "from": -2**63, "offset": top, "marks": {}, "replayId": "r1"},
        2: {"v": 1, "kind": "claim", "topic": EVENTS, "partition": 2, "epoch": 5, "owner": "x", "offset": -5,
            "marks": {}},
        3: newer_version_record(3, epoch=top),
    }
    keys_of = {0: f"{EVENTS}/0/head", 1: f"{EVENTS}/1/replay/r1", 2: f"{EVENTS}/2/head", 3: f"{EVENTS}/3/head"}
    at = {p: kafka.produce(STATE, keys_of[p], value, partition=p).offset for p, value in forged.items()}

    svc = world.service()
    expected = set()
    for p in range(4):
        kafka.produce(EVENTS, "em-add-1", h.event(f"past-forged-{p}"), partition=p)
        expected |= {sudo_client.job_id("em-add-1", f"past-forged-{p}", d) for d in guarantees.DEVICE_IDS}
    guarantees.assert_exactly_once(kafka, expected, timeout=60)
    svc.assert_alive()

    skipped = {l["record"]: l["why"] for l in svc.proc.log_lines()
               if l.get("message") == "skipped a state-topic record no instance of this version wrote"}
    whys = {p: skipped.get(f"{STATE}/{p}/{at[p]}", "") for p in range(4)}
    assert whys[0].startswith("epoch 9223372036854775807 outside"), skipped
    assert whys[1].startswith("from -9223372036854775808 outside"), skipped
    assert whys[2] == "offset -5", skipped
    assert "newer version" in whys[3], skipped
    assert svc.stop(signal.SIGTERM) == 0
