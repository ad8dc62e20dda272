"""Command line (§9): exit codes, flags and their environment variables, devbroker."""

from __future__ import annotations

import re
import signal
import time

import pytest

import mailpush_harness as h
import sudo_client
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS

UNREACHABLE = "127.0.0.1:1"


def _run_help(world) -> str:
    p = world.run_cli(["run", "--help"], timeout=30)
    return p.stdout + p.stderr


def _base(world, tmp_path, port: bool = True) -> list[str]:
    argv = ["run", "--brokers", UNREACHABLE, "--state-dir", str(tmp_path / "state")]
    return argv + (["--http-port", str(h.free_port())] if port else [])


BAD_USAGE = {
    "ttl not a number": (["--ttl-seconds", "abc"], {}, "ttl-seconds"),
    "zero instances": (["--instances", "0"], {}, "instances"),
    "instance out of range": (["--instance", "3", "--instances", "2"], {}, "instance"),
    "negative instance": (["--instance", "-1", "--instances", "2"], {}, "instance"),
    "port out of range": (["--http-port", "70000"], {}, "http-port"),
    "unknown flag": (["--no-such-flag"], {}, "no-such-flag"),
    "ttl from env": ([], {"MAILPUSH_TTL_SECONDS": "abc"}, "ttl"),
    # Each of these once crashed (an overflow trap, status 132) or wrapped every job's expiry around.
    "ttl past 100 years": (["--ttl-seconds", "9223372036854775807"], {}, "ttl-seconds"),
    "dedupe window past 100 years": ([], {"MAILPUSH_DEDUPE_WINDOW_SECONDS": "9223372036854775807"}, "dedupe-window-seconds"),
    "shutdown grace past an hour": (["--shutdown-grace-seconds", "9223372036854775807"], {}, "shutdown-grace-seconds"),
    "bad librdkafka property": (["-X", "no.such.property=1"], {}, "no.such.property"),
    # Properties the guarantees rest on were changed without a word: a producer without idempotence, one whose
    # every record the broker refused (retried forever, never ready), an out-of-range offset skipped silently.
    "producer not idempotent": (["-X", "enable.idempotence=false"], {}, "enable.idempotence"),
    "transactional producer": (["-X", "transactional.id=mailpush-0"], {}, "transactional.id"),
    "offset reset from env": ([], {"MAILPUSH_KAFKA_AUTO_OFFSET_RESET": "latest"}, "auto.offset.reset"),
    # A batch's dedupe entries of one partition travel in one state record, which must stay under 1 MB.
    "group batch too large": (["--batch-size", "25001"], {}, "batch-size"),
    # Alert text that leaves APNs' 4096-byte payload no room for the sealed data made every iOS job a dead letter.
    "alert text past the payload's room": (["--alert-title", "New email " * 60, "--alert-body", "Tap " * 120], {},
                                           "alert-title"),
    # Foundation's URL parser takes a line break; a sender would not.
    "webhook URL with a line break": (["--sponsor-webhook-url", "https://sponsor.example/\nhook"], {},
                                      "sponsor-webhook-url"),
}


@pytest.mark.parametrize("case", sorted(BAD_USAGE))
def test_bad_usage_exits_64_naming_the_setting(bare_world, tmp_path, case):
    extra, env, word = BAD_USAGE[case]
    argv = _base(bare_world, tmp_path, port="--http-port" not in extra) + extra
    p = bare_world.run_cli(argv, timeout=60, env=h.clean_env(env))
    out = p.stdout + p.stderr
    assert p.returncode == h.EXIT_USAGE, \
        f"`mailpush {' '.join(argv)}` {env or ''} exited {p.returncode}, expected 64\n{out[-2000:]}"
    assert word.lower() in out.lower(), f"the message should name {word!r}:\n{out[-2000:]}"


def test_unreachable_brokers_exit_69_in_bounded_time(bare_world, tmp_path):
    argv = _base(bare_world, tmp_path)
    if "startup-timeout-seconds" in _run_help(bare_world):
        argv += ["--startup-timeout-seconds", "5"]
    t0 = time.monotonic()
    p = bare_world.run_cli(argv, timeout=180,
                           env=h.clean_env({"MAILPUSH_STARTUP_TIMEOUT_SECONDS": "5"}))
    elapsed = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode == h.EXIT_UNAVAILABLE, f"exited {p.returncode}, expected 69\n{out[-2000:]}"
    assert elapsed < 90, f"took {elapsed:.0f}s to give up"
    assert "broker" in out.lower() or UNREACHABLE in out, out[-2000:]


def test_brokers_from_environment(world, kafka, keys):
    """MAILPUSH_BROKERS instead of --brokers (§9)."""
    svc = world.service(brokers=None, env=h.clean_env({"MAILPUSH_BROKERS": world.bootstrap}))
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)) == 1
    assert not (svc.state_dir / "devbroker.bootstrap").exists(), \
        "with brokers given, no embedded broker is started"


