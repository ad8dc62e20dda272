"""Schemas vs. the contract (docs/contract.md), the examples and the contract's test vectors. Needs no mailpush binary."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from cryptography.hazmat.primitives import serialization

import mailpush_harness as h
import sudo_client

SCHEMA_FILES = [
    "email-received.v1.schema.json",
    "device-registration.v1.schema.json",
    "address-key.v1.schema.json",
    "push-job.v1.schema.json",
    "dead-letter.v1.schema.json",
    "notification-data.v1.schema.json",
    "sealed-plaintext.v1.schema.json",
    "partition-state.v1.schema.json",
]

EXAMPLE_SCHEMA = {
    "device-ios.json": "device-registration.v1.schema.json",
    "device-android.json": "device-registration.v1.schema.json",
    "device-sponsor-fcm.json": "device-registration.v1.schema.json",
    "device-sponsor-webhook.json": "device-registration.v1.schema.json",
    "address-key.json": "address-key.v1.schema.json",
    "address-key-gcm.json": "address-key.v1.schema.json",
    "email-received.json": "email-received.v1.schema.json",
}


@pytest.fixture(scope="module")
def contract() -> str:
    return h.contract_path().read_text()


def validator(name):
    return h.load_schema_validator(name)


def errors(name, instance):
    return [e.message for e in validator(name).iter_errors(instance)]


def example(name):
    return json.loads((h.EXAMPLES / name).read_text())


# --------------------------------------------------------------------------- the schemas themselves

@pytest.mark.parametrize("name", SCHEMA_FILES)
def test_schema_is_valid_2020_12(name):
    doc = json.loads((h.SCHEMAS / name).read_text())
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(doc)
    assert doc["$id"].endswith("/" + name)
    assert doc.get("title") and doc.get("description")


def test_schema_ids_unique_and_no_stray_files():
    ids = [json.loads(p.read_text())["$id"] for p in h.SCHEMAS.glob("*.json")]
    assert len(ids) == len(set(ids))
    assert sorted(p.name for p in h.SCHEMAS.glob("*.json")) == sorted(SCHEMA_FILES)


# --------------------------------------------------------------------------- examples/

@pytest.mark.parametrize("name", sorted(EXAMPLE_SCHEMA))
def test_example_validates(name):
    raw = (h.EXAMPLES / name).read_bytes()
    assert b"\n" not in raw, f"{name} must be a single line (kcat sends the whole file as one message)"
    assert errors(EXAMPLE_SCHEMA[name], json.loads(raw)) == []


def test_bad_example_is_invalid_for_missing_message_id():
    raw = (h.EXAMPLES / "email-received-bad.json").read_bytes()
    assert b"\n" not in raw
    errs = errors("email-received.v1.schema.json", json.loads(raw))
    assert errs and any("messageId" in e for e in errs), errs


def test_examples_use_documented_ids():
    assert example("device-ios.json")["deviceId"] == "dev-ios-1"
    assert example("device-android.json")["deviceId"] == "dev-android-1"
    assert example("device-sponsor-fcm.json")["comMethod"]["type"] == 4
    assert example("device-sponsor-webhook.json")["comMethod"]["type"] == 3
    for name in ["device-ios.json", "device-android.json", "device-sponsor-fcm.json",
                 "device-sponsor-webhook.json", "address-key.json", "email-received.json"]:
        assert example(name)["owner"] == "user-1", name
    assert example("email-received.json")["emailAddressId"] == "em-add-1"
    assert example("address-key.json")["emailAddressId"] == "em-add-1"


def test_example_keys_match_example_private_key():
    priv = sudo_client.load_private_pem(str(h.EXAMPLES / "keys" / "example-private.pem"))
    assert priv.key_size == 2048
    cbc, gcm = example("address-key.json"), example("address-key-gcm.json")
    assert (cbc["algorithm"], cbc["keyFormat"]) == (sudo_client.CBC, "SPKI")
    assert (gcm["algorithm"], gcm["keyFormat"]) == (sudo_client.GCM, "RSA_PUBLIC_KEY")
    assert cbc["keyId"] and gcm["keyId"]
    spki = base64.b64decode(cbc["publicKey"], validate=True)
    pkcs1 = base64.b64decode(gcm["publicKey"], validate=True)
    assert spki == sudo_client.public_der(priv, "SPKI")
    assert pkcs1 == sudo_client.public_der(priv, "RSA_PUBLIC_KEY")
    # Both parse as what they claim to be.
    serialization.load_der_public_key(spki)
    # A round trip with each example key opens with the example private key.
    plain = json.dumps(sudo_client.expected_plaintext(example("email-received.json"))).encode()
    for rec in (cbc, gcm):
        sealed = sudo_client.seal(priv.public_key(), rec["algorithm"], rec["keyId"], plain)
        assert sudo_client.open_sealed(priv, rec["algorithm"], rec["keyId"], sealed) == plain


def test_examples_readme_lists_every_file():
    readme = (h.EXAMPLES / "README.md").read_text()
    for p in sorted(h.EXAMPLES.glob("*.json")) + [h.EXAMPLES / "keys" / "example-private.pem"]:
        assert p.name in readme, f"examples/README.md does not mention {p.name}"
    for name in EXAMPLE_SCHEMA:
        if name.startswith("device-") or name.startswith("address-key") or name.startswith("email-"):
            assert re.search(r"kcat .*-P .*examples/" + re.escape(name), readme), \
                f"README has no kcat -P line for {name}"


# --------------------------------------------------------------------------- docs/contract.md's own examples

def _json_blocks(contract: str) -> list[str]:
    return re.findall(r"```json\n(.*?)```", contract, re.S)


def _inline_objects(contract: str, start: str) -> list[str]:
    return [m for m in re.findall(r"`(\{[^`]*\})`", contract, re.S) if m.startswith(start)]


JID = sudo_client.job_id("em-add-1", "em-msg-1", "dev-1")
_PLACEHOLDER_VALUES = {
    "token": "fcm-token-1", "jobId": JID, "url": "https://sponsor.example/push",
    "sponseeDetails": "sponsee-1", "keyId": "key-1", "algorithm": sudo_client.CBC,
    "sealed": "QUJDRA==", "createdAtEpochMs": 1718330542000, "expiresAtEpochMs": 1720749741336,
}


def _fill(text: str, public_key_b64: str) -> dict:
    """Replace the contract's placeholders (…, <…>) with concrete values and parse."""
    text = text.replace('"<base64 DER>"', json.dumps(public_key_b64))
    text = text.replace('"<epoch s>"', '"1720749741"')
    text = text.replace('"<seconds>s"', '"2419200s"')
    text = text.replace("<messageId>", '"em-msg-1"')
    text = re.sub(r'"(\w+)":\s*"?…"?(?=\s*[,}])',
                  lambda m: f'"{m.group(1)}":{json.dumps(_PLACEHOLDER_VALUES.get(m.group(1), "x"))}',
                  text)
    return json.loads(text)


