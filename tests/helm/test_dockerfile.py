"""Static checks of the Dockerfile and .dockerignore (no docker engine needed)."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import shlex

import pytest
import yaml

from conftest import CHART_DIR, REPO

RUNTIME_PACKAGES = {"librdkafka1", "libjemalloc2", "libsqlite3-0", "libssl3", "ca-certificates"}
BUILD_PACKAGES = {"librdkafka-dev", "libjemalloc-dev", "libsqlite3-dev", "libssl-dev"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue  # comments (also inside continuations) and blank lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "dangling line continuation"
    return out


def stages() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """Global ARG defaults and the instructions of each stage (FROM first)."""
    args: dict[str, str] = {}
    result: list[list[tuple[str, str]]] = []
    for ins, rest in instructions():
        if ins == "FROM":
            result.append([])
        if not result:
            assert ins == "ARG", f"{ins} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        result[-1].append((ins, rest))
    return args, result


def resolve(image: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)


def apt_installs(stage: list[tuple[str, str]]) -> list[set[str]]:
    """Package sets of every `apt-get install` in the stage's RUN lines."""
    found = []
    for ins, rest in stage:
        if ins != "RUN":
            continue
        for cmd in re.split(r"&&|;", rest):
            words = shlex.split(cmd)
            if len(words) >= 2 and words[0] == "apt-get" and "install" in words:
                after = words[words.index("install") + 1:]
                found.append({w for w in after if not w.startswith("-")})
    return found


def test_two_stages_with_expected_bases():
    args, st = stages()
    assert len(st) == 2
    build_from = resolve(st[0][0][1], args).split()
    runtime_from = resolve(st[1][0][1], args).split()
    # An official swift image on Debian bookworm, with the Swift that development and CI use (6.3).
    assert re.fullmatch(r"swift:6\.3(\.\d+)?-bookworm", build_from[0]), build_from
    assert build_from[1:] == ["AS", "build"]
    assert runtime_from[0] == "debian:bookworm-slim"


def test_build_stage():
    _, st = stages()
    build = st[0]
    installs = apt_installs(build)
    assert installs and BUILD_PACKAGES <= set().union(*installs)
    runs = " ".join(rest for ins, rest in build if ins == "RUN")
    assert re.search(r"swift build -c release --product mailpush\b[^&]*--static-swift-stdlib", runs)


def test_runtime_installs_only_the_runtime_libraries():
    _, st = stages()
    runtime = st[1]
    installs = apt_installs(runtime)
    assert installs == [RUNTIME_PACKAGES]
    runs = " ".join(rest for ins, rest in runtime if ins == "RUN")
    assert "--no-install-recommends" in runs
    assert "rm -rf /var/lib/apt/lists/*" in runs
    copies = [rest for ins, rest in runtime if ins == "COPY"]
    assert all("--from=build" in c for c in copies), "runtime stage copies only build outputs"
    assert any(c.endswith("/usr/local/bin/mailpush") for c in copies)


def test_image_carries_the_multi_buffer_rsa_library():
    """The build stage installs libcrypto_mb with the same script as `make deps`; the runtime stage copies it and
    lets the loader find it by name (mailpush loads it with dlopen)."""
    _, st = stages()
    build, runtime = st
    runs = " ".join(rest for ins, rest in build if ins == "RUN")
    assert "tools/install-crypto-mb /staging/lib" in runs
    assert any(rest.endswith("tools/install-crypto-mb ./tools/") for ins, rest in build if ins == "COPY")
    copies = [rest for ins, rest in runtime if ins == "COPY"]
    assert any("/staging/lib/" in c and c.endswith("/usr/local/lib/") for c in copies)
    assert ("RUN", "ldconfig") in runtime
    assert (REPO / "tools" / "install-crypto-mb").exists()


def test_runs_as_fixed_non_root_user_matching_the_chart():
    _, st = stages()
    runtime = st[1]
    users = [rest for ins, rest in runtime if ins == "USER"]
    assert users, "no USER in the runtime stage"
    # The last USER wins; numeric so Kubernetes runAsNonRoot can verify it.
    m = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1])
    assert m, f"USER must be numeric: {users[-1]}"
    uid, gid = int(m.group(1)), int(m.group(2) or m.group(1))
    assert uid != 0 and gid != 0
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert uid == values["securityContext"]["runAsUser"] == values["podSecurityContext"]["runAsUser"]
    assert gid == values["podSecurityContext"]["fsGroup"]
    # Nothing after USER switches back to root.
    after = runtime[[i for i, (ins, _) in enumerate(runtime) if ins == "USER"][-1]:]
    assert not any(ins == "RUN" for ins, _ in after[1:])


def test_entrypoint_cmd_volume_port():
    _, st = stages()
    runtime = dict((ins, rest) for ins, rest in st[1])
    assert json.loads(runtime["ENTRYPOINT"]) == ["mailpush"]
    assert json.loads(runtime["CMD"]) == ["run"]
    assert runtime["VOLUME"] in ("/var/lib/mailpush", '["/var/lib/mailpush"]')
    assert runtime["EXPOSE"] == "8080"


def _ignored(patterns: list[str], path: str) -> bool:
    """Approximation of .dockerignore matching (last match wins, ! negates)."""
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        p = p.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(pre, p) or fnmatch.fnmatchcase(pre, p.replace("**/", "")) for pre in prefixes):
            ignored = not neg
    return ignored


def test_dockerignore():
    patterns = [l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    for required in (".build*", ".mailpush", ".git"):
        assert required in patterns
    for path in (".build/release/mailpush", ".build-linux/x", ".mailpush/state.sqlite", ".git/HEAD"):
        assert _ignored(patterns, path), path
    # What the build stage COPYs must stay in the context.
    for path in ("Package.swift", "Sources/mailpush/main.swift", "tools/install-crypto-mb",
                 "Tests/MailpushCoreTests/Placeholder.swift"):
        assert not _ignored(patterns, path), path


def _package_lines():
    """Every `.package(` declaration of Package.swift, joined over its lines up to the closing parenthesis."""
    text = (REPO / "Package.swift").read_text()
    lines = []
    for match in re.finditer(r"\.package\(", text):
        depth, end = 0, match.start()
        for end in range(match.start(), len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0 and text[end] == ")":
                break
        lines.append(text[match.start():end + 1])
    return lines


def test_every_dependency_is_pinned_exactly():
    """A build anywhere gets the versions the tests ran with: each `.package(` names `exact:`."""
    lines = _package_lines()
    assert lines, "Package.swift declares no dependencies?"
    loose = [l for l in lines if not re.search(r'exact:\s*"\d+\.\d+\.\d+"', l)]
    assert not loose, f"dependencies without an exact: version pin: {loose}"


def test_package_resolved_is_not_tracked():
    """A committed Package.resolved pins one machine's mirror revisions and breaks every other builder."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing is tracked")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", "Package.resolved"],
                             check=True, capture_output=True, text=True).stdout.strip()
    assert tracked == "", "Package.resolved is tracked by git: git rm --cached Package.resolved"
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "Package.resolved"])
    assert ignored.returncode == 0, "Package.resolved must be listed in .gitignore"


def test_image_resolves_from_package_swift():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^COPY Package\.swift \./$", text, re.M)
    assert "Package.resolved" not in text.replace("no Package.resolved", "")
    assert "--force-resolved-versions" not in text


@pytest.mark.parametrize("path", ["Package.swift", "Sources", "Tests"])
def test_dockerfile_copies_exist(path):
    assert (REPO / path).exists()
