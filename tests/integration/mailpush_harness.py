"""Black-box harness for mailpush: processes, Kafka, HTTP, scenario builders, job checks.

Everything here talks to mailpush only the way a user does: the `mailpush` binary, Kafka
topics (through an independent confluent-kafka client) and its HTTP port. The contract is
docs/contract.md; section numbers below refer to it.

The binary is $MAILPUSH_BIN, default <repo>/.build/debug/mailpush.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import OFFSET_BEGINNING

import sudo_client

if TYPE_CHECKING:
    from cut_off_host import CutOffHost

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"
EXAMPLES = REPO / "examples"

EVENTS = "email.received"
DEVICES = "mailpush.devices"
KEYS = "mailpush.address-keys"
JOBS = "mailpush.push-jobs"
DEAD = "mailpush.dead-letters"

DEFAULT_TTL_MS = 2419200 * 1000
PAYLOAD_LIMIT = 4096

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_SOFTWARE = 0, 64, 69, 70


# librdkafka's own log lines (e.g. "Connect … failed" after a broker stopped) go to Python
# logging, where pytest captures them, instead of the terminal.
KAFKA_LOG = logging.getLogger("kafka-client")


class HarnessError(AssertionError):
    """A failure of the system under test or its environment, with a readable message."""


# --------------------------------------------------------------------------- binary

def mailpush_bin() -> str:
    path = os.environ.get("MAILPUSH_BIN") or str(REPO / ".build" / "debug" / "mailpush")
    # Processes start in their own temporary directories: a relative path must not depend on that.
    return os.path.abspath(path)


def require_bin() -> str:
    path = mailpush_bin()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise HarnessError(
            f"mailpush binary not found or not executable at {path!r}. "
            f"Build it (`swift build` in {REPO}) or point MAILPUSH_BIN at it.")
    return path


def contract_path() -> Path:
    """The project's statement of its external contract."""
    return REPO / "docs" / "contract.md"


def vector_path(name: str) -> Path:
    """A contract test vector, carried in the repository as a resource of the Swift test support."""
    return REPO / "Sources" / "MailpushTestSupport" / "Vectors" / name


def clean_env(extra: dict | None = None, drop: Iterable[str] = ()) -> dict:
    """The test runner's environment without MAILPUSH_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILPUSH_")}
    for k in drop:
        env.pop(k, None)
    env.update(extra or {})
    return env


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for ports nobody asked for: `bind(0)` and every outgoing connection draw from it."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port nothing listens on now, below the kernel's ephemeral range. A port from `bind(0)` lies in that range,
    from which every outgoing connection (each Kafka client's, the tests run three at a time) and every development
    broker's listener take theirs: one could take it before the service binds it, and a CI run saw a service exit
    with `--http-port …: cannot listen (… Address already in use)`. Below the range only another test's pick can
    collide with it, one chance in some 20,000."""
    low, _ = ephemeral_port_range()
    if low - 10_000 >= 1_000:
        for _ in range(200):
            port = random.randrange(10_000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- processes

class Proc:
    """A child process whose stdout+stderr go to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None,
                 cwd: str | None = None, stdin_pipe: bool = False):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self._log.write(f"$ {' '.join(argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                                      env=env, cwd=cwd)
        self.pid = self.popen.pid

    def tell(self, line: str) -> None:
        """Writes one line to the process's standard input (devbroker --control-stdin)."""
        self.popen.stdin.write((line + "\n").encode())
        self.popen.stdin.flush()

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self):
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send `sig` and wait for exit; SIGKILL after `timeout` (and report it)."""
        self.send_signal(sig)
        rc = self.wait(timeout)
        if rc is None:
            self.popen.kill()
            self.popen.wait(10)
            raise HarnessError(f"{self.name} did not exit within {timeout}s of signal {sig}; killed.\n"
                               f"{self.log_tail()}")
        return rc

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
        self.popen.wait(10)

    def close(self) -> None:
        """Teardown: never leave the process behind."""
        if self.alive():
            self.popen.terminate()
            if self.wait(10) is None:
                self.popen.kill()
                self.popen.wait(10)
        try:
            self._log.close()
        except Exception:  # noqa: BLE001
            pass

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_lines(self) -> list[dict]:
        """The JSON lines of its log (a service's `--log-format json`, the default when not on a terminal)."""
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]

    def log_tail(self, chars: int = 6000) -> str:
        text = self.log_text()
        return f"--- {self.name} log ({self.log_path}) ---\n" + text[-chars:]


