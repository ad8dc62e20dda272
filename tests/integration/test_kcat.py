"""kcat interop: examples/README.md works as written (§1, §9 embedded broker)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

import mailpush_harness as h
import sudo_client
from mailpush_harness import JOBS, DEAD, EVENTS

README = h.EXAMPLES / "README.md"
WEBHOOK_DEVICE = "dev-sponsor-webhook-1"
ALL_DEVICES = ["dev-ios-1", "dev-android-1", "dev-sponsor-fcm-1", WEBHOOK_DEVICE]


def sh_blocks() -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    out = []
    for b in blocks:
        lines, cur = [], ""
        for line in b.splitlines():
            cur += line
            if cur.endswith("\\"):
                cur = cur[:-1] + " "
                continue
            if cur.strip():
                lines.append(cur.strip())
            cur = ""
        out.append(lines)
    return out


def block_with(text: str) -> list[str]:
    for b in sh_blocks():
        if any(text in line for line in b):
            return b
    raise AssertionError(f"examples/README.md has no sh block with {text!r}")


def bash(lines: list[str], cwd, env, timeout=60) -> str:
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, (f"README commands failed with {p.returncode}:\n{script}\n"
                               f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p.stdout


def envelope_headers(env: dict) -> dict:
    hd = env.get("headers") or []
    if isinstance(hd, dict):
        return hd
    return dict(zip(hd[0::2], hd[1::2]))


def readme_world(bare_world, tmp_path):
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed (apt-get install kcat)", pytrace=False)
    binary = bare_world.bin  # fails here, in the test, when the binary is missing
    (tmp_path / "examples").symlink_to(h.EXAMPLES)
    (tmp_path / "tests").symlink_to(h.REPO / "tests")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mailpush").symlink_to(binary)
    env = h.clean_env({"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"})
    return bare_world, tmp_path, env


def test_readme_walkthrough_with_kcat(bare_world, tmp_path):
    world, cwd, env = readme_world(bare_world, tmp_path)

    # 1. `mailpush run …` exactly as in the README (embedded broker), HTTP port from the env.
    start = [l for l in block_with("mailpush run") if l.startswith("mailpush run")][0]
    argv = shlex.split(start.rstrip("&").strip())
    port = h.free_port()
    proc = world.spawn("run-readme", [world.bin] + argv[1:],
                       env={**env, "MAILPUSH_HTTP_PORT": str(port)})
    bfile = cwd / ".mailpush" / "devbroker.bootstrap"

    def bootstrap():
        if not proc.alive():
            raise h.HarnessError(f"mailpush run exited {proc.returncode}\n{proc.log_tail()}")
        return bfile.is_file() and bfile.read_text().strip()
    bs = h.wait_for(bootstrap, 60, str(bfile), on_fail=proc.log_tail)
    assert bs in proc.log_text(), "mailpush run should print the embedded broker's address"
    h.wait_for(lambda: h.http_get(port, "/readyz")[0] == 200, 60, "/readyz", on_fail=proc.log_tail)
    kafka = h.Kafka(bs)

    # 2. The kcat -P lines as written.
    walk = block_with("B=$(cat")
    assign = [l for l in walk if l.startswith("B=")]
    produce = [l for l in walk if "kcat" in l and " -P" in l]
    consume = [l for l in walk if "kcat" in l and " -C" in l]
    assert len(produce) == 8 and len(consume) == 2
    bash(assign + produce, cwd, env)

    # Wait (independently) until mailpush produced everything, then read with kcat as written.
    kafka.consume(JOBS, min_count=len(ALL_DEVICES), timeout=60, idle=1.0)
    kafka.consume(DEAD, min_count=1, timeout=30, idle=0.5)
    out = bash(assign + consume, cwd, env)
    envs = [json.loads(l) for l in out.splitlines() if l.strip()]
    jobs = [e for e in envs if e["topic"] == JOBS]
    dead = [e for e in envs if e["topic"] == DEAD]

    ev = json.loads((h.EXAMPLES / "email-received.json").read_text())
    priv = sudo_client.load_private_pem(str(h.EXAMPLES / "keys" / "example-private.pem"))
    assert sorted(e["key"] for e in jobs) == sorted(ALL_DEVICES)
    for e in jobs:
        job = json.loads(e["payload"])
        h.validate_job(job)
        hd = envelope_headers(e)
        jid = sudo_client.job_id("em-add-1", "em-msg-1", e["key"])
        assert job["jobId"] == jid == hd.get("mailpush-job-id")
        assert re.fullmatch(r"email\.received/\d+/\d+", hd.get("mailpush-source", ""))
        if e["key"] == WEBHOOK_DEVICE:
            assert job["webhook"]["url"] == "https://sponsor.example/push"
            assert job["webhook"]["body"]["sponseeDetails"] == "sponsee-2/route-eu-1"
            continue
        data, plain = sudo_client.open_data(priv, sudo_client.sudoplatform_of(job)["data"])
        assert data["keyId"] == "example-key-1"
        assert plain == sudo_client.expected_plaintext(ev)

    assert len(dead) == 1
    assert dead[0]["key"] == "em-add-1"
    assert dead[0]["payload"] == (h.EXAMPLES / "email-received-bad.json").read_text()
    assert "messageId" in envelope_headers(dead[0]).get("mailpush-error", "")

    # 3. The python opener pipeline from the README.
    opener = [l for l in block_with("sudo_client.py") if "sudo_client.py" in l]
    out = bash(assign + opener, cwd, env)
    opened = [json.loads(l) for l in out.splitlines() if l.strip()]
    assert opened == [sudo_client.expected_plaintext(ev)] * 3

    # 4. The tombstone line: dev-ios-1 gets nothing for the next email.
    tomb = [l for l in block_with("-Z") if "kcat" in l]
    bash(assign + tomb, cwd, env)
    kafka.produce(EVENTS, "em-add-1", {**ev, "messageId": "em-msg-2"})
    h.sentinel(kafka, "em-add-1")
    after = kafka.consume(JOBS, min_count=7, timeout=30, idle=1.0)
    new = sorted(r.key_str for r in after if r.json()["jobId"] in {
        sudo_client.job_id("em-add-1", "em-msg-2", d) for d in ALL_DEVICES})
    assert new == sorted(d for d in ALL_DEVICES if d != "dev-ios-1")

    # 5. `mailpush unseal` from the README opens the iOS job.
    # kcat writes a file and grep reads it: a pipe into `grep -m1` would end kcat with SIGPIPE, which fails
    # the line in a shell with pipefail (as here) depending on timing.
    unseal = [l for l in block_with("mailpush unseal") if l.startswith(("kcat", "grep", "mailpush"))]
    assert len(unseal) == 3 and not any("| grep -m" in l for l in unseal), unseal
    out = bash(assign + unseal, cwd, env)
    assert "em-msg-1" in out and "Hello" in out and "a@example.com" in out, out


def test_readme_kcat_lines_are_the_tested_ones():
    """The top-level README's walkthrough repeats examples/README.md's commands, which the test above runs."""
    examples = {l for b in sh_blocks() for l in b}
    top = re.search(r"## Try it with kcat\n(.*?)\n## ", (h.REPO / "README.md").read_text(), re.S).group(1)
    lines = [l.strip() for b in re.findall(r"```sh\n(.*?)```", top, re.S) for l in b.splitlines()
             if l.strip().startswith(("kcat", "grep", "echo", "B="))]
    assert len(lines) >= 13, lines
    missing = [l for l in lines if l not in examples]
    assert missing == [], f"README.md lines not in examples/README.md (so not tested): {missing}"