@pytest.fixture(scope="module")
def example_public_key() -> str:
    return example("address-key.json")["publicKey"]


def test_contract_has_the_examples_we_check(contract):
    blocks = _json_blocks(contract)
    assert len(blocks) >= 4, "docs/contract.md should hold the §2, §3, §5 and §7 JSON examples"


def test_contract_event_example(contract, example_public_key):
    ev = [b for b in _json_blocks(contract) if '"messageReceived"' in b and '"messageId"' in b][0]
    doc = _fill(ev, example_public_key)
    assert errors("email-received.v1.schema.json", doc) == []
    assert doc == example("email-received.json"), "examples/email-received.json is the §2 example"


def test_contract_device_example(contract, example_public_key):
    dev = [b for b in _json_blocks(contract) if '"pushToken"' in b][0]
    assert errors("device-registration.v1.schema.json", _fill(dev, example_public_key)) == []


def test_contract_com_method_examples(contract):
    for m in re.findall(r'`"comMethod":(\{[^`]*\})`', contract):
        com = json.loads(m.replace("…", "sponsee-1").replace("<token>", "tok")
                         .replace("<sponsee details>", "details"))
        reg = {"deviceId": "dev-1", "owner": "user-1", "comMethod": com}
        assert errors("device-registration.v1.schema.json", reg) == [], m


