"""Fixtures for mailpush black-box tests.

`world`   — a World (processes + files in tmp_path) with a running `mailpush devbroker`;
            every process it started is ended at teardown.
`kafka`   — an independent confluent-kafka client on that broker.
`keys`    — RSA-2048 key pairs generated once per session with `cryptography`.

The mailpush binary comes from $MAILPUSH_BIN (default <repo>/.build/debug/mailpush). If it is
missing, every test that needs it FAILS (not skips, not errors) with a message saying so.
"""

from __future__ import annotations

import pytest

import mailpush_harness as h
import sudo_client


def pytest_configure(config):
    # Longest first pays only if a worker gets its next test when it is free: by default xdist hands each worker a
    # run of consecutive tests at the start, which would give all the long ones to the first.
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items):
    """The longest tests (`@pytest.mark.runs_for(seconds)`) first, the rest in their usual order, so that the run
    ends with short tests spread over the workers, not with a long one collected last running alone. The heal tests
    stay unmarked on purpose: they bound times in seconds, and the long tests keep both cores busy."""

    def seconds(item) -> float:
        marker = item.get_closest_marker("runs_for")
        return marker.args[0] if marker else 0

    items.sort(key=seconds, reverse=True)  # a stable sort: the unmarked keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    world = getattr(item, "_mailpush_world", None)
    if rep.failed and world is not None:
        for name, text in world.log_sections():
            rep.sections.append((f"log of {name}", text))


class MissingBinary:
    """Stands in for a World when the binary is missing, so the test FAILS (in its body, not as
    a setup error and never as a skip) with a message saying what to build."""

    def __init__(self, message: str):
        self._message = message

    def __getattr__(self, name):
        raise h.HarnessError(self._message)


def _new_world(request, tmp_path, broker: bool, partitions: int = 4):
    try:
        binary = h.require_bin()
    except h.HarnessError as e:
        return MissingBinary(str(e))
    w = h.World(tmp_path, binary)
    request.node._mailpush_world = w
    request.addfinalizer(w.close)
    if broker:
        w.devbroker(partitions=partitions)
    return w


@pytest.fixture
def world(request, tmp_path) -> h.World:
    return _new_world(request, tmp_path, broker=True)


@pytest.fixture
def bare_world(request, tmp_path) -> h.World:
    """A World without a devbroker (CLI tests)."""
    return _new_world(request, tmp_path, broker=False)


@pytest.fixture
def kafka(world) -> h.Kafka:
    return world if isinstance(world, MissingBinary) else world.kafka


class Keys:
    def __init__(self):
        self.a = sudo_client.generate_key()
        self.b = sudo_client.generate_key()


@pytest.fixture(scope="session")
def keys() -> Keys:
    return Keys()