def wait_for(pred: Callable[[], object], timeout: float, what: str, interval: float = 0.1,
             on_fail: Callable[[], str] | None = None):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            extra = on_fail() if on_fail else ""
            raise HarnessError(f"timed out after {timeout}s waiting for {what}\n{extra}")
        time.sleep(interval)


# --------------------------------------------------------------------------- HTTP

def http_get(port: int, path: str, timeout: float = 5, host: str = "127.0.0.1") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
        return 0, ""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {metric name: sum over all label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


# --------------------------------------------------------------------------- Kafka

@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    #: The broker record's timestamp (CreateTime, ms), where read back.
    timestamp_ms: int | None = None

    @property
    def key_str(self) -> str | None:
        return None if self.key is None else self.key.decode("utf-8")

    def json(self):
        return json.loads(self.value)

    @property
    def pos(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


def encode_value(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: How long `Kafka.consume` may take to read what a topic held when it was called.
READ_TO_END_LIMIT = 120.0


def publish_fast(bootstrap: str, items, linger_ms: int = 50, timeout: float = 120) -> None:
    """(topic, key, value, headers) items, as fast as the broker takes them, in large message sets (the
    development broker answers a fetch with one message set a partition, so a backlog published a record a
    request is fetched a few records a round trip). A `linger_ms` longer than the publishing puts each partition's
    records in as few message sets as fit (about 1 MB each): the end's flush sends them. Raises if any record was
    not acknowledged within `timeout` seconds of the flush, or failed."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 500000, "acks": "all"}, logger=KAFKA_LOG)
    failures: list = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(err)

    for topic, key, value, headers in items:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(timeout)
    if remaining or failures:
        raise HarnessError(f"publishing failed: {remaining} unacknowledged, errors {failures[:3]}")


class Kafka:
    """An independent Kafka client (not mailpush's) for producing inputs and reading outputs."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "linger.ms": 0, "message.max.bytes": 2000000},
                                  logger=KAFKA_LOG)

    def produce(self, topic: str, key: str | bytes | None, value, headers=None,
                timeout: float = 30, partition: int | None = None) -> Record:
        """Produce one record (to `partition`, or where its key hashes) and wait until the broker acknowledged it."""
        results: list = []
        k = key.encode("utf-8") if isinstance(key, str) else key
        v = encode_value(value)
        where = {} if partition is None else {"partition": partition}
        self._producer.produce(topic, key=k, value=v, headers=headers,
                               on_delivery=lambda err, msg: results.append((err, msg)), **where)
        self._producer.flush(timeout)
        if not results:
            raise HarnessError(f"produce to {topic} not acknowledged within {timeout}s")
        err, msg = results[0]
        if err is not None:
            raise HarnessError(f"produce to {topic} failed: {err}")
        return Record(topic, msg.partition(), msg.offset(), k, v,
                      {h: (b or b"").decode("utf-8", "replace") for h, b in (headers or [])})

    def produce_many(self, items: Iterable[tuple[str, str | bytes | None, object]],
                     timeout: float = 60, partition: int | None = None) -> list[Record]:
        """Produce (topic, key, value) items (to `partition`, or where each key hashes), acknowledged, in order
        per partition."""
        slots: list = []
        items = list(items)
        where = {} if partition is None else {"partition": partition}
        for i, (topic, key, value) in enumerate(items):
            k = key.encode("utf-8") if isinstance(key, str) else key
            v = encode_value(value)
            slots.append(None)

            def cb(err, msg, i=i, topic=topic, k=k, v=v):
                slots[i] = (err, Record(topic, msg.partition(), msg.offset(), k, v))

            while True:
                try:
                    self._producer.produce(topic, key=k, value=v, on_delivery=cb, **where)
                    break
                except BufferError:
                    self._producer.poll(0.1)
            self._producer.poll(0)
        self._producer.flush(timeout)
        out = []
        for s in slots:
            if s is None:
                raise HarnessError(f"{len(items)} records not all acknowledged within {timeout}s")
            if s[0] is not None:
                raise HarnessError(f"produce failed: {s[0]}")
            out.append(s[1])
        return out

    def partitions(self, topic: str, timeout: float = 20) -> list[int]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"probe-{uuid.uuid4()}"},
                     logger=KAFKA_LOG)
        try:
            deadline = time.monotonic() + timeout
            while True:
                md = c.list_topics(topic, timeout=5)
                t = md.topics.get(topic)
                if t is not None and t.error is None and t.partitions:
                    return sorted(t.partitions)
                if time.monotonic() > deadline:
                    raise HarnessError(f"topic {topic} has no partitions after {timeout}s")
                time.sleep(0.2)
        finally:
            c.close()

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """Each partition's (first offset, end offset), asked of the broker."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"probe-{uuid.uuid4()}"},
                     logger=KAFKA_LOG)
        try:
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                    for p in self.partitions(topic)}
        finally:
            c.close()

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (high watermark)."""
        return {p: end for p, (_, end) in self.watermarks(topic).items()}

    def log_starts(self, topic: str) -> dict[int, int]:
        """Each partition's first offset (low watermark). Nonzero on the development broker means it dropped a
        partition's oldest records: it keeps about 5 MB per partition and never deletes anything else."""
        return {p: start for p, (start, _) in self.watermarks(topic).items()}

    def consume(self, topic: str, min_count: int = 0, timeout: float = 30, idle: float = 1.0,
                until: Callable[[list[Record]], bool] | None = None) -> list[Record]:
        """Read `topic` from the beginning (committed records only).

        Always reads at least up to the end offsets the topic had when called (so "nothing
        there" is never concluded before looking, however slow the machine: `timeout` does not
        cut that short; `READ_TO_END_LIMIT` does, with an error). Then returns when
        `until(records)` (default: at least `min_count` records) holds and no new record arrived
        for `idle` seconds, or after `timeout` seconds in any case; the caller asserts on what it got.
        """
        done = until or (lambda recs: len(recs) >= min_count)
        c = Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": f"it-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        }, logger=KAFKA_LOG)
        records: list[Record] = []
        try:
            parts = self.partitions(topic)
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
            start = time.monotonic()
            last = start
            ends = {}
            for p in parts:
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                if hi > lo:
                    ends[p] = hi
            caught_up = not ends

            def reached_ends() -> bool:
                pos = c.position([TopicPartition(topic, p) for p in ends])
                return all(tp.offset >= ends[tp.partition] for tp in pos)

            while True:
                m = c.poll(0.1)
                now = time.monotonic()
                if m is not None:
                    if m.error():
                        if m.error().fatal():
                            raise KafkaException(m.error())
                    else:
                        hdrs = {}
                        for hk, hv in (m.headers() or []):
                            hdrs[hk] = (hv or b"").decode("utf-8", "replace")
                        records.append(Record(m.topic(), m.partition(), m.offset(), m.key(),
                                              m.value(), hdrs, m.timestamp()[1]))
                        last = now
                        continue
                if not caught_up:
                    caught_up = reached_ends()
                if caught_up and done(records) and now - last >= idle:
                    break
                if caught_up and now - start > timeout:
                    break
                if now - start > max(timeout, READ_TO_END_LIMIT):
                    raise HarnessError(f"{topic} not read up to its end offsets {ends} within "
                                       f"{max(timeout, READ_TO_END_LIMIT):.0f} s")
        finally:
            c.close()
        records.sort(key=lambda r: (r.partition, r.offset))
        return records

    def close(self):
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None


