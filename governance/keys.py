"""API key material: generation, hashing and display. No database here."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "sk-sy-"
VISIBLE_PREFIX_LENGTH = 12  # "sk-sy-" plus 6 random characters: enough to tell keys apart


def key_generate() -> str:
    """A new API key: 256 bits of randomness behind a recognisable prefix."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def key_visible_prefix(plaintext: str) -> str:
    return plaintext[:VISIBLE_PREFIX_LENGTH]
