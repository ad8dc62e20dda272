"""Many registered devices (issue 11): the registrations stay in the state file, so a restart does not
load them and memory does not grow with them. 50,000 devices here; bench/directory_scale.py runs 1M."""

from __future__ import annotations

import random

import directory_scale as scale
import sudo_client

DEVICES = 50_000
PER_OWNER = 4
KEYED_OWNERS = 200


def test_restart_with_many_devices_is_quick_and_small_and_finds_every_device(world, kafka):
    key = sudo_client.generate_key()
    # The same service with almost no devices: what memory costs without a directory.
    small_state = world.workdir / "small-state"
    scale.publish(world.bootstrap, PER_OWNER, PER_OWNER, 1, key)
    service, small = scale.start_and_measure(world, small_state)
    scale.stop(service)

    scale.publish(world.bootstrap, DEVICES, PER_OWNER, KEYED_OWNERS, key)
    state = world.workdir / "state"
    service, first = scale.start_and_measure(world, state)
    scale.events_reach_devices(world, random.sample(range(KEYED_OWNERS), 20), PER_OWNER)
    scale.stop(service)

    service, restart = scale.start_and_measure(world, state)
    # Every device is still found after a restart that loaded none of them.
    scale.events_reach_devices(world, random.sample(range(KEYED_OWNERS), 20), PER_OWNER)
    after_emails = scale.peak_rss_mb(service.proc.pid)
    scale.stop(service)

    report = (f"small: {small}; first start with {DEVICES} devices: {first}; restart: {restart}; "
              f"restart peak RSS after emails {after_emails:.0f} MB")
    # Generous bounds for a debug build on a loaded machine; a directory loaded into memory at start-up
    # takes seconds and ~100 MB more at this size. The restart processes events once its partitions are resumed
    # from the local state; /readyz also waits for the group's join, which the development broker holds for
    # about 3 s after a member restarts, not the service's cost.
    assert restart.seconds_to_processing < 3, report
    assert restart.seconds_to_ready < 15, report
    assert restart.peak_rss_mb < small.peak_rss_mb + 40, report
    assert after_emails < small.peak_rss_mb + 60, report
    assert first.peak_rss_mb < 300, report