# --------------------------------------------------------------------------- the world under test

class Service:
    """One `mailpush run` process."""

    def __init__(self, world: "World", brokers: str | None, state_dir: Path, args: list[str],
                 env: dict | None, name: str, wait_ready: bool = True, ready_timeout: float = 90,
                 host: CutOffHost | None = None):
        self.world = world
        self.brokers = brokers
        self.state_dir = state_dir
        self.args = list(args)
        self.env = env
        #: The network namespace it runs in (cut_off_host.py); None: this one.
        self.host = host
        self.address = host.address if host else "127.0.0.1"
        self.port = free_port()
        argv = [world.bin, "run"]
        if brokers is not None:
            argv += ["--brokers", brokers]
        argv += ["--state-dir", str(state_dir), "--http-port", str(self.port)]
        # No ownership flag: the default, a consumer group (its first join costs the development broker's 3 s
        # initial rebalance delay). Static ownership is pinned only by the tests about it.
        argv += self.args
        self.proc = world.spawn(name, host.argv(argv) if host else argv, env=env)
        if wait_ready:
            self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float = 90) -> None:
        def ready():
            if not self.proc.alive():
                raise HarnessError(f"mailpush run exited with code {self.proc.returncode} before "
                                   f"/readyz returned 200\n{self.proc.log_tail()}")
            return self.is_ready()
        wait_for(ready, timeout, f"/readyz 200 on {self.address}:{self.port}", interval=0.2,
                 on_fail=self.proc.log_tail)

    def is_ready(self) -> bool:
        return http_get(self.port, "/readyz", timeout=2, host=self.address)[0] == 200

    def metrics(self) -> dict[str, float]:
        """The service's metrics. A read that gets no answer within 5 s is tried twice more while the process lives:
        with both cores rendering a backlog in the debug build, one read went unanswered for 5 s (session 53's CI),
        and a Prometheus scrape would simply come again."""
        for _ in range(3):
            status, body = http_get(self.port, "/metrics", host=self.address)
            if status != 0 or not self.proc.alive():
                break
        if status != 200:
            raise HarnessError(f"/metrics returned {status or 'no answer'}")
        return parse_metrics(body)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        return self.proc.stop(sig, timeout)

    def kill(self) -> None:
        self.proc.kill()

    def restart(self, wait_ready: bool = True) -> "Service":
        """A new `mailpush run` with the same brokers, state dir and flags (new HTTP port)."""
        return self.world.service(brokers=self.brokers, state_dir=self.state_dir, args=self.args,
                                  env=self.env, wait_ready=wait_ready, host=self.host)

    def assert_alive(self) -> None:
        if not self.proc.alive():
            raise HarnessError(f"mailpush run exited with code {self.proc.returncode}\n"
                               f"{self.proc.log_tail()}")


