"""What a Sudo client does with a mailpush push job, written independently of mailpush.

- ``job_id``: recompute a job id (docs/contract.md §7).
- ``open_data`` / ``open_sealed``: decrypt ``sudoplatform.data`` exactly like a client
  (docs/contract.md §6): RSA-OAEP-SHA1 + AES-256-CBC with a zero IV, or RSA-OAEP-SHA256 +
  AES-256-GCM with AAD = keyId.
- ``seal``: the reverse, used only to check this module against itself and the vectors.
- ``key_record``: an AddressKey v1 value for a ``cryptography`` RSA key.

Run as a script to open a job read from stdin (one job JSON, or a kcat -J envelope):

    python3 tests/integration/sudo_client.py --private-key examples/keys/example-private.pem < job.json
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys

from cryptography.hazmat.primitives import hashes, padding as sympadding, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

CBC = "RSAEncryptionOAEPAESCBC"
GCM = "RSAEncryptionOAEP256AESGCM"

# §6: the plaintext carries exactly these keys (replyTo only when the event had it).
PLAINTEXT_KEYS = [
    "type", "owner", "emailAddressId", "sudoId", "messageId", "folderId",
    "encryptionStatus", "subject", "from", "replyTo", "hasAttachments",
    "sentAtEpochMs", "receivedAtEpochMs",
]


def job_id(email_address_id: str, message_id: str, device_id: str) -> str:
    raw = b"\x00".join(s.encode("utf-8") for s in (email_address_id, message_id, device_id))
    return hashlib.sha256(raw).hexdigest()[:32]


def expected_plaintext(event: dict) -> dict:
    """The §6 plaintext for an (unshortened) EmailReceived event."""
    out = {
        "type": "messageReceived",
        "owner": event["owner"],
        "emailAddressId": event["emailAddressId"],
        "sudoId": event["sudoId"],
        "messageId": event["messageId"],
        "folderId": event["folderId"],
        "encryptionStatus": event["encryptionStatus"],
        "subject": event.get("subject"),
        "from": {k: v for k, v in event["from"].items() if k in ("emailAddress", "displayName")},
    }
    if "replyTo" in event:
        out["replyTo"] = {k: v for k, v in event["replyTo"].items() if k in ("emailAddress", "displayName")}
    out["hasAttachments"] = event["hasAttachments"]
    out["sentAtEpochMs"] = event["sentAtEpochMs"]
    out["receivedAtEpochMs"] = event["receivedAtEpochMs"]
    return out


def _oaep(algorithm: str) -> padding.OAEP:
    if algorithm == CBC:
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    if algorithm == GCM:
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    raise ValueError(f"unknown algorithm {algorithm!r}")


def open_sealed(private_key: rsa.RSAPrivateKey, algorithm: str, key_id: str, sealed_b64: str) -> bytes:
    """Decrypt a `sealed` value; returns the plaintext bytes."""
    blob = base64.b64decode(sealed_b64, validate=True)
    n = (private_key.key_size + 7) // 8
    wrapped, rest = blob[:n], blob[n:]
    aes_key = private_key.decrypt(wrapped, _oaep(algorithm))
    if len(aes_key) != 32:
        raise ValueError(f"unwrapped AES key has {len(aes_key)} bytes, expected 32")
    if algorithm == CBC:
        dec = Cipher(algorithms.AES(aes_key), modes.CBC(b"\x00" * 16)).decryptor()
        padded = dec.update(rest) + dec.finalize()
        unpad = sympadding.PKCS7(128).unpadder()
        return unpad.update(padded) + unpad.finalize()
    nonce, ct = rest[:12], rest[12:]
    return AESGCM(aes_key).decrypt(nonce, ct, key_id.encode("utf-8"))


def open_data(private_key: rsa.RSAPrivateKey, data: str) -> tuple[dict, dict]:
    """Open a `sudoplatform.data` string. Returns (data object, plaintext object)."""
    obj = json.loads(data)
    plain = open_sealed(private_key, obj["algorithm"], obj["keyId"], obj["sealed"])
    return obj, json.loads(plain.decode("utf-8"))


def seal(public_key: rsa.RSAPublicKey, algorithm: str, key_id: str, plaintext: bytes) -> str:
    aes_key = os.urandom(32)
    wrapped = public_key.encrypt(aes_key, _oaep(algorithm))
    if algorithm == CBC:
        padder = sympadding.PKCS7(128).padder()
        padded = padder.update(plaintext) + padder.finalize()
        enc = Cipher(algorithms.AES(aes_key), modes.CBC(b"\x00" * 16)).encryptor()
        body = enc.update(padded) + enc.finalize()
    else:
        nonce = os.urandom(12)
        body = nonce + AESGCM(aes_key).encrypt(nonce, plaintext, key_id.encode("utf-8"))
    return base64.b64encode(wrapped + body).decode("ascii")


def sudoplatform_of(job: dict) -> dict:
    """The sudoplatform object of an ios or android job."""
    if "apns" in job:
        return job["apns"]["payload"]["sudoplatform"]
    if "fcm" in job:
        return json.loads(job["fcm"]["message"]["data"]["sudoplatform"])
    raise ValueError("job has no sealed payload (webhook job?)")


def generate_key(bits: int = 2048) -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def public_der(private_key: rsa.RSAPrivateKey, key_format: str) -> bytes:
    pub = private_key.public_key()
    if key_format == "SPKI":
        return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key_format == "RSA_PUBLIC_KEY":
        return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    raise ValueError(key_format)


def key_record(private_key, email_address_id: str, key_id: str, algorithm: str = CBC,
               key_format: str = "SPKI", owner: str | None = "user-1") -> dict:
    rec = {"emailAddressId": email_address_id}
    if owner is not None:
        rec["owner"] = owner
    rec.update({
        "keyId": key_id,
        "algorithm": algorithm,
        "keyFormat": key_format,
        "publicKey": base64.b64encode(public_der(private_key, key_format)).decode("ascii"),
    })
    return rec


def load_private_pem(path: str) -> rsa.RSAPrivateKey:
    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def private_pem(private_key) -> bytes:
    return private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Open a mailpush push job like a Sudo client would.")
    ap.add_argument("--private-key", required=True, help="PEM private key matching the address key")
    args = ap.parse_args(argv)
    key = load_private_pem(args.private_key)
    rc = 0
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        job = json.loads(line)
        if "payload" in job and isinstance(job.get("payload"), str):  # kcat -J envelope
            job = json.loads(job["payload"])
        if "apns" not in job and "fcm" not in job:
            print(f"job {job.get('jobId')} ({job.get('platform')}) carries no sealed payload",
                  file=sys.stderr)
            continue
        try:
            _, plain = open_data(key, sudoplatform_of(job)["data"])
            print(json.dumps(plain, ensure_ascii=False))
        except Exception as e:  # noqa: BLE001 - report and go on with the next job
            print(f"cannot open job {job.get('jobId')}: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