def test_embedded_broker_when_no_brokers_given(bare_world, tmp_path, keys):
    state = tmp_path / "state"
    svc = bare_world.service(brokers=None, state_dir=state, wait_ready=False)
    bfile = state / "devbroker.bootstrap"

    def bootstrap():
        svc.assert_alive()
        return bfile.is_file() and re.fullmatch(r"[^\s:]+:\d+", bfile.read_text().strip()) \
            and bfile.read_text().strip()
    bs = h.wait_for(bootstrap, 60, str(bfile), on_fail=svc.proc.log_tail)
    svc.wait_ready()
    assert bs in svc.proc.log_text(), "the embedded broker's address is printed"
    kafka = h.Kafka(bs)
    for t in (EVENTS, DEVICES, KEYS, JOBS, DEAD):
        kafka.partitions(t)
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    jobs = kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)
    assert [r.key_str for r in jobs] == ["dev-ios-1"]
    assert svc.stop(signal.SIGINT, timeout=60) == 0


def test_embedded_broker_run_again_on_its_state_directory_starts_empty(bare_world, tmp_path, keys):
    """The quick start's `make run`, events with kcat, Ctrl-C, `make run` again. The embedded broker of the second run
    is new and empty, so the first run's state is discarded: its offsets lay past the new logs (the second run
    stopped with "Offset out of range" as an internal error, exit 70), and its dedupe window would have swallowed
    the same example events published again."""
    state = tmp_path / "state"
    for run, count in ((1, 5), (2, 2)):
        svc = bare_world.service(brokers=None, state_dir=state)
        kafka = h.Kafka((state / "devbroker.bootstrap").read_text().strip())
        kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
        kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
        for i in range(count):
            kafka.produce(EVENTS, "em-add-1", h.event(f"em-msg-{i}"))
        jobs = kafka.consume(JOBS, min_count=count, timeout=60, idle=1.0)
        assert len(jobs) == count, f"run {run}: {len(jobs)} jobs for {count} events\n{svc.proc.log_tail()}"
        assert svc.stop(signal.SIGINT, timeout=60) == 0, svc.proc.log_tail()
    assert "the state of the earlier run (offsets, devices, keys, dedupe window) is discarded" in svc.proc.log_text()


def test_a_state_directory_is_used_only_with_its_own_cluster(world, tmp_path):
    """Offsets of one cluster would skip or repeat events in another: a state directory of a cluster given with
    --brokers is refused by a run with the embedded broker, and the other way round, naming the directory."""
    external, embedded = tmp_path / "external", tmp_path / "embedded"
    assert world.service(state_dir=external).stop() == 0
    assert world.service(brokers=None, state_dir=embedded).stop() == 0
    for state, brokers in ((external, []), (embedded, ["--brokers", world.bootstrap])):
        p = world.run_cli(["run", *brokers, "--state-dir", str(state), "--http-port", str(h.free_port())], timeout=60)
        assert p.returncode == h.EXIT_USAGE, f"exit {p.returncode}\n{(p.stdout + p.stderr)[-2000:]}"
        assert f"state directory {state} holds offsets" in p.stderr, p.stderr


def _devbroker(world, bfile):
    proc = world.spawn("devbroker", [world.bin, "devbroker", "--bootstrap-file", str(bfile)])
    return proc, h.wait_for(lambda: bfile.is_file() and bfile.read_text().strip(), 60, str(bfile), on_fail=proc.log_tail)


@pytest.mark.runs_for(65)
def test_a_stored_offset_outside_the_log_stops_with_a_clear_error(bare_world, tmp_path, keys):
    """The events topic recreated under a running deployment (here: the cluster itself, a new development broker at
    the same state directory's --brokers): the stored offsets lie past the new, empty log. mailpush stops naming
    the partition and what to do, with exit 64, not as an internal error (exit 70)."""
    state = tmp_path / "state"
    first, bs = _devbroker(bare_world, tmp_path / "first.txt")
    svc = bare_world.service(brokers=bs, state_dir=state)
    kafka = h.Kafka(bs)
    for i in range(3):
        kafka.produce(EVENTS, "em-add-1", h.event(f"em-msg-{i}"))
    kafka.consume(DEAD, min_count=3, timeout=60, idle=0.5)
    assert svc.stop() == 0
    first.stop(signal.SIGTERM, 30)

    _, bs = _devbroker(bare_world, tmp_path / "second.txt")
    svc = bare_world.service(brokers=bs, state_dir=state, wait_ready=False)
    h.wait_for(lambda: not svc.proc.alive(), 90, "mailpush run to stop", on_fail=svc.proc.log_tail)
    out = svc.proc.log_text()
    assert svc.proc.returncode == h.EXIT_USAGE, out[-2000:]
    assert "the stored offset is outside the partition's log" in out and "mailpush offsets --set" in out, out[-2000:]
    assert "internal error" not in out, out[-2000:]