class World:
    """Per-test processes and files; close() always ends every process it started."""

    def __init__(self, workdir: Path, binary: str | None = None):
        self.workdir = Path(workdir)
        self.bin = binary or require_bin()
        self.procs: list[Proc] = []
        self.bootstrap: str | None = None
        self.kafka: Kafka | None = None
        self._n = 0

    def spawn(self, name: str, argv: list[str], env: dict | None = None, stdin_pipe: bool = False) -> Proc:
        self._n += 1
        p = Proc(f"{name}#{self._n}", argv, self.workdir / "logs" / f"{self._n:02d}-{name}.log",
                 env=env if env is not None else clean_env(), cwd=str(self.workdir), stdin_pipe=stdin_pipe)
        self.procs.append(p)
        return p

    def devbroker(self, partitions: int = 4, timeout: float = 60, control: bool = False) -> str:
        """Starts `mailpush devbroker`; with `control`, `self.control(...)` injects faults."""
        bfile = self.workdir / f"devbroker-{self._n + 1}.bootstrap"
        proc = self.spawn("devbroker", [self.bin, "devbroker", "--partitions", str(partitions),
                                        "--bootstrap-file", str(bfile)] + (["--control-stdin"] if control else []),
                          stdin_pipe=control)
        self.broker_proc = proc

        def bootstrap():
            if not proc.alive():
                raise HarnessError(f"mailpush devbroker exited with code {proc.returncode}\n"
                                   f"{proc.log_tail()}")
            try:
                text = bfile.read_text().strip()
            except OSError:
                return None
            return text if re.fullmatch(r"[^\s:]+:\d+(,[^\s:]+:\d+)*", text) else None

        bs = wait_for(bootstrap, timeout, f"devbroker bootstrap file {bfile}", interval=0.1,
                      on_fail=proc.log_tail)
        self.bootstrap = bs
        self.kafka = Kafka(bs)
        # The five default topics exist with `partitions` partitions (§9).
        for t in (EVENTS, DEVICES, KEYS, JOBS, DEAD):
            self.kafka.partitions(t)
        return bs

    def control(self, command: str, timeout: float = 30) -> None:
        """Tells the development broker started with `devbroker(control=True)` to inject a fault (`rtt 1 500`,
        `errors …`, `down 1`) and waits until it has: it answers `ok <command>` on its standard output (its log).
        A test that acted right after writing the line could run before the fault on a loaded machine."""
        proc = self.broker_proc
        answer = f"ok {command}\n"
        before = proc.log_text().count(answer)
        proc.tell(command)
        wait_for(lambda: proc.log_text().count(answer) > before, timeout, f"the devbroker to apply {command!r}",
                 interval=0.02, on_fail=proc.log_tail)

    def service(self, brokers: str | None = "default", state_dir: Path | None = None,
                args: Iterable[str] = (), env: dict | None = None, wait_ready: bool = True,
                name: str = "run", host: CutOffHost | None = None) -> Service:
        """With `host`, the service runs in that network namespace (cut_off_host.py)."""
        if brokers == "default":
            brokers = self.bootstrap
        if state_dir is None:
            state_dir = self.workdir / f"state-{uuid.uuid4().hex[:8]}"
        return Service(self, brokers, Path(state_dir), list(args), env, name, wait_ready, host=host)

    def run_cli(self, argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin] + argv, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else clean_env(), cwd=str(self.workdir),
                              stdin=subprocess.DEVNULL)

    def log_sections(self) -> list[tuple[str, str]]:
        return [(p.name, p.log_text()[-20000:]) for p in self.procs]

    def close(self) -> None:
        if self.kafka:
            try:
                self.kafka.close()
            except Exception:  # noqa: BLE001
                pass
        for p in reversed(self.procs):
            p.close()


