"""Envelope encryption for content that leaves the process (transcripts, later files).

Each object gets its own random 256-bit data key; the content is sealed with it (AES-256-GCM)
and the data key is wrapped (AES-256-GCM again) with a key-encryption key from settings. A
copy of the bucket alone therefore reveals nothing, and the GCM tags make any change to a
sealed object fail to open.

Key-encryption keys come from ``SWITCHYARD_RECORDS_KEYS``: ``kid:base64key`` pairs, the first
the current one, the others retired (they open, never seal). Rotation is adding a new key in
front: new objects are sealed with it and old ones still open, since every object names the
key (``kid``) that wrapped its data key. A retired key may go only once nothing sealed with it
is left: ``manage.py records_rewrap`` re-seals it all (``reseal``; records/rewrap.py).

Sealed layout: ``b"SYSEAL1\\n"``, a 4-byte big-endian header length, the header (JSON: ``kid``,
``wrapped`` key, its ``wrap_nonce``, the content ``nonce``), then the ciphertext with its tag.
The header is bound to the ciphertext as associated data: swapping headers between objects
fails too.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from dataclasses import dataclass
from functools import cache

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings

MAGIC = b"SYSEAL1\n"
_HEADER_LENGTH = struct.Struct(">I")
_MAX_HEADER = 4096


class SealError(Exception):
    """A sealed object cannot be opened: unknown key, malformed, or tampered with."""


@dataclass(frozen=True)
class Keyring:
    """Key-encryption keys by id; ``current`` seals, all of them open."""

    current: str
    keys: dict[str, bytes]

    @classmethod
    def parse(cls, spec: str, *, fallback_secret: str = "") -> Keyring:
        """``kid:base64key,…``; with none given, one derived from ``fallback_secret`` (the
        embedded demo only: production settings require the keys)."""
        pairs = [part.strip() for part in spec.split(",") if part.strip()]
        if not pairs:
            if not fallback_secret:
                raise ValueError("SWITCHYARD_RECORDS_KEYS is empty")
            derived = hashlib.sha256(b"switchyard-records-demo:" + fallback_secret.encode())
            return cls(current="demo", keys={"demo": derived.digest()})
        keys: dict[str, bytes] = {}
        for pair in pairs:
            kid, sep, encoded = pair.partition(":")
            if not sep or not kid:
                raise ValueError(f"SWITCHYARD_RECORDS_KEYS entry {kid!r} is not kid:base64key")
            try:
                key = base64.b64decode(encoded, validate=True)
            except ValueError as exc:
                raise ValueError(f"SWITCHYARD_RECORDS_KEYS entry {kid!r}: bad base64") from exc
            if len(key) != 32:
                raise ValueError(f"SWITCHYARD_RECORDS_KEYS entry {kid!r} must be 32 bytes")
            if kid in keys:
                raise ValueError(f"SWITCHYARD_RECORDS_KEYS names {kid!r} twice")
            keys[kid] = key
        return cls(current=next(iter(keys)), keys=keys)

    @property
    def retired(self) -> tuple[str, ...]:
        """Ids of the keys that still open what they sealed but no longer seal."""
        return tuple(kid for kid in self.keys if kid != self.current)


@cache
def _keyring_for(spec: str, secret: str) -> Keyring:
    return Keyring.parse(spec, fallback_secret=secret)


def keyring() -> Keyring:
    """The keyring from settings (parsed once per distinct setting)."""
    return _keyring_for(settings.RECORDS_KEYS, settings.SECRET_KEY)


def seal(plaintext: bytes, ring: Keyring | None = None) -> bytes:
    ring = ring or keyring()
    data_key = AESGCM.generate_key(bit_length=256)
    wrap_nonce, nonce = os.urandom(12), os.urandom(12)
    wrapped = AESGCM(ring.keys[ring.current]).encrypt(wrap_nonce, data_key, ring.current.encode())
    header = orjson.dumps(
        {
            "v": 1,
            "alg": "AES-256-GCM",
            "kid": ring.current,
            "wrapped": base64.b64encode(wrapped).decode(),
            "wrap_nonce": base64.b64encode(wrap_nonce).decode(),
            "nonce": base64.b64encode(nonce).decode(),
        }
    )
    prefix = MAGIC + _HEADER_LENGTH.pack(len(header)) + header
    return prefix + AESGCM(data_key).encrypt(nonce, plaintext, prefix)


def sealed_key_id(blob: bytes) -> str:
    """Which key-encryption key wrapped this object's data key."""
    return str(_header(blob)[0]["kid"])


def unseal(blob: bytes, ring: Keyring | None = None) -> bytes:
    ring = ring or keyring()
    header, prefix = _header(blob)
    kid = str(header.get("kid"))
    if kid not in ring.keys:
        raise SealError(f"sealed with key {kid!r}, which is not in SWITCHYARD_RECORDS_KEYS")
    try:
        wrapped = base64.b64decode(str(header["wrapped"]))
        wrap_nonce = base64.b64decode(str(header["wrap_nonce"]))
        nonce = base64.b64decode(str(header["nonce"]))
        data_key = AESGCM(ring.keys[kid]).decrypt(wrap_nonce, wrapped, kid.encode())
        return AESGCM(data_key).decrypt(nonce, blob[len(prefix) :], prefix)
    except (InvalidTag, KeyError, ValueError, TypeError) as exc:
        raise SealError("the object does not open: it was altered or is not ours") from exc


def reseal(blob: bytes, ring: Keyring | None = None) -> bytes | None:
    """The same plaintext sealed under the current key, or None when it already is. The
    header is the ciphertext's associated data, so the content is sealed afresh (a new data
    key and nonces), not just its key re-wrapped."""
    ring = ring or keyring()
    if sealed_key_id(blob) == ring.current:
        return None
    return seal(unseal(blob, ring), ring)


def _header(blob: bytes) -> tuple[dict[str, object], bytes]:
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _HEADER_LENGTH.size:
        raise SealError("not a sealed object")
    (length,) = _HEADER_LENGTH.unpack_from(blob, len(MAGIC))
    if length > _MAX_HEADER:
        raise SealError("a sealed object's header is too long")
    end = len(MAGIC) + _HEADER_LENGTH.size + length
    try:
        header = orjson.loads(blob[len(MAGIC) + _HEADER_LENGTH.size : end])
    except orjson.JSONDecodeError as exc:
        raise SealError("a sealed object's header is malformed") from exc
    if not isinstance(header, dict):
        raise SealError("a sealed object's header is malformed")
    return header, blob[:end]
