"""Operating on the state (CONTRACT §8–9, issue 3): `mailpush offsets`, `mailpush replay`, the dedupe rule
on re-reads, and clear failures for a corrupt or unusable state directory."""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from contextlib import closing

import mailpush_harness as h
import sudo_client
from guarantees import DEVICE_IDS, assert_exactly_once, publish, register
from mailpush_harness import DEAD, EVENTS, JOBS, KEYS


# A replay with no service running executes in the command itself, on the state directory it is given: the
# single-instance path, which these tests are about. (With a fleet, the state topic shows owners and the replay goes
# to them: test_fleet.py.)
STATIC = ["--instance", "0", "--instances", "1"]


def processed_state(world, kafka, keys, count=20, args=()):
    """Runs the service over `count` emails and stops it cleanly; returns (state dir, expected jobIds)."""
    register(kafka, keys)
    expected = publish(kafka, "m", count)
    svc = world.service(args=args)
    assert_exactly_once(kafka, expected)
    assert svc.stop(signal.SIGTERM) == 0
    return svc, expected


def offsets(world, svc, *args, brokers=True):
    argv = ["offsets", "--state-dir", str(svc.state_dir)] + (["--brokers", world.bootstrap] if brokers else []) + list(args)
    return world.run_cli(argv, timeout=60)


def stored_event_offsets(text: str) -> dict[int, int]:
    return {int(p): int(o) for p, o in re.findall(r"^email\.received\s+(\d+)\s+(\d+)", text, re.M)}


def test_offsets_shows_what_was_committed_with_lag(world, kafka, keys):
    svc, _ = processed_state(world, kafka, keys)
    p = offsets(world, svc)
    assert p.returncode == 0, p.stderr
    assert "END-OFFSET" in p.stdout and "LAG" in p.stdout
    assert sum(stored_event_offsets(p.stdout).values()) == 20, p.stdout
    assert re.search(r"^mailpush\.devices\s+\d+\s+\d+", p.stdout, re.M), "config offsets are listed too"
    for line in p.stdout.splitlines():
        if line.startswith("email.received"):
            assert line.split()[-1] == "0", f"no lag after processing: {line}"
    without_broker = offsets(world, svc, brokers=False)
    assert without_broker.returncode == 0 and stored_event_offsets(without_broker.stdout) == stored_event_offsets(p.stdout)