def test_contract_key_example(contract, example_public_key):
    key = [b for b in _json_blocks(contract) if '"keyFormat"' in b][0]
    assert errors("address-key.v1.schema.json", _fill(key, example_public_key)) == []


def test_contract_push_job_examples(contract, example_public_key):
    ios = [b for b in _json_blocks(contract) if '"apns"' in b][0]
    job = _fill(ios, example_public_key)
    assert errors("push-job.v1.schema.json", job) == []

    common = {k: v for k, v in job.items() if k not in ("apns", "platform")}
    fcm_text = _inline_objects(contract, '{"message"')
    assert fcm_text, "§7 android example not found"
    fcm = _fill(fcm_text[0], example_public_key)
    fcm["message"]["data"]["sudoplatform"] = json.dumps(
        {"servicename": "emService", "data": job["apns"]["payload"]["sudoplatform"]["data"]})
    assert errors("push-job.v1.schema.json", {**common, "platform": "android", "fcm": fcm}) == []

    wh_text = _inline_objects(contract, '{"url"')
    assert wh_text, "§7 webhook example not found"
    wh = _fill(wh_text[0], example_public_key)
    assert errors("push-job.v1.schema.json", {**common, "platform": "webhook", "webhook": wh}) == []


def test_contract_notification_data_example(contract, example_public_key):
    data = [m for m in _inline_objects(contract, '{"keyId"') if '"sealed"' in m]
    assert data, "§6 data example not found"
    assert errors("notification-data.v1.schema.json", _fill(data[0], example_public_key)) == []


# --------------------------------------------------------------------------- contract test vectors

def test_sealing_vectors_open_like_a_sudo_client():
    v = json.loads(h.vector_path("sealing.json").read_text())
    priv = serialization.load_pem_private_key(v["privateKeyPem"].encode(), None)
    assert errors("sealed-plaintext.v1.schema.json", v["plaintext"]) == []
    for case in v["cases"]:
        data_obj, plain = sudo_client.open_data(priv, case["data"])
        assert errors("notification-data.v1.schema.json", data_obj) == []
        assert data_obj["algorithm"] == case["algorithm"] and data_obj["keyId"] == case["keyId"]
        assert plain == v["plaintext"]
    for fmt, field in (("SPKI", "publicKeySPKI"), ("RSA_PUBLIC_KEY", "publicKeyPKCS1")):
        assert base64.b64decode(v[field]) == sudo_client.public_der(priv, fmt)
        rec = {"emailAddressId": "em-add-1", "owner": "user-1", "keyId": "key-1", "algorithm": sudo_client.CBC,
               "keyFormat": fmt, "publicKey": v[field]}
        assert errors("address-key.v1.schema.json", rec) == []
        # mailpush refuses a key without an owner (`missing field owner`): so does the schema.
        assert errors("address-key.v1.schema.json", {k: v for k, v in rec.items() if k != "owner"}) != []


def test_filter_vectors_are_valid_registrations():
    v = json.loads(h.vector_path("filters.json").read_text())
    for case in v["cases"]:
        reg = {"deviceId": "dev-1", "owner": "user-1", "platform": "ios", "pushToken": "t",
               "bundleId": "com.example.mail", "filter": case["filter"]}
        assert errors("device-registration.v1.schema.json", reg) == [], case["name"]


# --------------------------------------------------------------------------- policies of the schemas

