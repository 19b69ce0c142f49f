"""Signed action-cache entries: only holders of the key can make entries a reader trusts.

Blobs are content-addressed, so an attacker who can write the remote cannot alter a blob an entry
names; but an entry (key -> output digests) is just a claim, and whoever can write one can make a
reader restore a firmware of their choosing. A writer holding the key adds
`"signature": {"alg": "hmac-sha256", "mac": ...}` to each entry it uploads: HMAC-SHA256 over the
canonical JSON of the entry without that field. A reader configured with the key refuses remote
entries that are unsigned or whose MAC does not match.

HMAC is symmetric: whoever can verify can also sign. The key therefore belongs only on machines
that are as trusted as CI (see the README's CI section).
"""

from __future__ import annotations

import hashlib
import hmac
import json

SIGNATURE_FIELD = "signature"
ALG = "hmac-sha256"
# Binds the MAC to this use, so that the key cannot be replayed for another protocol's messages.
_DOMAIN = b"tinytrain action entry v1\0"


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode("ascii")


def _mac(key: bytes, doc: dict) -> str:
    return hmac.new(key, _DOMAIN + _canonical(doc), hashlib.sha256).hexdigest()


def sign(raw_entry: bytes, key: bytes) -> bytes:
    """The entry's JSON with a signature field (any older one replaced)."""
    doc = json.loads(raw_entry)
    doc.pop(SIGNATURE_FIELD, None)
    doc[SIGNATURE_FIELD] = {"alg": ALG, "mac": _mac(key, doc)}
    return json.dumps(doc, sort_keys=True).encode("utf-8")


def problem(raw_entry: bytes, key: bytes) -> str | None:
    """None when `raw_entry` carries a valid signature under `key`, else why not.

    What is verified is the parsed document, which is also what the reader then uses."""
    try:
        doc = json.loads(raw_entry)
    except (ValueError, UnicodeDecodeError):
        return "entry is not JSON"
    if not isinstance(doc, dict):
        return "entry is not a JSON object"
    sig = doc.pop(SIGNATURE_FIELD, None)
    if sig is None:
        return "entry is not signed"
    if not isinstance(sig, dict) or sig.get("alg") != ALG or not isinstance(sig.get("mac"), str):
        return "entry has a signature of an unknown kind"
    if not hmac.compare_digest(_mac(key, doc), sig["mac"]):
        return "entry's signature does not match (another key, or the entry was altered)"
    return None
