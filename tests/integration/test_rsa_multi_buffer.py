"""RSA eight at a time (docs/operations.md, "RSA eight at a time"): with the library `make deps` installs, the
default service seals through Intel's libcrypto_mb on a processor with AVX-512 IFMA, and every job still opens
with the Sudo client's own RSA-OAEP (Python's `cryptography`) — for keys of both algorithms and of a size the
library has no method for, in one batch. `--rsa-multi-buffer off` seals one operation at a time."""

from __future__ import annotations

import signal
from pathlib import Path

import mailpush_harness as h
import sudo_client
from cryptography.hazmat.primitives.asymmetric import rsa

PROCESSOR_HAS_IFMA = " avx512ifma" in Path("/proc/cpuinfo").read_text()


def starting_line(service: h.Service) -> dict:
    return [l for l in service.proc.log_lines() if l["message"] == "starting"][0]


def publish_and_open(kafka, service, keys_by_address: dict, count: int) -> set[str]:
    for address, (private, algorithm, key_id) in keys_by_address.items():
        kafka.produce(h.KEYS, address, sudo_client.key_record(private, address, key_id, algorithm=algorithm))
    kafka.produce(h.DEVICES, "dev-ios-1", h.ios_device("dev-ios-1"))
    kafka.produce(h.DEVICES, "dev-android-1", h.android_device("dev-android-1"))
    kafka.produce(h.DEVICES, "dev-android-2", h.android_device("dev-android-2"))
    addresses = sorted(keys_by_address)
    devices = ["dev-ios-1", "dev-android-1", "dev-android-2"]
    expected = {}
    for index in range(count):
        address = addresses[index % len(addresses)]
        ev = h.event(f"em-msg-{index}", address=address)
        for device in devices:
            expected[sudo_client.job_id(address, ev["messageId"], device)] = (address, ev)
        kafka.produce(h.EVENTS, address, ev)
    jobs = kafka.consume(h.JOBS, min_count=len(expected), timeout=90, idle=1.0)
    assert sorted(r.json()["jobId"] for r in jobs) == sorted(expected)
    sealed = set()
    for record in jobs:
        job = record.json()
        h.validate_job(job)
        address, ev = expected[job["jobId"]]
        private, algorithm, key_id = keys_by_address[address]
        data, plain = sudo_client.open_data(private, sudo_client.sudoplatform_of(job)["data"])
        assert (data["keyId"], data["algorithm"]) == (key_id, algorithm)
        assert plain == sudo_client.expected_plaintext(ev)
        sealed.add(data["sealed"])
    # Every job its own AES key and RSA operation (CONTRACT §6): no two payloads alike.
    assert len(sealed) == len(jobs)
    return sealed


def test_the_default_seals_eight_at_a_time_and_every_job_opens(world, kafka, keys):
    keys_by_address = {
        "em-add-1": (keys.a, sudo_client.CBC, "cbc-2048"),
        "em-add-2": (keys.b, sudo_client.GCM, "gcm-2048"),
        # 2560 bits: no multi-buffer method, sealed one at a time in the same batches.
        "em-add-3": (rsa.generate_private_key(public_exponent=65537, key_size=2560), sudo_client.CBC, "cbc-2560"),
    }
    service = world.service()
    publish_and_open(kafka, service, keys_by_address, count=40)
    assert service.stop(signal.SIGTERM) == 0
    rsa_line = starting_line(service)["rsa"]
    if PROCESSOR_HAS_IFMA:
        assert rsa_line.startswith("libcrypto_mb.so.13, eight operations a call"), rsa_line
    else:
        assert rsa_line.startswith("one at a time (swift-crypto): "), rsa_line


def test_off_seals_one_at_a_time(world, kafka, keys):
    service = world.service(args=["--rsa-multi-buffer", "off"])
    publish_and_open(kafka, service, {"em-add-1": (keys.a, sudo_client.CBC, "cbc-2048")}, count=6)
    assert service.stop(signal.SIGTERM) == 0
    assert starting_line(service)["rsa"] == "one at a time (swift-crypto; --rsa-multi-buffer off)"


def test_a_bad_setting_is_refused_by_name(world):
    p = world.run_cli(["run", "--rsa-multi-buffer", "sometimes"], timeout=30)
    assert p.returncode == 64, p.stderr
    assert "--rsa-multi-buffer must be auto or off, got \"sometimes\"" in p.stderr