@pytest.mark.parametrize("partitions", [None, 3])
def test_devbroker(bare_world, tmp_path, partitions):
    bfile = tmp_path / "bs.txt"
    argv = [bare_world.bin, "devbroker", "--bootstrap-file", str(bfile)]
    if partitions:
        argv += ["--partitions", str(partitions)]
    proc = bare_world.spawn("devbroker", argv)
    bs = h.wait_for(lambda: bfile.is_file() and bfile.read_text().strip(), 60, str(bfile),
                    on_fail=proc.log_tail)
    h.wait_for(lambda: f"bootstrap={bs}" in proc.log_text(), 10, "bootstrap= line on stdout",
               on_fail=proc.log_tail)
    kafka = h.Kafka(bs)
    for t in (EVENTS, DEVICES, KEYS, JOBS, DEAD):
        assert kafka.partitions(t) == list(range(partitions or 4)), t
    rec = kafka.produce("some.new.topic", "k", b"v")  # more topics are created on first use
    assert rec.offset == 0
    assert proc.stop(signal.SIGTERM, timeout=30) == 0


def test_topic_names_from_flags_and_environment(world, kafka, keys):
    names = {"events": "it.events", "devices": "it.devices", "keys": "it.keys",
             "jobs": "it.jobs", "dead": "it.dead"}
    # Inputs first (this also creates the topics), then the service.
    ios = h.ios_device("dev-ios-1")
    kafka.produce(names["devices"], "dev-ios-1", ios)
    kafka.produce(names["keys"], "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    ev = h.event("em-msg-1")
    rec = kafka.produce(names["events"], "em-add-1", ev)
    kafka.produce(names["events"], "em-add-1", b"{bad")
    env = h.clean_env({"MAILPUSH_DEVICES_TOPIC": names["devices"], "MAILPUSH_KEYS_TOPIC": names["keys"]})
    world.service(env=env, args=["--events-topic", names["events"], "--jobs-topic", names["jobs"],
                                 "--dead-letter-topic", names["dead"]])
    jobs = kafka.consume(names["jobs"], min_count=1, timeout=60, idle=1.0)
    assert len(jobs) == 1
    h.assert_job(jobs[0], ev=ev, ev_rec=rec, device=ios, private_key=keys.a)
    assert jobs[0].headers["mailpush-source"].startswith("it.events/")
    dead = kafka.consume(names["dead"], min_count=1, timeout=30, idle=0.5)
    assert [d.value for d in dead] == [b"{bad"]
    assert kafka.consume(JOBS, timeout=1, idle=0.5) == []
    assert kafka.consume(DEAD, timeout=1, idle=0.5) == []


def test_http_port_in_use_exits_64_naming_the_port(world, tmp_path):
    import socket
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        p = world.run_cli(["run", "--brokers", world.bootstrap, "--state-dir", str(tmp_path / "state"),
                           "--http-port", str(port)], timeout=60)
    finally:
        busy.close()
    out = p.stdout + p.stderr
    assert p.returncode == h.EXIT_USAGE, f"exited {p.returncode}, expected 64\n{out[-2000:]}"
    assert f"--http-port {port}" in out, out[-2000:]


def test_http_port_is_bound_before_the_embedded_broker_starts(bare_world, tmp_path):
    # A CI run failed with "--http-port 41645: cannot listen (Address already in use)" right after
    # "embedded development broker … at 127.0.0.1:41645": the broker, started first, had taken the free port
    # the test had picked for HTTP. The HTTP port is bound first now, so with it busy the service exits 64
    # without starting a broker.
    import socket
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    port = busy.getsockname()[1]
    state = tmp_path / "state"
    try:
        p = bare_world.run_cli(["run", "--state-dir", str(state), "--http-port", str(port)], timeout=60)
    finally:
        busy.close()
    out = p.stdout + p.stderr
    assert p.returncode == h.EXIT_USAGE, f"exited {p.returncode}, expected 64\n{out[-2000:]}"
    assert f"--http-port {port}" in out, out[-2000:]
    assert "embedded development broker" not in out, out[-2000:]
    assert not (state / "devbroker.bootstrap").exists()


def test_librdkafka_property_joined_to_the_flag_as_kcat_accepts(world, kafka, keys):
    """`-Xkey=value`, as kcat takes it, is the same as `-X key=value` (§9)."""
    world.service(args=["-Xlinger.ms=1"])
    kafka.produce(DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(EVENTS, "em-add-1", h.event("em-msg-1"))
    assert len(kafka.consume(JOBS, min_count=1, timeout=60, idle=0.5)) == 1


def test_the_binary_allocates_with_jemalloc_and_its_built_in_settings(bare_world):
    """docs/operations.md, "Memory allocator": a build that lost jemalloc (or its settings) would run on glibc's
    malloc without a word; jemalloc prints the settings it applies when asked to."""
    p = bare_world.run_cli(["--help"], timeout=30, env=h.clean_env({"MALLOC_CONF": "confirm_conf:true"}))
    applied = re.findall(r"^<jemalloc>: -- Set conf value: (\S+)$", p.stderr, re.M)
    assert applied[:2] == ["narenas:2", "dirty_decay_ms:3000"], p.stderr[-2000:]
    assert "confirm_conf:true" in applied, "MALLOC_CONF from the environment is applied after them"
