"""`mailpush topics` (§9): plan, create and verify the six topics; `mailpush run`'s check of their settings.

The development broker answers neither CreateTopics nor DescribeConfigs: here the commands say so (once) and
go on, and they create nothing. Whether a topic that is not compacted is refused is decided by pure logic,
tested in Tests/MailpushPipelineTests/TopicPlanTests.swift.
"""

from __future__ import annotations

import re
import signal

from confluent_kafka.admin import AdminClient

import mailpush_harness as h
from mailpush_harness import DEAD, DEVICES, EVENTS, JOBS, KEYS

STATE = "mailpush.state"
ALL = [EVENTS, DEVICES, KEYS, JOBS, DEAD, STATE]
UNCHECKED_NOTE = "note: the cleanup.policy of existing topics could not be checked: the broker does not answer DescribeConfigs"


def _existing_topics(bootstrap: str) -> set[str]:
    """The cluster's topics, asked without naming any (a metadata request naming a topic would create it here)."""
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def _lines(out: str) -> dict[str, str]:
    """The per-topic lines of `mailpush topics`, by topic name."""
    return {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("note:", "dry run:"))}


def test_dry_run_lists_the_plan_and_creates_nothing(world):
    p = world.run_cli(["topics", "--brokers", world.bootstrap, "--dry-run", "--state-topic", "it.state"], timeout=60)
    assert p.returncode == h.EXIT_OK, p.stdout + p.stderr
    lines = _lines(p.stdout)
    assert list(lines) == [EVENTS, DEVICES, KEYS, JOBS, DEAD, "it.state"], p.stdout
    for topic in ALL[:-1]:
        assert re.fullmatch(rf"{re.escape(topic)}\s+exists\s+4 partitions\s+cleanup\.policy=unknown", lines[topic]), lines[topic]
    # The defaults: 12 partitions, replication factor 3, compacted as a state topic must be.
    assert re.fullmatch(r"it\.state\s+would create\s+12 partitions, replication factor 3\s+cleanup\.policy=compact",
                        lines["it.state"]), lines["it.state"]
    assert p.stdout.count(UNCHECKED_NOTE) == 1, p.stdout
    assert "dry run: nothing created" in p.stdout
    assert "it.state" not in _existing_topics(world.bootstrap)


def test_dry_run_takes_the_settings_it_would_create_with(world):
    p = world.run_cli(["topics", "--brokers", world.bootstrap, "--dry-run", "--jobs-topic", "it.jobs",
                       "--partitions", "2", "--replication-factor", "1"], timeout=60)
    assert p.returncode == h.EXIT_OK, p.stdout + p.stderr
    assert re.fullmatch(r"it\.jobs\s+would create\s+2 partitions, replication factor 1\s+cleanup\.policy=delete",
                        _lines(p.stdout)["it.jobs"]), p.stdout


def test_topics_that_exist_are_reported_the_same_every_time(world):
    argv = ["topics", "--brokers", world.bootstrap]
    first = world.run_cli(argv, timeout=60)
    second = world.run_cli(argv, timeout=60)
    assert first.returncode == second.returncode == h.EXIT_OK, first.stdout + first.stderr
    assert first.stdout == second.stdout and first.stderr == second.stderr == ""
    assert list(_lines(first.stdout)) == ALL
    assert all(" exists " in line for line in _lines(first.stdout).values()), first.stdout
    assert first.stdout.count(UNCHECKED_NOTE) == 1
    assert _existing_topics(world.bootstrap) >= set(ALL)


def test_a_topic_the_broker_cannot_create_is_named_and_left_alone(world):
    """The development broker creates topics on first use but has no CreateTopics: `topics` says so (69)."""
    argv = ["topics", "--brokers", world.bootstrap, "--devices-topic", "it.devices"]
    runs = [world.run_cli(argv, timeout=60) for _ in range(2)]
    for p in runs:
        assert p.returncode == h.EXIT_UNAVAILABLE, p.stdout + p.stderr
        assert re.match(r"it\.devices\s+not created\s+12 partitions, replication factor 3\s+cleanup\.policy=compact\s+"
                        r"PROBLEM: the broker does not answer CreateTopics", _lines(p.stdout)["it.devices"]), p.stdout
        assert "topic it.devices not created: the broker does not answer CreateTopics" in p.stderr, p.stderr
    assert runs[0].stdout == runs[1].stdout
    assert "it.devices" not in _existing_topics(world.bootstrap)


def test_unreachable_broker_exits_69(bare_world):
    p = bare_world.run_cli(["topics", "--brokers", "127.0.0.1:1", "--startup-timeout-seconds", "2"], timeout=60)
    assert p.returncode == h.EXIT_UNAVAILABLE, p.stdout + p.stderr
    assert "broker unreachable" in p.stderr


def test_bad_usage_exits_64_naming_the_setting(bare_world):
    for argv, word in [(["topics"], "--brokers"), (["topics", "--brokers", "127.0.0.1:1", "--partitions", "0"], "--partitions"),
                       (["topics", "--brokers", "127.0.0.1:1", "--replication-factor", "0"], "--replication-factor"),
                       (["topics", "--brokers", "127.0.0.1:1", "--state-topic", "a b"], "--state-topic")]:
        p = bare_world.run_cli(argv, timeout=60)
        assert p.returncode == h.EXIT_USAGE and word in p.stderr, (argv, p.returncode, p.stderr)


def test_run_says_once_that_the_policies_could_not_be_checked_and_starts(world):
    svc = world.service(args=["--group", "it-topics"])  # the default ownership: the state topic is checked too
    log = svc.proc.log_text()
    notes = [line for line in log.splitlines() if "cleanup.policy could not be checked" in line]
    assert len(notes) == 1, log[-4000:]
    assert "the broker does not answer DescribeConfigs" in notes[0]
    for topic in (DEVICES, KEYS, STATE):
        assert topic in notes[0]
    assert svc.stop(signal.SIGTERM) == 0


def test_run_refuses_a_missing_state_topic_naming_it(world):
    svc = world.service(args=["--group", "it-topics", "--state-topic", "it.missing-state"], wait_ready=False)
    assert svc.proc.wait(60) == h.EXIT_USAGE, svc.proc.log_tail()
    assert re.search(r"--state-topic: topic it\.missing-state does not exist; create it with at least 4 partitions",
                     svc.proc.log_text()), svc.proc.log_tail()
    assert "it.missing-state" not in _existing_topics(world.bootstrap)


def test_static_ownership_does_not_use_the_state_topic(world):
    svc = world.service(args=["--instance", "0", "--instances", "1", "--state-topic", "it.missing-state"])
    notes = [line for line in svc.proc.log_text().splitlines() if "cleanup.policy could not be checked" in line]
    assert len(notes) == 1 and "it.missing-state" not in notes[0], notes
    assert svc.stop(signal.SIGTERM) == 0


def test_settings_from_the_environment(world):
    env = h.clean_env({"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_STATE_TOPIC": "env.state", "MAILPUSH_PARTITIONS": "5",
                       "MAILPUSH_REPLICATION_FACTOR": "1", "MAILPUSH_EVENTS_TOPIC": "env.events"})
    p = world.run_cli(["topics", "--dry-run"], timeout=60, env=env)
    assert p.returncode == h.EXIT_OK, p.stdout + p.stderr
    lines = _lines(p.stdout)
    assert re.fullmatch(r"env\.events\s+would create\s+5 partitions, replication factor 1\s+cleanup\.policy=delete", lines["env.events"])
    assert re.fullmatch(r"env\.state\s+would create\s+5 partitions, replication factor 1\s+cleanup\.policy=compact", lines["env.state"])