def _job(platform: str) -> dict:
    priv = sudo_client.load_private_pem(str(h.EXAMPLES / "keys" / "example-private.pem"))
    ev = example("email-received.json")
    sealed = sudo_client.seal(priv.public_key(), sudo_client.CBC, "example-key-1",
                              json.dumps(sudo_client.expected_plaintext(ev)).encode())
    sp = {"servicename": "emService", "data": json.dumps(
        {"keyId": "example-key-1", "algorithm": sudo_client.CBC, "type": "messageReceived",
         "sealed": sealed})}
    dev = {"ios": "dev-ios-1", "android": "dev-android-1", "webhook": "dev-sponsor-webhook-1"}[platform]
    jid = sudo_client.job_id("em-add-1", "em-msg-1", dev)
    job = {"version": 1, "jobId": jid, "deviceId": dev, "owner": "user-1", "platform": platform,
           "createdAtEpochMs": 1718330542000, "expiresAtEpochMs": 1720749741336,
           "source": {"topic": "email.received", "partition": 0, "offset": 0}}
    if platform == "ios":
        job["bundleId"] = "com.example.mail"
        job["apns"] = {"headers": {"apns-push-type": "alert", "apns-priority": "10",
                                   "apns-topic": "com.example.mail", "apns-expiration": "1720749741"},
                       "deviceToken": "tok",
                       "payload": {"aps": {"alert": {"title": "New message", "body": "Open to read"},
                                           "mutable-content": 1},
                                   "sudoplatform": sp, "jobId": jid}}
    elif platform == "android":
        job["fcm"] = {"message": {"token": "tok", "android": {"priority": "high", "ttl": "2419200s"},
                                  "data": {"sudoplatform": json.dumps(sp), "jobId": jid}}}
    else:
        job["webhook"] = {"url": "https://sponsor.example/push",
                          "body": {"msgId": "em-msg-1", "sponseeDetails": "s",
                                   "metaData": {"msgType": "messageReceived"}}}
    return job


@pytest.mark.parametrize("platform", ["ios", "android", "webhook"])
def test_push_job_samples_valid(platform):
    assert errors("push-job.v1.schema.json", _job(platform)) == []


def _mut(platform, fn):
    j = _job(platform)
    fn(j)
    return j


PUSH_JOB_NEGATIVES = {
    "extra top-level field": ("ios", lambda j: j.__setitem__("emailAddressId", "em-add-1")),
    "version 2": ("ios", lambda j: j.__setitem__("version", 2)),
    "uppercase jobId": ("ios", lambda j: j.__setitem__("jobId", j["jobId"].upper())),
    "short jobId": ("android", lambda j: j.__setitem__("jobId", j["jobId"][:31])),
    "no mutable-content": ("ios", lambda j: j["apns"]["payload"]["aps"].pop("mutable-content")),
    "mutable-content 0": ("ios", lambda j: j["apns"]["payload"]["aps"].__setitem__("mutable-content", 0)),
    "no alert": ("ios", lambda j: j["apns"]["payload"]["aps"].pop("alert")),
    "alert without body": ("ios", lambda j: j["apns"]["payload"]["aps"]["alert"].pop("body")),
    "extra aps field": ("ios", lambda j: j["apns"]["payload"]["aps"].__setitem__("sound", "default")),
    "background push type": ("ios", lambda j: j["apns"]["headers"].__setitem__("apns-push-type", "background")),
    "numeric priority": ("ios", lambda j: j["apns"]["headers"].__setitem__("apns-priority", 10)),
    "no apns-topic": ("ios", lambda j: j["apns"]["headers"].pop("apns-topic")),
    "wrong servicename": ("ios", lambda j: j["apns"]["payload"]["sudoplatform"].__setitem__("servicename", "x")),
    "ios with fcm too": ("ios", lambda j: j.__setitem__("fcm", _job("android")["fcm"])),
    "android with apns": ("android", lambda j: j.__setitem__("apns", _job("ios")["apns"])),
    "platform mismatch": ("android", lambda j: j.__setitem__("platform", "ios")),
    "fcm notification block": ("android", lambda j: j["fcm"]["message"].__setitem__(
        "notification", {"title": "x"})),
    "fcm data value not a string": ("android", lambda j: j["fcm"]["message"]["data"].__setitem__(
        "sudoplatform", {"servicename": "emService", "data": "x"})),
    "fcm extra data key": ("android", lambda j: j["fcm"]["message"]["data"].__setitem__("subject", "x")),
    "fcm ttl without s": ("android", lambda j: j["fcm"]["message"]["android"].__setitem__("ttl", "2419200")),
    "fcm normal priority": ("android", lambda j: j["fcm"]["message"]["android"].__setitem__("priority", "normal")),
    "webhook extra body field": ("webhook", lambda j: j["webhook"]["body"].__setitem__("subject", "x")),
    "webhook wrong msgType": ("webhook", lambda j: j["webhook"]["body"]["metaData"].__setitem__("msgType", "x")),
    "source extra field": ("webhook", lambda j: j["source"].__setitem__("key", "em-add-1")),
}


