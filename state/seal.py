"""The seal on the service's own intake records. A producer may write any header, the service's
own (`DELAYQ_ROLLED`, `DELAYQ_HEARTBEAT`) included; they are honoured only with a seal made with
the checkpoint's key (`delayq.json`), which producers never see. A rolled record's seal covers its
level, due time and UNIQ_KEY, so no producer can place a message with one.

The seal is SHA-256 nested as H(key : H(key : text)) (no length extension), cut to 128 bits:
Spark SQL has `sha2` but no HMAC, and the cold tier seals in the JVM (sinks/cold.py `sealed`)."""
from __future__ import annotations

import hashlib
import hmac
import secrets

# Hex digits kept of the digest: 128 bits.
LENGTH = 32
HEARTBEAT_TEXT = "heartbeat"


def new_key() -> str:
    return secrets.token_hex(32)


def seal(key: str, text: str) -> str:
    inner = hashlib.sha256(f"{key}:{text}".encode()).hexdigest()
    return hashlib.sha256(f"{key}:{inner}".encode()).hexdigest()[:LENGTH]


def rolled_text(level: int, due_ms: int, uniq_key: str) -> str:
    """What a rolled record's seal covers (the cold tier builds the same text in Spark SQL)."""
    return f"{level}:{due_ms}:{uniq_key}"


def is_sealed(key: str, text: str, claimed: str) -> bool:
    return hmac.compare_digest(seal(key, text).encode(), claimed.encode())