# --------------------------------------------------------------------------- scenario builders

RULE_NOT_MESSAGE_RECEIVED = '{"!=":[{"var":"meta.type"},"messageReceived"]}'
IOS_CATCH_ALL = '{"==":[1,1]}'
ANDROID_CATCH_ALL = '{"==" : [ 1, 1]}'


def item(action: str, rule: str, service: str = "emService") -> dict:
    return {"serviceName": service, "actionType": action, "rule": rule}


def init_filter(android: bool = False, disable_addresses: Iterable[str] = (),
                disable_sudos: Iterable[str] = ()) -> list[dict]:
    """What the Sudo SDK writes for initEmailNotifications (+ per address/Sudo DISABLE items)."""
    items = [item("DISABLE", RULE_NOT_MESSAGE_RECEIVED)]
    for a in disable_addresses:
        items.append(item("DISABLE", json.dumps({"==": [{"var": "meta.emailAddressId"}, a]},
                                                separators=(",", ":"))))
    for s in disable_sudos:
        items.append(item("DISABLE", json.dumps({"==": [{"var": "meta.sudoId"}, s]},
                                                separators=(",", ":"))))
    items.append(item("ENABLE", ANDROID_CATCH_ALL if android else IOS_CATCH_ALL))
    return items


def ios_device(device_id: str, owner: str = "user-1", token: str | None = None,
               bundle_id: str = "com.example.mail", filter: list | None = None) -> dict:
    return {"deviceId": device_id, "owner": owner, "bundleId": bundle_id, "platform": "ios",
            "pushToken": token or f"apns-{device_id}-{uuid.uuid4().hex}",
            "filter": init_filter() if filter is None else filter}


