"""Every environment variable of the README's configuration table does what its flag does (§9).

The service is started with no flag at all: everything comes from MAILPUSH_* variables, and each one is
observed from outside (HTTP port, topics, job fields, log shape, the start-up line, librdkafka errors).
"""

from __future__ import annotations

import re
import signal

import mailpush_harness as h
import sudo_client

README = (h.REPO / "README.md").read_text()


def readme_table_variables() -> set[str]:
    section = re.search(r"### Configuration reference.*?\n\n(\|.*?)\n\n", README, re.S).group(1)
    names = set(re.findall(r"`(MAILPUSH_[A-Z_]+)`", section))
    assert len(names) >= 20, names
    return names


def test_every_readme_variable_takes_effect_without_flags(world, kafka, keys, tmp_path):
    port = h.free_port()
    topics = {"events": "env.events", "devices": "env.devices", "keys": "env.keys",
              "jobs": "env.jobs", "dead": "env.dead"}
    env = {
        "MAILPUSH_BROKERS": world.bootstrap,
        "MAILPUSH_STATE_DIR": str(tmp_path / "env-state"),
        "MAILPUSH_HTTP_PORT": str(port),
        "MAILPUSH_INSTANCE": "0",
        "MAILPUSH_INSTANCES": "1",
        "MAILPUSH_STATE_TOPIC": "env.state",
        "MAILPUSH_SPONSOR_WEBHOOK_URL": "https://sponsor.example/env",
        "MAILPUSH_ALERT_TITLE": "Env title",
        "MAILPUSH_ALERT_BODY": "Env body",
        "MAILPUSH_TTL_SECONDS": "3600",
        "MAILPUSH_DEDUPE_WINDOW_SECONDS": "1234",
        "MAILPUSH_RSA_MULTI_BUFFER": "off",
        "MAILPUSH_EVENTS_TOPIC": topics["events"],
        "MAILPUSH_DEVICES_TOPIC": topics["devices"],
        "MAILPUSH_KEYS_TOPIC": topics["keys"],
        "MAILPUSH_JOBS_TOPIC": topics["jobs"],
        "MAILPUSH_DEAD_LETTER_TOPIC": topics["dead"],
        "MAILPUSH_BATCH_SIZE": "17",
        "MAILPUSH_START_FROM": "earliest",
        "MAILPUSH_STARTUP_TIMEOUT_SECONDS": "41",
        "MAILPUSH_SHUTDOWN_GRACE_SECONDS": "19",
        "MAILPUSH_LIVENESS_TIMEOUT_SECONDS": "77",
        "MAILPUSH_LOG_LEVEL": "debug",
        "MAILPUSH_LOG_FORMAT": "json",
        # A harmless librdkafka property, visible in the client's own identification.
        "MAILPUSH_KAFKA_CLIENT_ID": "mailpush-env-test",
    }
    # MAILPUSH_GROUP and its settings belong to the other ownership mode: test_group_from_the_environment.
    group_only = {"MAILPUSH_GROUP", "MAILPUSH_GROUP_INSTANCE_ID", "MAILPUSH_GROUP_SESSION_TIMEOUT_MS"}
    missing = {n for n in readme_table_variables() if not n.endswith("_")} - set(env) - group_only
    assert missing == set(), f"README variables this test does not set: {missing}"

    proc = world.spawn("run-env", [world.bin, "run"], env=h.clean_env(env))
    h.wait_for(lambda: proc.alive() and h.http_get(port, "/readyz", timeout=2)[0] == 200, 90,
               f"/readyz on MAILPUSH_HTTP_PORT {port}", interval=0.2, on_fail=proc.log_tail)
    assert (tmp_path / "env-state").is_dir(), "MAILPUSH_STATE_DIR is where the state is kept"

    kafka.produce(topics["keys"], "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(topics["devices"], "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(topics["devices"], "dev-web-1", h.sponsor_webhook_device("dev-web-1"))
    ev = h.event("em-msg-1")
    kafka.produce(topics["events"], "em-add-1", ev)
    kafka.produce(topics["events"], "em-add-1", h.event("em-msg-2", messageId=None))
    jobs = kafka.consume(topics["jobs"], min_count=2, timeout=60, idle=1.0)
    dead = kafka.consume(topics["dead"], min_count=1, timeout=60, idle=0.5)

    by_device = {r.key_str: r.json() for r in jobs}
    assert set(by_device) == {"dev-ios-1", "dev-web-1"}, by_device
    ios = by_device["dev-ios-1"]
    assert ios["apns"]["payload"]["aps"]["alert"] == {"title": "Env title", "body": "Env body"}
    assert ios["expiresAtEpochMs"] == ev["receivedAtEpochMs"] + 3600 * 1000
    assert by_device["dev-web-1"]["webhook"]["url"] == "https://sponsor.example/env"
    assert len(dead) == 1 and "messageId" in dead[0].headers.get("mailpush-error", "")

    assert proc.stop(signal.SIGTERM, timeout=60) == 0
    lines = proc.log_lines()
    assert lines, "MAILPUSH_LOG_FORMAT=json gives JSON lines"
    assert any(l["level"] == "debug" for l in lines), "MAILPUSH_LOG_LEVEL=debug shows debug lines"
    starting = [l for l in lines if l["message"] == "starting"]
    assert len(starting) == 1, lines[:20]
    s = starting[0]
    assert (s["ownership"], s["stateTopic"], s["httpPort"]) == ("static, instance 0 of 1", "env.state", str(port))
    assert (s["eventsTopic"], s["devicesTopic"], s["keysTopic"], s["jobsTopic"], s["deadLetterTopic"]) == (
        topics["events"], topics["devices"], topics["keys"], topics["jobs"], topics["dead"])
    assert (s["batchSize"], s["startFrom"], s["startupTimeoutSeconds"], s["shutdownGraceSeconds"]) == (
        "17", "earliest", "41", "19")
    assert (s["ttlSeconds"], s["dedupeWindowSeconds"]) == ("3600", "1234")
    assert s["livenessTimeoutSeconds"] == "77"
    assert s["rsa"] == "one at a time (swift-crypto; --rsa-multi-buffer off)"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", s["librdkafka"]), s


def test_group_from_the_environment(world, kafka, keys, tmp_path):
    """MAILPUSH_GROUP and its settings (and no MAILPUSH_INSTANCE): the instance joins that consumer group and
    processes events."""
    port = h.free_port()
    env = {"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_HTTP_PORT": str(port),
           "MAILPUSH_STATE_DIR": str(tmp_path / "group-state"), "MAILPUSH_GROUP": "env-group",
           "MAILPUSH_GROUP_INSTANCE_ID": "pod-7", "MAILPUSH_GROUP_SESSION_TIMEOUT_MS": "7000"}
    proc = world.spawn("run-group", [world.bin, "run"], env=h.clean_env(env))
    h.wait_for(lambda: proc.alive() and h.http_get(port, "/readyz", timeout=2)[0] == 200, 90,
               "/readyz", interval=0.2, on_fail=proc.log_tail)
    kafka.produce(h.KEYS, "em-add-1", sudo_client.key_record(keys.a, "em-add-1", "k1"))
    kafka.produce(h.DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(h.EVENTS, "em-add-1", h.event("em-msg-1"))
    jobs = kafka.consume(h.JOBS, min_count=1, timeout=60, idle=0.5)
    assert [r.key_str for r in jobs] == ["dev-ios-1"]
    assert proc.stop(signal.SIGTERM, timeout=60) == 0
    lines = proc.log_lines()
    starting = [l for l in lines if l["message"] == "starting"][0]
    assert starting["ownership"] == "consumer group env-group"
    assert (starting["groupInstanceId"], starting["groupSessionTimeoutMs"]) == ("pod-7", "7000")
    joined = [l for l in lines if l["message"] == "joining the consumer group"]
    assert joined and joined[0]["group"] == "env-group"
    assert any(l["message"] == "left the consumer group" for l in lines)


def test_log_format_text_and_log_level_from_the_environment(world):
    """The Helm chart sets MAILPUSH_LOG_LEVEL/FORMAT: they must change what is logged."""
    port = h.free_port()
    env = {"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_HTTP_PORT": str(port),
           "MAILPUSH_STATE_DIR": str(world.workdir / "text-state"), "MAILPUSH_LOG_FORMAT": "text"}
    text = world.spawn("run-text", [world.bin, "run"], env=h.clean_env(env))
    h.wait_for(lambda: text.alive() and h.http_get(port, "/readyz", timeout=2)[0] == 200, 90, "/readyz",
               interval=0.2, on_fail=text.log_tail)
    assert text.stop(signal.SIGTERM, timeout=60) == 0
    own = [l for l in text.log_text().splitlines() if l.strip() and not l.startswith("$ ")]
    assert any("starting" in l for l in own), own[:10]
    assert not any(l.startswith("{") for l in own), "MAILPUSH_LOG_FORMAT=text: no JSON lines"

    port = h.free_port()
    quiet = world.spawn("run-quiet", [world.bin, "run"], env=h.clean_env(
        {**env, "MAILPUSH_HTTP_PORT": str(port), "MAILPUSH_LOG_FORMAT": "json", "MAILPUSH_LOG_LEVEL": "error",
         "MAILPUSH_STATE_DIR": str(world.workdir / "quiet-state")}))
    h.wait_for(lambda: quiet.alive() and h.http_get(port, "/readyz", timeout=2)[0] == 200, 90, "/readyz",
               interval=0.2, on_fail=quiet.log_tail)
    assert quiet.stop(signal.SIGTERM, timeout=60) == 0
    assert not [l for l in quiet.log_lines() if l["level"] in ("info", "debug", "notice")], \
        "MAILPUSH_LOG_LEVEL=error hides info lines"

    # The command line wins over the environment.
    port = h.free_port()
    both = world.spawn("run-flag-wins", [world.bin, "run", "--log-format", "json"], env=h.clean_env(
        {**env, "MAILPUSH_HTTP_PORT": str(port), "MAILPUSH_STATE_DIR": str(world.workdir / "both-state")}))
    h.wait_for(lambda: both.alive() and h.http_get(port, "/readyz", timeout=2)[0] == 200, 90, "/readyz",
               interval=0.2, on_fail=both.log_tail)
    assert both.stop(signal.SIGTERM, timeout=60) == 0
    assert any(l["message"] == "starting" for l in both.log_lines())


def test_kafka_variables_reach_librdkafka_and_secrets_are_not_echoed(world):
    secret = "S3cr3t-Value-9f2e"
    base = {"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_STATE_DIR": str(world.workdir / "kafka-state"),
            "MAILPUSH_HTTP_PORT": str(h.free_port())}

    # A bad value for an ordinary property: refused at start-up, the message names the property.
    p = world.run_cli(["run"], timeout=60, env=h.clean_env({**base, "MAILPUSH_KAFKA_SECURITY_PROTOCOL": "bogus"}))
    assert p.returncode == 64, p
    assert "security.protocol" in p.stderr, p.stderr

    # A secret-looking property librdkafka refuses: named, its value never printed.
    p = world.run_cli(["run"], timeout=60, env=h.clean_env({**base, "MAILPUSH_KAFKA_SASL_PASSWORD_FILE": secret}))
    assert p.returncode == 64, p
    assert "sasl.password.file" in p.stderr, p.stderr
    assert secret not in p.stderr + p.stdout


def test_offsets_reads_kafka_settings_from_the_environment(world):
    """`mailpush offsets` inside a pod must use the same MAILPUSH_KAFKA_* (SASL) settings as `run`."""
    base = {"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_STATE_DIR": str(world.workdir / "offsets-state")}
    ok = world.run_cli(["offsets"], timeout=60, env=h.clean_env(base))
    assert ok.returncode == 0, ok
    bad = world.run_cli(["offsets"], timeout=60, env=h.clean_env({**base, "MAILPUSH_KAFKA_SECURITY_PROTOCOL": "bogus"}))
    assert bad.returncode == 64, bad
    assert "security.protocol" in bad.stderr, bad.stderr


def test_a_bad_value_from_the_environment_is_named_by_its_variable(world):
    """In a pod every setting comes from a MAILPUSH_* variable; the usage error names the flag it stands for. The
    variable is named under the error's first line, and `--help` works whatever the environment holds (before, a bad
    value there made `--help` fail)."""
    base = {"MAILPUSH_BROKERS": world.bootstrap, "MAILPUSH_STATE_DIR": str(world.workdir / "env-errors")}
    for variable, value, flag in [("MAILPUSH_HTTP_PORT", "eighty", "--http-port"),
                                  ("MAILPUSH_TTL_SECONDS", "0", "--ttl-seconds"),
                                  ("MAILPUSH_BATCH_SIZE", "30000", "--batch-size")]:
        p = world.run_cli(["run"], timeout=60, env=h.clean_env({**base, variable: value}))
        assert p.returncode == 64, p
        lines = p.stderr.splitlines()
        assert lines[0].startswith("Error: ") and flag in lines[0], p.stderr
        assert lines[1] == f"({flag} was set by {variable})", p.stderr
    # A flag given on the command line wins over its variable: its error names no variable.
    p = world.run_cli(["run", "--ttl-seconds", "0"], timeout=60, env=h.clean_env({**base, "MAILPUSH_TTL_SECONDS": "60"}))
    assert p.returncode == 64 and "was set by" not in p.stderr, p.stderr
    p = world.run_cli(["run", "--help"], timeout=60, env=h.clean_env({**base, "MAILPUSH_HTTP_PORT": "eighty"}))
    assert p.returncode == 0 and "--http-port" in p.stdout, p
