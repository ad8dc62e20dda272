"""Short runs of chaos.py, exactly-once checked: one instance killed 3 times in ~1000 events, and a fleet of three
disrupted 10 times in 2000 events while three replays run beside it; the configuration changes in both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import mailpush_harness as h  # noqa: E402


@pytest.mark.runs_for(40)
def test_chaos_short(tmp_path):
    argv = [sys.executable, str(HERE / "chaos.py"), "--events", "1000", "--devices", "24",
            "--kills", "3", "--config-changes", "4", "--seed", "20240614", "--bin", h.mailpush_bin(),
            "--workdir", str(tmp_path / "chaos"), "--timeout", "240"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    out = p.stdout + ("\n--- stderr ---\n" + p.stderr if p.stderr else "")
    print(out)
    assert p.returncode == 0, f"chaos.py exited {p.returncode}:\n{out[-6000:]}"
    assert "jobs: expected=" in p.stdout and "duplicates=0 missing=0 unexpected=0" in p.stdout


@pytest.mark.runs_for(125)
def test_chaos_fleet_with_replays_short(tmp_path):
    argv = [sys.executable, str(HERE / "chaos.py"), "--fleet", "3", "--events", "2000", "--devices", "24",
            "--kills", "10", "--replays", "3", "--config-changes", "3", "--partitions", "12", "--seed", "20261129", "--bin", h.mailpush_bin(),
            "--workdir", str(tmp_path / "chaos"), "--timeout", "240"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    out = p.stdout + ("\n--- stderr ---\n" + p.stderr if p.stderr else "")
    print(out)
    assert p.returncode == 0, f"chaos.py exited {p.returncode}:\n{out[-6000:]}"
    assert "replays=3" in p.stdout
    assert p.stdout.count("duplicates=0 missing=0 unexpected=0") == 2