def android_device(device_id: str, owner: str = "user-1", token: str | None = None,
                   bundle_id: str = "com.example.mail", filter: list | None = None) -> dict:
    return {"deviceId": device_id, "owner": owner, "bundleId": bundle_id, "platform": "android",
            "pushToken": token or f"fcm-{device_id}-{uuid.uuid4().hex}",
            "filter": init_filter(android=True) if filter is None else filter}


def sponsor_fcm_device(device_id: str, owner: str = "user-1", token: str | None = None,
                       filter: list | None = None) -> dict:
    return {"deviceId": device_id, "owner": owner,
            "comMethod": {"id": f"sponsee-{device_id}", "type": 4,
                          "value": "FCM:" + (token or f"fcm-{device_id}-{uuid.uuid4().hex}")},
            "filter": init_filter(android=True) if filter is None else filter}


def sponsor_webhook_device(device_id: str, owner: str = "user-1", details: str | None = None,
                           filter: list | None = None) -> dict:
    return {"deviceId": device_id, "owner": owner,
            "comMethod": {"id": f"sponsee-{device_id}", "type": 3,
                          "value": details or f"sponsee:{device_id}:route-1"},
            "filter": init_filter() if filter is None else filter}


_RECEIVED_BASE = 1718330541336


def event(message_id: str, address: str = "em-add-1", owner: str = "user-1", sudo: str = "sudo-1",
          **overrides) -> dict:
    """An EmailReceived v1 value; overrides may set any field (None deletes it)."""
    ev = {
        "type": "messageReceived", "owner": owner, "emailAddressId": address, "sudoId": sudo,
        "messageId": message_id, "folderId": f"{address}-INBOX", "encryptionStatus": "UNENCRYPTED",
        "subject": f"Subject of {message_id}",
        "from": {"emailAddress": "alice@example.com", "displayName": "Alice Example"},
        "hasAttachments": False, "sentAtEpochMs": _RECEIVED_BASE - 4336,
        "receivedAtEpochMs": _RECEIVED_BASE,
    }
    for k, v in overrides.items():
        if v is None:
            ev.pop(k, None)
        else:
            ev[k] = v
    return ev


# --------------------------------------------------------------------------- output helpers

def parse_source(header: str) -> tuple[str, int, int]:
    m = re.fullmatch(r"(.+)/(\d+)/(\d+)", header or "")
    if not m:
        raise HarnessError(f"mailpush-source header {header!r} is not <topic>/<partition>/<offset>")
    return m.group(1), int(m.group(2)), int(m.group(3))


def job_ids(records: list[Record]) -> list[str]:
    return [r.json()["jobId"] for r in records]


def by_job_id(records: list[Record]) -> dict[str, Record]:
    out: dict[str, Record] = {}
    for r in records:
        jid = r.json()["jobId"]
        if jid in out:
            raise HarnessError(f"jobId {jid} appears more than once (offsets "
                               f"{out[jid].pos} and {r.pos})")
        out[jid] = r
    return out


