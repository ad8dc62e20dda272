#!/usr/bin/env python3
"""A TEST DOUBLE of the mailpush CLI, for checking the black-box harness itself.

NOT the product, not a reference implementation to copy: it exists so the tests under
tests/integration and tests/chaos can be exercised before the Swift binary exists, and so a
failing test can be told apart from a broken harness:

    MAILPUSH_BIN=tests/integration/fake/mailpush_fake.py python3 -m pytest tests/integration

It follows CONTRACT.md as the test authors read it, with simple (slow) mechanisms: a
librdkafka mock cluster loaded through ctypes for `devbroker`, Kafka transactions plus a scan
of the output topics at start-up for exactly-once, SQLite for config, offsets and dedupe.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import glob
import json
import os
import signal
import sqlite3
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka  # noqa: E402
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402

import sudo_client  # noqa: E402

EX_USAGE, EX_UNAVAILABLE, EX_SOFTWARE = 64, 69, 70
DEFAULT_TOPICS = ["email.received", "mailpush.devices", "mailpush.address-keys",
                  "mailpush.push-jobs", "mailpush.dead-letters"]
LIMIT = 4096
ELLIPSIS = "\u2026"
# Opt-in bugs, to check that the tests notice them (harness self-test only).
BUG = set(filter(None, os.environ.get("FAKE_BUG", "").split(",")))


def say(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------------------- mock broker

def start_mock(partitions: int) -> str:
    libdir = os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs")
    lib = ctypes.CDLL(glob.glob(libdir + "/librdkafka*.so*")[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    conf = lib.rd_kafka_conf_new()
    err = ctypes.create_string_buffer(512)
    lib.rd_kafka_conf_set(conf, b"log_level", b"0", err, 512)
    rk = lib.rd_kafka_new(1, conf, err, 512)
    mc = lib.rd_kafka_mock_cluster_new(rk, 1)
    for t in DEFAULT_TOPICS:
        lib.rd_kafka_mock_topic_create(mc, t.encode(), partitions, 1)
    start_mock.keep = (lib, rk, mc)  # keep alive
    return lib.rd_kafka_mock_cluster_bootstraps(mc).decode()


# ----------------------------------------------------------------------------- CLI

class Usage(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


RUN_FLAGS = {  # flag: (type, default)
    "brokers": (str, None), "state-dir": (str, "./.mailpush"), "http-port": (int, 8080),
    "instance": (int, 0), "instances": (int, 1), "sponsor-webhook-url": (str, None),
    "alert-title": (str, "New message"), "alert-body": (str, "You have a new message"),
    "ttl-seconds": (int, 2419200), "events-topic": (str, "email.received"),
    "devices-topic": (str, "mailpush.devices"), "keys-topic": (str, "mailpush.address-keys"),
    "jobs-topic": (str, "mailpush.push-jobs"), "dead-letter-topic": (str, "mailpush.dead-letters"),
    "startup-timeout-seconds": (int, 30),
}


def parse(argv):
    ap = Parser(prog="mailpush")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    for flag in RUN_FLAGS:
        run.add_argument("--" + flag, default=None)
    run.add_argument("-X", action="append", default=[])
    db = sub.add_parser("devbroker")
    db.add_argument("--partitions", default="4")
    db.add_argument("--bootstrap-file")
    us = sub.add_parser("unseal")
    us.add_argument("--private-key", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        for flag, (typ, default) in RUN_FLAGS.items():
            attr = flag.replace("-", "_")
            raw = getattr(args, attr)
            src = f"--{flag}"
            if raw is None:
                env = "MAILPUSH_" + flag.upper().replace("-", "_")
                raw, src = os.environ.get(env), env
            if raw is None:
                setattr(args, attr, default)
                continue
            try:
                val = typ(raw)
            except ValueError:
                raise Usage(f"{src}: invalid value {raw!r} (expected {typ.__name__})")
            setattr(args, attr, val)
        if args.ttl_seconds <= 0:
            raise Usage("--ttl-seconds must be positive")
        if args.instances < 1:
            raise Usage("--instances must be at least 1")
        if not 0 <= args.instance < args.instances:
            raise Usage(f"--instance {args.instance} must be in 0..<{args.instances} (--instances)")
        if not 0 <= args.http_port <= 65535:
            raise Usage(f"--http-port {args.http_port} out of range")
        props = {}
        for x in args.X:
            if "=" not in x:
                raise Usage(f"-X {x}: expected key=value")
            k, v = x.split("=", 1)
            props[k] = v
        try:
            Producer({"bootstrap.servers": "127.0.0.1:1", **props})
        except (KafkaException, ValueError, TypeError) as e:
            raise Usage(f"-X: bad librdkafka property: {e}")
        args.props = props
    else:
        args.partitions = int(args.partitions) if args.cmd == "devbroker" else None
    return args


# ----------------------------------------------------------------------------- JSON logic

class Unsupported(Exception):
    pass


def truthy(v):
    return not (v is None or v is False or v == 0 and not isinstance(v, bool) and isinstance(v, (int, float))
                or v == "" or v == [])


def loose_eq(a, b):
    if type(a) == type(b) or (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return a == b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def jl(rule, data):
    if isinstance(rule, list):
        return [jl(r, data) for r in rule]
    if not isinstance(rule, dict):
        return rule
    if len(rule) != 1:
        raise Unsupported("object with more than one key")
    op, args = next(iter(rule.items()))
    if not isinstance(args, list):
        args = [args]
    if op == "var":
        path = jl(args[0], data) if args else ""
        default = jl(args[1], data) if len(args) > 1 else None
        cur = data
        if path in ("", None):
            return cur
        for part in str(path).split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                return default
        return cur
    if op == "and":
        v = True
        for a in args:
            v = jl(a, data)
            if not truthy(v):
                return v
        return v
    if op == "or":
        v = False
        for a in args:
            v = jl(a, data)
            if truthy(v):
                return v
        return v
    vals = [jl(a, data) for a in args]
    if op == "==":
        return loose_eq(vals[0], vals[1])
    if op == "!=":
        return not loose_eq(vals[0], vals[1])
    if op == "===":
        return type(vals[0]) == type(vals[1]) and vals[0] == vals[1]
    if op == "!==":
        return not (type(vals[0]) == type(vals[1]) and vals[0] == vals[1])
    if op == "!":
        return not truthy(vals[0])
    if op == "!!":
        return truthy(vals[0])
    if op == "in":
        a, b = vals[0], vals[1]
        if isinstance(b, list):
            return a in b
        if isinstance(b, str) and isinstance(a, str):
            return a in b
        return False
    raise Unsupported(op)


def has_var(rule):
    if isinstance(rule, dict):
        return "var" in rule or any(has_var(v) for v in rule.values())
    if isinstance(rule, list):
        return any(has_var(v) for v in rule)
    return False


def wants(filter_items, meta) -> bool:
    items = [i for i in (filter_items or []) if isinstance(i, dict) and i.get("serviceName") == "emService"]
    if not items:
        return False
    ctx = {"meta": meta}
    regular, catch_all = [], []
    for it in items:
        try:
            rule = json.loads(it.get("rule", ""))
        except (ValueError, TypeError):
            regular.append((it, None))
            continue
        is_ca = False
        if it.get("actionType") == "ENABLE" and not has_var(rule):
            try:
                is_ca = truthy(jl(rule, {}))
            except Unsupported:
                is_ca = False
        (catch_all if is_ca else regular).append((it, rule))
    ordered = [(it, r) for it, r in regular + catch_all]
    if "catch-all-in-order" in BUG:
        ordered = [(it, r) for it in items for (i2, r) in regular + catch_all if i2 is it]
    for it, rule in ordered:
        if rule is None:
            continue
        try:
            if truthy(jl(rule, ctx)):
                return it.get("actionType") == "ENABLE"
        except (Unsupported, TypeError, IndexError, AttributeError):
            continue
    return False


# ----------------------------------------------------------------------------- validation

class Bad(Exception):
    pass


def parse_event(raw: bytes) -> dict:
    if raw is None:
        raise Bad("empty value (tombstone) on the events topic")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Bad(f"invalid JSON: not UTF-8 at byte {e.start}")
    try:
        ev = json.loads(text)
    except json.JSONDecodeError as e:
        raise Bad(f"invalid JSON at byte {e.pos}")
    if not isinstance(ev, dict):
        raise Bad("invalid event: not a JSON object")
    t = ev.get("type", "messageReceived")
    if t != "messageReceived":
        raise Bad(f"unsupported type {t!r}")
    for f in ("owner", "emailAddressId", "sudoId", "messageId", "folderId"):
        if f not in ev:
            raise Bad(f"missing field {f}")
        if not isinstance(ev[f], str):
            raise Bad(f"field {f} must be a string")
    if ev.get("encryptionStatus") not in ("ENCRYPTED", "UNENCRYPTED"):
        raise Bad("missing field encryptionStatus" if "encryptionStatus" not in ev
                  else "field encryptionStatus must be ENCRYPTED or UNENCRYPTED")
    fr = ev.get("from")
    if not isinstance(fr, dict):
        raise Bad("missing field from" if fr is None else "field from must be an object")
    if not isinstance(fr.get("emailAddress"), str):
        raise Bad("missing field from.emailAddress")
    if "displayName" in fr and not isinstance(fr["displayName"], str):
        raise Bad("field from.displayName must be a string")
    if "replyTo" in ev:
        rt = ev["replyTo"]
        if not isinstance(rt, dict) or not isinstance(rt.get("emailAddress"), str):
            raise Bad("field replyTo must be an object with emailAddress")
    if not isinstance(ev.get("hasAttachments"), bool):
        raise Bad("missing field hasAttachments" if "hasAttachments" not in ev
                  else "field hasAttachments must be a boolean")
    for f in ("sentAtEpochMs", "receivedAtEpochMs"):
        if f not in ev:
            raise Bad(f"missing field {f}")
        if not isinstance(ev[f], int) or isinstance(ev[f], bool):
            raise Bad(f"field {f} must be an integer")
    if "subject" in ev and ev["subject"] is not None and not isinstance(ev["subject"], str):
        raise Bad("field subject must be a string or null")
    return ev


def parse_device(raw):
    try:
        d = json.loads(raw)
    except (ValueError, TypeError, UnicodeDecodeError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("deviceId"), str) or not isinstance(d.get("owner"), str):
        return None
    if d.get("platform") in ("ios", "android") and isinstance(d.get("pushToken"), str) and d["pushToken"]:
        return d
    cm = d.get("comMethod")
    if isinstance(cm, dict) and cm.get("type") in (3, 4) and isinstance(cm.get("value"), str):
        if cm["type"] == 4 and not (cm["value"].startswith("FCM:") and len(cm["value"]) > 4):
            return None
        return d
    return None


def parse_key(raw):
    """-> (record, None) if usable, else (None, reason)."""
    try:
        k = json.loads(raw)
    except (ValueError, TypeError, UnicodeDecodeError):
        return None, "key record is not valid JSON"
    if not isinstance(k, dict):
        return None, "key record is not an object"
    if k.get("algorithm") not in (sudo_client.CBC, sudo_client.GCM):
        return None, f"unsupported key algorithm {k.get('algorithm')!r}"
    try:
        der = base64.b64decode(k.get("publicKey", ""), validate=True)
        fmt = {"SPKI": serialization.PublicFormat.SubjectPublicKeyInfo,
               "RSA_PUBLIC_KEY": serialization.PublicFormat.PKCS1}.get(k.get("keyFormat"))
        if fmt is None:
            return None, f"unsupported keyFormat {k.get('keyFormat')!r}"
        pub = serialization.load_der_public_key(der)
        if pub.public_bytes(serialization.Encoding.DER, fmt) != der:
            raise ValueError(f"not a {k.get('keyFormat')} key")
    except Exception as e:  # noqa: BLE001
        return None, f"unparsable public key ({type(e).__name__})"
    if getattr(pub, "key_size", 0) < 2048:
        return None, "RSA key shorter than 2048 bits"
    k["_pub"] = pub
    return k, None


# ----------------------------------------------------------------------------- the service

class Service:
    def __init__(self, a):
        self.a = a
        self.stop = False
        self.ready = False
        self.metrics = {"mailpush_events_received_total": 0, "mailpush_jobs_produced_total": 0,
                        "mailpush_dead_letters_total": 0, "mailpush_config_skipped_total": 0,
                        "mailpush_webhook_devices_without_endpoint_total": 0}
        self.devices: dict[str, dict] = {}
        self.keys: dict[str, tuple] = {}  # address -> (record|None, reason|None)

    # -- state
    def open_db(self):
        Path(self.a.state_dir).mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(os.path.join(self.a.state_dir, "fake-state.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS devices(id TEXT PRIMARY KEY, json TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS keys(address TEXT PRIMARY KEY, json TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS offsets(topic TEXT, part INTEGER, next INTEGER, PRIMARY KEY(topic, part));
            CREATE TABLE IF NOT EXISTS processed(address TEXT, message TEXT, PRIMARY KEY(address, message));
        """)
        for did, j in self.db.execute("SELECT id, json FROM devices"):
            self.devices[did] = json.loads(j)
        for addr, j in self.db.execute("SELECT address, json FROM keys"):
            self.keys[addr] = parse_key(j.encode())

    def offset(self, topic, part):
        row = self.db.execute("SELECT next FROM offsets WHERE topic=? AND part=?", (topic, part)).fetchone()
        return row[0] if row else confluent_kafka.OFFSET_BEGINNING

    def set_offset(self, topic, part, nxt):
        self.db.execute("INSERT OR REPLACE INTO offsets VALUES(?,?,?)", (topic, part, nxt))

    # -- HTTP
    def serve_http(self):
        svc = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/healthz":
                    code, body = 200, "ok\n"
                elif self.path == "/readyz":
                    code, body = (200, "ready\n") if svc.ready else (503, "starting\n")
                elif self.path == "/metrics":
                    code = 200
                    body = "".join(f"# TYPE {k} counter\n{k} {v}\n" for k, v in svc.metrics.items())
                else:
                    code, body = 404, "not found\n"
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", self.a.http_port), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    # -- main
    def run(self) -> int:
        a = self.a
        if not a.brokers:
            a.brokers = start_mock(4)
            Path(a.state_dir).mkdir(parents=True, exist_ok=True)
            Path(a.state_dir, "devbroker.bootstrap").write_text(a.brokers + "\n")
            say(f"embedded development broker: bootstrap={a.brokers}")
        base = {"bootstrap.servers": a.brokers, **a.props}
        fast = {"fetch.wait.max.ms": 20, "fetch.error.backoff.ms": 20, "fetch.queue.backoff.ms": 5,
                "topic.metadata.refresh.interval.ms": 1000}
        try:
            Consumer({**base, "group.id": "probe"}).list_topics(timeout=a.startup_timeout_seconds)
        except KafkaException as e:
            print(f"brokers {a.brokers} unreachable after {a.startup_timeout_seconds}s: {e}", file=sys.stderr)
            return EX_UNAVAILABLE
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "stop", True))
        self.serve_http()
        self.open_db()
        tid = f"mailpush-fake-{a.instance}-{zlib.crc32(os.path.abspath(a.state_dir).encode())}"
        self.producer = Producer({**base, "transactional.id": tid, "linger.ms": 5})
        self.producer.init_transactions(30)
        self.emitted_jobs, self.emitted_dl = self.scan_outputs(base)
        if "no-scan" in BUG:
            self.emitted_jobs, self.emitted_dl = set(), set()
        self.cfg = Consumer({**base, **fast, "group.id": f"fake-cfg-{uuid.uuid4()}", "enable.auto.commit": False})
        self.evc = Consumer({**base, **fast, "group.id": f"fake-ev-{uuid.uuid4()}", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        self.cfg_parts = []
        for t in (a.devices_topic, a.keys_topic):
            for p in self.partitions(t):
                self.cfg_parts.append(TopicPartition(t, p, self.offset(t, p)))
        self.cfg.assign(self.cfg_parts)
        owned = [p for p in self.partitions(a.events_topic) if p % a.instances == a.instance]
        self.evc.assign([TopicPartition(a.events_topic, p, self.offset(a.events_topic, p)) for p in owned])
        say(f"mailpush (fake) instance {a.instance}/{a.instances} owns {a.events_topic} partitions {owned}")
        self.ready = True
        while not self.stop:
            msgs = [m for m in self.evc.consume(200, 0.1) if not m.error()]
            t0 = time.time()
            self.catch_up_config()
            if msgs and os.environ.get("FAKE_DEBUG"):
                say(f"{time.time():.2f} polled {len(msgs)}; config catch-up {time.time() - t0:.2f}s")
            if msgs:
                self.process(msgs)
        self.producer.flush(10)
        say("shut down cleanly")
        return 0

    def partitions(self, topic, tries=100):
        for _ in range(tries):
            md = self.cfg.list_topics(topic, timeout=5) if hasattr(self, "cfg") else \
                Consumer({"bootstrap.servers": self.a.brokers, "group.id": "p"}).list_topics(topic, timeout=5)
            t = md.topics.get(topic)
            if t and t.partitions and t.error is None:
                return sorted(t.partitions)
            time.sleep(0.1)
        raise RuntimeError(f"topic {topic} not found")

    def scan_outputs(self, base):
        jobs, dls = set(), set()
        c = Consumer({**base, "group.id": f"fake-scan-{uuid.uuid4()}", "enable.auto.commit": False,
                      "isolation.level": "read_committed", "enable.partition.eof": True})
        self.cfg = c
        for topic, sink, hdr in ((self.a.jobs_topic, jobs, "mailpush-job-id"),
                                 (self.a.dead_letter_topic, dls, "mailpush-source")):
            try:
                parts = self.partitions(topic, tries=5)
            except RuntimeError:
                continue
            c.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])
            eof = set()
            deadline = time.time() + 30
            while len(eof) < len(parts) and time.time() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                for k, v in m.headers() or []:
                    if k == hdr:
                        sink.add(v.decode())
        c.close()
        del self.cfg
        return jobs, dls

    def catch_up_config(self):
        todo = {}
        for tp in self.cfg_parts:
            lo, hi = self.cfg.get_watermark_offsets(tp, timeout=5, cached=False)
            todo[(tp.topic, tp.partition)] = hi
        def behind():
            return [k for k, hi in todo.items() if max(self.offset(*k), 0) < hi]
        while behind() and not self.stop:
            for m in self.cfg.consume(500, 0.1):
                if m.error():
                    continue
                self.db.execute("BEGIN")
                self.apply_config(m)
                self.set_offset(m.topic(), m.partition(), m.offset() + 1)
                self.db.execute("COMMIT")

    def apply_config(self, m):
        key = m.key().decode() if m.key() else None
        if m.topic() == self.a.devices_topic:
            if m.value() is None and "no-tombstone" in BUG:
                return
            if m.value() is None:
                self.devices.pop(key, None)
                self.db.execute("DELETE FROM devices WHERE id=?", (key,))
                return
            d = parse_device(m.value())
            if d is None:
                self.metrics["mailpush_config_skipped_total"] += 1
                say(f"skipped bad registration at {m.topic()}/{m.partition()}/{m.offset()}")
                return
            self.devices[d["deviceId"]] = d
            self.db.execute("INSERT OR REPLACE INTO devices VALUES(?,?)", (d["deviceId"], json.dumps(d)))
        else:
            if m.value() is None:
                self.keys.pop(key, None)
                self.db.execute("DELETE FROM keys WHERE address=?", (key,))
                return
            rec, reason = parse_key(m.value())
            addr = rec["emailAddressId"] if rec else key
            self.keys[addr] = (rec, reason)
            self.db.execute("INSERT OR REPLACE INTO keys VALUES(?,?)", (addr, m.value().decode("utf-8", "replace")))
            if reason:
                say(f"rejected key for {addr}: {reason}")

    # -- events
    def process(self, msgs):
        a = self.a
        out = []  # (topic, key, value, headers)
        done_ids = []
        seen = set()
        for m in msgs:
            self.metrics["mailpush_events_received_total"] += 1
            src = f"{m.topic()}/{m.partition()}/{m.offset()}"
            try:
                ev = parse_event(m.value())
                ident = (ev["emailAddressId"], ev["messageId"])
                if "no-dedupe" in BUG:
                    pass
                elif ident in seen or self.db.execute("SELECT 1 FROM processed WHERE address=? AND message=?",
                                                    ident).fetchone():
                    continue
                jobs = self.jobs_for(ev, m)
                seen.add(ident)
                done_ids.append(ident)
                for job in jobs:
                    if job["jobId"] in self.emitted_jobs:
                        continue
                    self.emitted_jobs.add(job["jobId"])
                    out.append((a.jobs_topic, job["deviceId"], json.dumps(job, separators=(",", ":"), ensure_ascii=False),
                                [("mailpush-source", src), ("mailpush-job-id", job["jobId"])]))
                    if "dup-jobs" in BUG:
                        out.append(out[-1])
            except Bad as e:
                if src in self.emitted_dl:
                    continue
                self.emitted_dl.add(src)
                dl_value = m.value()
                if "dl-reencode" in BUG and dl_value:
                    dl_value = dl_value.strip() + b" "
                out.append((a.dead_letter_topic, m.key(), dl_value,
                            [("mailpush-source", src), ("mailpush-error", str(e).replace("\n", " "))]))
        t0 = time.time()
        self.producer.begin_transaction()
        for topic, key, value, headers in out:
            self.producer.produce(topic, key=key, value=value, headers=headers)
        self.producer.commit_transaction(30)
        if "slow-commit" in BUG:
            time.sleep(0.3)  # widen the window between the Kafka commit and the SQLite commit
        if os.environ.get("FAKE_DEBUG"):
            say(f"batch of {len(msgs)} -> {len(out)} records committed in {time.time() - t0:.2f}s")
        for topic, *_ in out:
            k = "mailpush_jobs_produced_total" if topic == a.jobs_topic else "mailpush_dead_letters_total"
            self.metrics[k] += 1
        self.db.execute("BEGIN")
        for ident in done_ids:
            self.db.execute("INSERT OR IGNORE INTO processed VALUES(?,?)", ident)
        last = {}
        for m in msgs:
            last[m.partition()] = m.offset() + 1
        for p, nxt in last.items():
            self.set_offset(a.events_topic, p, nxt)
        self.db.execute("COMMIT")

    def jobs_for(self, ev, m):
        a = self.a
        addr = ev["emailAddressId"]
        key, reason = self.keys.get(addr, (None, None))
        meta = {"type": "messageReceived", "emailAddressId": addr, "sudoId": ev["sudoId"],
                "folderId": ev["folderId"], "keyId": key["keyId"] if key else None}
        wanting = [d for d in sorted(self.devices.values(), key=lambda d: d["deviceId"])
                   if d["owner"] == ev["owner"] and wants(d.get("filter"), meta)]
        if not wanting:
            return []
        if key is None:
            raise Bad(f"no public key for address {addr}" + (f" (key rejected: {reason})" if reason else ""))
        now = int(time.time() * 1000)
        expires = ev["receivedAtEpochMs"] + a.ttl_seconds * 1000 + (1 if "ttl-off" in BUG else 0)
        jobs = []
        for d in wanting:
            jid = sudo_client.job_id(addr, ev["messageId"], d["deviceId"])
            cm = d.get("comMethod") if not d.get("platform") else None
            job = {"version": 1, "jobId": jid, "deviceId": d["deviceId"], "owner": d["owner"]}
            if cm and cm["type"] == 3:
                if not a.sponsor_webhook_url:
                    self.metrics["mailpush_webhook_devices_without_endpoint_total"] += 1
                    say(f"device {d['deviceId']}: com method 3 but no --sponsor-webhook-url")
                    continue
                job["platform"] = "webhook"
            elif cm:
                job["platform"] = "android"
            else:
                job["platform"] = d["platform"]
            if "bundleId" in d:
                job["bundleId"] = d["bundleId"]
            job.update({"createdAtEpochMs": now, "expiresAtEpochMs": expires,
                        "source": {"topic": m.topic(), "partition": m.partition(), "offset": m.offset()}})
            if job["platform"] == "webhook":
                job["webhook"] = {"url": a.sponsor_webhook_url, "body": {
                    "msgId": ev["messageId"], "sponseeDetails": cm["value"],
                    "metaData": {"msgType": "messageReceived"}}}
            elif job["platform"] == "ios":
                job["apns"] = self.fit(ev, key, lambda sp: {
                    "headers": {"apns-push-type": "alert", "apns-priority": "10",
                                "apns-topic": d.get("bundleId", ""), "apns-expiration": str(expires // 1000)},
                    "deviceToken": d["pushToken"],
                    "payload": {"aps": {"alert": {"title": a.alert_title,
                                                  "body": (ev.get("subject") or a.alert_body) if "leak-subject" in BUG else a.alert_body},
                                        "mutable-content": 1}, "sudoplatform": sp, "jobId": jid}},
                    lambda o: o["payload"])
            else:
                token = cm["value"][4:] if cm else d["pushToken"]
                ttl = max(0, min(a.ttl_seconds, (expires - now) // 1000))
                job["fcm"] = self.fit(ev, key, lambda sp: {"message": {
                    "token": token, "android": {"priority": "high", "ttl": f"{ttl}s"},
                    "data": {"sudoplatform": json.dumps(sp, separators=(",", ":"), ensure_ascii=False),
                             "jobId": jid}}}, lambda o: o["message"]["data"])
            jobs.append(job)
        return jobs

    def fit(self, ev, key, build, measured):
        plain = sudo_client.expected_plaintext(ev)

        def attempt(p):
            sealed = sudo_client.seal(key["_pub"], key["algorithm"], key["keyId"],
                                      json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode())
            data = json.dumps({"keyId": key["keyId"], "algorithm": key["algorithm"],
                               "type": "messageReceived", "sealed": sealed}, separators=(",", ":"))
            obj = build({"servicename": "emService", "data": data})
            size = len(json.dumps(measured(obj), separators=(",", ":"), ensure_ascii=False).encode())
            return obj if size <= LIMIT else None

        obj = attempt(plain)
        if obj:
            return obj
        for path in (("subject",), ("from", "displayName"), ("replyTo", "displayName")):
            holder = plain
            for p in path[:-1]:
                holder = holder.get(p) if isinstance(holder, dict) else None
            if not isinstance(holder, dict) or not isinstance(holder.get(path[-1]), str):
                continue
            orig = holder[path[-1]]
            lo, hi, best = 0, len(orig) - 1, None
            while lo <= hi:
                mid = (lo + hi) // 2
                holder[path[-1]] = orig[:mid] + ELLIPSIS
                o = attempt(plain)
                if o:
                    best, lo = (mid, o), mid + 1
                else:
                    hi = mid - 1
            if best:
                holder[path[-1]] = orig[:best[0]] + ELLIPSIS
                return best[1]
            holder[path[-1]] = ELLIPSIS
        raise Bad(f"sealed payload exceeds {LIMIT} bytes")


# ----------------------------------------------------------------------------- other commands

def devbroker(a) -> int:
    bs = start_mock(a.partitions)
    say(f"bootstrap={bs}")
    if a.bootstrap_file:
        Path(a.bootstrap_file).write_text(bs + "\n")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


def unseal(a) -> int:
    key = sudo_client.load_private_pem(a.private_key)
    job = json.loads(sys.stdin.read())
    _, plain = sudo_client.open_data(key, sudo_client.sudoplatform_of(job)["data"])
    print(json.dumps(plain, ensure_ascii=False, indent=2))
    return 0


def main(argv=None) -> int:
    try:
        a = parse(sys.argv[1:] if argv is None else argv)
    except Usage as e:
        print(f"mailpush: error: {e}", file=sys.stderr)
        return EX_USAGE
    if a.cmd == "devbroker":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        return devbroker(a)
    if a.cmd == "unseal":
        return unseal(a)
    try:
        return Service(a).run()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print(f"mailpush: internal error: {e}", file=sys.stderr)
        return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