def test_listing_offsets_of_a_mistyped_state_directory_says_so_and_creates_nothing(world):
    """Before, `mailpush offsets` created the state directory it was given: a mistyped --state-dir became a new,
    empty one, listed as a service that had stored nothing."""
    missing = world.workdir / "no-such-state"
    p = world.run_cli(["offsets", "--state-dir", str(missing)], timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"no state at {missing}: nothing stored here (`mailpush run` creates it)"
    assert not missing.exists()
    missing.mkdir()  # an empty directory, as a volume mounted for the state: nothing is created in it either
    p = world.run_cli(["offsets", "--state-dir", str(missing)], timeout=60)
    assert p.returncode == 0 and "no state at" in p.stdout, p.stdout + p.stderr
    assert list(missing.iterdir()) == []


def test_offsets_set_confirms_each_change(world, kafka, keys):
    svc, _ = processed_state(world, kafka, keys)
    before = stored_event_offsets(offsets(world, svc).stdout)
    p = offsets(world, svc, "--set", "email.received:0=0", brokers=False)
    assert p.returncode == 0, p.stderr
    assert f"email.received/0: {before[0]} -> 0" in p.stdout
    p = offsets(world, svc, "--set", "email.received:*=latest")
    assert p.returncode == 0, p.stderr
    assert stored_event_offsets(offsets(world, svc).stdout) == before
    p = offsets(world, svc, "--set", f"email.received:*=@{int(time.time() * 1000) + 3_600_000}")
    assert p.returncode == 0 and stored_event_offsets(offsets(world, svc).stdout) == before, "a future time is the end"
    for bad in ["email.received=5", "email.received:x=5", "email.received:0=soon", "email.received:*=earliest",
                "email.recieved:0=5", "email.received:0=@2024-02-30T00:00:00Z"]:
        p = offsets(world, svc, "--set", bad, brokers=False)
        assert p.returncode == h.EXIT_USAGE, (bad, p.returncode, p.stderr)
        assert "--set" in p.stderr, (bad, p.stderr)
    # A mistyped topic was stored, with "unset -> 5", and never read.
    p = offsets(world, svc, "--set", "email.recieved:0=5", brokers=False)
    assert '"email.recieved" is not an input topic' in p.stderr, p.stderr
    assert stored_event_offsets(offsets(world, svc).stdout) == before
    assert "recieved" not in offsets(world, svc).stdout
    # Before 1970 is the start of the log: librdkafka refuses a negative time, and its error blamed -X.
    p = offsets(world, svc, "--set", "email.received:*=@-5")
    assert p.returncode == 0, p.stderr
    moved = re.findall(r"^email\.received/(\d+): \S+ -> (\d+)", p.stdout, re.M)
    assert len(moved) == 4 and all(offset == "0" for _, offset in moved), p.stdout


def test_rewound_offsets_reread_but_dedupe_sends_nothing_twice(world, kafka, keys):
    svc, expected = processed_state(world, kafka, keys)
    assert offsets(world, svc, "--set", "email.received:*=earliest").returncode == 0
    svc = svc.restart()
    h.wait_for(lambda: svc.metrics().get("mailpush_duplicate_events_total", 0) >= 20, 60, "the re-read events are seen as duplicates")
    assert_exactly_once(kafka, expected)


def replay(world, svc, *args):
    return world.run_cli(["replay", "--brokers", world.bootstrap, "--state-dir", str(svc.state_dir)] + list(args), timeout=120)


def test_replay_respects_dedupe_unless_forced(world, kafka, keys):
    svc, expected = processed_state(world, kafka, keys, args=STATIC)
    p = replay(world, svc, "--from-offset", "0")
    assert p.returncode == 0, p.stderr
    assert "replayed 20 events: 0 jobs, 0 dead letters, 20 skipped as already processed" in p.stdout
    assert "replay:" in p.stderr, "progress is shown"
    assert_exactly_once(kafka, expected)

    p = replay(world, svc, "--from-time", "1970-01-01T00:00:00Z", "--force")
    assert p.returncode == 0, p.stderr
    assert f"replayed 20 events: {20 * len(DEVICE_IDS)} jobs" in p.stdout
    jobs = kafka.consume(JOBS, min_count=2 * len(expected), timeout=60, idle=1.0)
    assert len(jobs) == 2 * len(expected) and {r.headers["mailpush-job-id"] for r in jobs} == expected, \
        "a forced replay sends every job again, with the same jobIds"


def test_a_replay_on_a_state_directory_with_no_state_says_so_first(world, kafka, keys):
    """A replay run here skips what its state directory records as processed: on a new one every email of the range
    is processed (a backfill with a state of its own), on a mistyped one too, so it says so before it starts."""
    svc, _ = processed_state(world, kafka, keys, args=STATIC)
    missing = world.workdir / "mistyped-state"
    p = world.run_cli(["replay", "--brokers", world.bootstrap, "--state-dir", str(missing), "--from-offset", "0",
                       "--dry-run"], timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"replay: no state at {missing} yet: no email is recorded as processed there" in p.stderr, p.stderr
    p = replay(world, svc, "--from-offset", "0", "--dry-run")
    assert p.returncode == 0 and "no state at" not in p.stderr, p.stderr


def test_replay_delivers_what_was_dead_lettered_before_the_key_arrived(world, kafka, keys):
    kafka.produce(h.DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    svc = world.service(args=STATIC)
    records = [kafka.produce(EVENTS, "em-add-7", h.event(f"early-{i}", address="em-add-7")) for i in range(3)]
    assert len(kafka.consume(DEAD, min_count=3, timeout=60, idle=0.5)) == 3
    kafka.produce(KEYS, "em-add-7", sudo_client.key_record(keys.a, "em-add-7", "k7"))
    time.sleep(1)
    assert svc.stop(signal.SIGTERM) == 0
    partition = records[0].partition
    # The partition named twice, as a script joining lists might: it is replayed once (before, exit 70 with an SQL
    # constraint error).
    p = replay(world, svc, "--partition", str(partition), "--partition", str(partition),
               "--from-offset", str(records[0].offset), "--to-offset", str(records[-1].offset + 1))
    assert p.returncode == 0, p.stderr
    assert "replayed 3 events: 3 jobs, 0 dead letters" in p.stdout, p.stdout
    expected = {sudo_client.job_id("em-add-7", f"early-{i}", "dev-ios-1") for i in range(3)}
    assert_exactly_once(kafka, expected)


def test_corrupt_state_file_is_named_and_exits_70(world, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "mailpush.sqlite").write_bytes(b"this is not a database" * 400)
    p = world.run_cli(["run", "--brokers", world.bootstrap, "--state-dir", str(state),
                       "--http-port", str(h.free_port())], timeout=60)
    assert p.returncode == h.EXIT_SOFTWARE, (p.returncode, p.stderr)
    assert str(state / "mailpush.sqlite") in p.stderr
    assert "backup" in p.stderr, "tells the operator what to do"


def test_state_dir_that_is_a_file_is_refused(world, tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    p = world.run_cli(["offsets", "--state-dir", str(target)], timeout=30)
    assert p.returncode != 0
    assert f"{target} is not a directory" in p.stderr


def test_a_state_a_newer_version_migrated_is_refused_by_name(world, kafka, keys):
    """A rollback after an upgrade: the state directory holds a migration this version does not know. Before, it
    was opened as if it were its own, and what it wrote there the newer version would have trusted on its return."""
    svc, _ = processed_state(world, kafka, keys, count=3)
    database = svc.state_dir / "mailpush.sqlite"

    def dump() -> list[str]:
        with closing(sqlite3.connect(database)) as db:
            return list(db.iterdump())

    with closing(sqlite3.connect(database)) as db, db:
        db.execute("INSERT INTO grdb_migrations (identifier) VALUES ('v99-from-a-newer-mailpush')")
    before = dump()
    for argv in (["run", "--brokers", world.bootstrap, "--http-port", str(h.free_port())], ["offsets"]):
        p = world.run_cli(argv + ["--state-dir", str(svc.state_dir)], timeout=60)
        assert p.returncode == h.EXIT_SOFTWARE, (argv[0], p.returncode, p.stderr)
        assert (f"state database {database} was migrated by a newer mailpush (v99-from-a-newer-mailpush unknown to "
                "this version)") in p.stderr, p.stderr
    assert dump() == before, "nothing was migrated or written"