@pytest.mark.parametrize("case", sorted(PUSH_JOB_NEGATIVES))
def test_push_job_schema_is_exact(case):
    platform, fn = PUSH_JOB_NEGATIVES[case]
    assert errors("push-job.v1.schema.json", _mut(platform, fn)), f"{case} should be invalid"


def test_input_schemas_allow_unknown_fields_and_reject_malformed():
    ev = example("email-received.json")
    assert errors("email-received.v1.schema.json", {**ev, "futureField": {"x": 1}}) == []
    no_type = dict(ev)
    del no_type["type"]
    assert errors("email-received.v1.schema.json", no_type) == []
    assert errors("email-received.v1.schema.json", {**ev, "subject": None}) == []
    assert errors("email-received.v1.schema.json", {**ev, "type": "messageDeleted"})
    assert errors("email-received.v1.schema.json", {**ev, "receivedAtEpochMs": "yesterday"})
    assert errors("email-received.v1.schema.json", {**ev, "encryptionStatus": "MAYBE"})
    assert errors("email-received.v1.schema.json", {**ev, "from": {"displayName": "A"}})

    dev = example("device-ios.json")
    assert errors("device-registration.v1.schema.json", {**dev, "futureField": 1}) == []
    bare = {k: v for k, v in dev.items() if k not in ("platform", "pushToken")}
    assert errors("device-registration.v1.schema.json", bare)
    assert errors("device-registration.v1.schema.json", {**dev, "platform": "windows"})
    assert errors("device-registration.v1.schema.json", {k: v for k, v in dev.items() if k != "owner"})
    fcm = example("device-sponsor-fcm.json")
    assert errors("device-registration.v1.schema.json",
                  {**fcm, "comMethod": {**fcm["comMethod"], "value": "no-prefix"}})
    assert errors("device-registration.v1.schema.json",
                  {**fcm, "comMethod": {**fcm["comMethod"], "type": 2}})

    key = example("address-key.json")
    assert errors("address-key.v1.schema.json", {**key, "futureField": 1}) == []
    assert errors("address-key.v1.schema.json", {**key, "algorithm": "RSAEncryptionPKCS1"})
    assert errors("address-key.v1.schema.json", {**key, "keyFormat": "PEM"})
    assert errors("address-key.v1.schema.json", {**key, "keyId": "k" * 256}) == []
    for field in ("emailAddressId", "owner", "keyId"):
        for bad in ("", "k" * 257, "k\u0000"):
            assert errors("address-key.v1.schema.json", {**key, field: bad}), f"{field}={bad[:8]!r} should be invalid"


def test_dead_letter_schema_imposes_no_shape():
    v = validator("dead-letter.v1.schema.json")
    for inst in [None, 1, "x", [1], {"anything": True}, example("email-received-bad.json")]:
        assert list(v.iter_errors(inst)) == []
    doc = json.loads((h.SCHEMAS / "dead-letter.v1.schema.json").read_text())
    assert "mailpush-error" in doc["description"] and "mailpush-source" in doc["description"]