def serialized_len(obj) -> int:
    return len(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def check_shortened(original: str, got: str, what: str) -> None:
    """A field shortened per §7: a prefix cut on a character boundary, ending with U+2026."""
    if got == original:
        return
    assert got.endswith("\u2026"), f"{what} was changed but does not end with …: {got[-20:]!r}"
    assert original.startswith(got[:-1]), f"{what} is not a prefix of the original plus …"


def load_schema_validator(name: str):
    """A Draft 2020-12 validator for schemas/<name> with all sibling schemas registered."""
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Registry, Resource

    resources = []
    for p in sorted(SCHEMAS.glob("*.json")):
        doc = json.loads(p.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc)))
    registry = Registry().with_resources(resources)
    schema = json.loads((SCHEMAS / name).read_text())
    return Draft202012Validator(schema, registry=registry, format_checker=FormatChecker())


_JOB_VALIDATOR = None


def validate_job(job: dict) -> None:
    global _JOB_VALIDATOR
    if _JOB_VALIDATOR is None:
        _JOB_VALIDATOR = load_schema_validator("push-job.v1.schema.json")
    errors = sorted(_JOB_VALIDATOR.iter_errors(job), key=lambda e: list(e.path))
    if errors:
        raise HarnessError("push job does not match schemas/push-job.v1.schema.json:\n" +
                           "\n".join(f"  at /{'/'.join(map(str, e.path))}: {e.message}"
                                     for e in errors[:10]) +
                           f"\njob: {json.dumps(job)[:2000]}")


def assert_job(rec: Record, *, ev: dict, ev_rec: Record, device: dict, private_key=None,
               key: dict | None = None, ttl_ms: int = DEFAULT_TTL_MS, webhook_url: str | None = None,
               alert: tuple[str, str] | None = None, created_window: tuple[int, int] | None = None,
               allow_shortened: bool = False) -> dict:
    """Check one push job record against §1, §6, §7 for event `ev` and device `device`.

    Returns the opened plaintext (or {} for webhook jobs).
    """
    job = rec.json()
    validate_job(job)
    dev_id = device["deviceId"]
    jid = sudo_client.job_id(ev["emailAddressId"], ev["messageId"], dev_id)

    # Record envelope (§1).
    assert rec.key_str == dev_id, f"job key {rec.key_str!r} != deviceId {dev_id!r}"
    assert rec.headers.get("mailpush-source") == ev_rec.pos, \
        f"mailpush-source {rec.headers.get('mailpush-source')!r} != {ev_rec.pos!r}"
    assert rec.headers.get("mailpush-job-id") == jid, \
        f"mailpush-job-id {rec.headers.get('mailpush-job-id')!r} != {jid!r}"

    # Common fields (§7).
    assert job["jobId"] == jid
    assert job["deviceId"] == dev_id
    assert job["owner"] == device["owner"]
    assert job["source"] == {"topic": ev_rec.topic, "partition": ev_rec.partition,
                             "offset": ev_rec.offset}
    assert job["expiresAtEpochMs"] == ev["receivedAtEpochMs"] + ttl_ms, \
        f"expiresAtEpochMs {job['expiresAtEpochMs']} != received + ttl {ev['receivedAtEpochMs'] + ttl_ms}"
    if created_window:
        lo, hi = created_window
        assert lo <= job["createdAtEpochMs"] <= hi, \
            f"createdAtEpochMs {job['createdAtEpochMs']} not within [{lo}, {hi}]"
    if "bundleId" in device:
        assert job.get("bundleId") == device["bundleId"]

    # No email content in clear anywhere in the job except the sealed blob (§7).
    clear = json.dumps(job, ensure_ascii=False)
    secrets = [ev.get("subject"), ev["from"]["emailAddress"], ev["from"].get("displayName"),
               (ev.get("replyTo") or {}).get("emailAddress"), (ev.get("replyTo") or {}).get("displayName")]
    for s in secrets:
        if s and len(s) >= 4:
            assert s not in clear, f"email content {s[:40]!r} appears in clear in the job"

    com = device.get("comMethod")
    if com and com["type"] == 3:
        assert job["platform"] == "webhook"
        assert job["webhook"] == {"url": webhook_url, "body": {
            "msgId": ev["messageId"], "sponseeDetails": com["value"],
            "metaData": {"msgType": "messageReceived"}}}
        return {}

    if com and com["type"] == 4:
        platform, token = "android", com["value"][len("FCM:"):]
    else:
        platform, token = device["platform"], device["pushToken"]
    assert job["platform"] == platform

    if platform == "ios":
        apns = job["apns"]
        assert apns["deviceToken"] == token
        assert apns["headers"] == {
            "apns-push-type": "alert", "apns-priority": "10",
            "apns-topic": device["bundleId"],
            "apns-expiration": str(job["expiresAtEpochMs"] // 1000)}
        payload = apns["payload"]
        assert payload["jobId"] == jid
        assert payload["aps"]["mutable-content"] == 1
        a = payload["aps"]["alert"]
        assert a["title"] and a["body"], "iOS alert text must be present"
        if alert:
            assert (a["title"], a["body"]) == alert
        assert serialized_len(payload) <= PAYLOAD_LIMIT, \
            f"apns.payload is {serialized_len(payload)} bytes > {PAYLOAD_LIMIT}"
        sp = payload["sudoplatform"]
    else:
        msg = job["fcm"]["message"]
        assert msg["token"] == token
        assert msg["android"]["priority"] == "high"
        ttl_s = int(msg["android"]["ttl"][:-1])
        # The TTL, up to the 28 days FCM accepts at most (its HTTP v1 AndroidConfig.ttl).
        assert ttl_s == min(ttl_ms // 1000, 2_419_200), f"fcm ttl {ttl_s}s for a TTL of {ttl_ms // 1000}s"
        data = msg["data"]
        assert all(isinstance(v, str) for v in data.values()), "every fcm data value is a string"
        assert data["jobId"] == jid
        assert serialized_len(data) <= PAYLOAD_LIMIT, \
            f"fcm.message.data is {serialized_len(data)} bytes > {PAYLOAD_LIMIT}"
        sp = json.loads(data["sudoplatform"])

    assert sp["servicename"] == "emService"
    assert set(sp) == {"servicename", "data"}
    if private_key is None:
        return {}
    data_obj, plain = sudo_client.open_data(private_key, sp["data"])
    assert set(data_obj) == {"keyId", "algorithm", "type", "sealed"}
    assert data_obj["type"] == "messageReceived"
    if key is not None:
        assert data_obj["keyId"] == key["keyId"]
        assert data_obj["algorithm"] == key["algorithm"]
    expected = sudo_client.expected_plaintext(ev)
    assert set(plain) == set(expected), f"plaintext keys {sorted(plain)} != {sorted(expected)}"
    if allow_shortened:
        for path in (("subject",), ("from", "displayName"), ("replyTo", "displayName")):
            o, g = expected, plain
            for p in path[:-1]:
                o, g = o.get(p) or {}, g.get(p) or {}
            if isinstance(o.get(path[-1]), str):
                check_shortened(o[path[-1]], g.get(path[-1]), ".".join(path))
                g[path[-1]] = o[path[-1]]  # compare the rest exactly below
    assert plain == expected, f"plaintext {plain} != expected {expected}"
    return plain


def sentinel(kafka: Kafka, key: str, timeout: float = 60) -> Record:
    """Publish an invalid event on `key` and wait for its dead letter.

    Events with the same key share a partition, and mailpush handles a partition in order, so
    once the sentinel's dead letter is visible every earlier event on that key was handled.
    """
    marker = f"sentinel-{uuid.uuid4().hex}".encode()
    rec = kafka.produce(EVENTS, key, b"not json " + marker)
    dls = kafka.consume(DEAD, timeout=timeout, idle=0.0,
                        until=lambda rs: any(r.value and marker in r.value for r in rs))
    if not any(r.value and marker in r.value for r in dls):
        raise HarnessError(f"sentinel dead letter for {rec.pos} did not appear within {timeout}s")
    return rec


def not_sentinel(records: list[Record]) -> list[Record]:
    return [r for r in records if not (r.value and r.value.startswith(b"not json sentinel-"))]
