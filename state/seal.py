"""The seal on the cold tier's rolls. A producer may write any header, `DELAYQ_ROLLED` included;
it is honoured only with a seal made with the checkpoint's key (`delayq.json`), which producers
never see. The seal covers a rolled record's level, due time, UNIQ_KEY, REAL_TOPIC and REAL_QID,
so no producer can place a message with one. (A record whose only control header is
`DELAYQ_HEARTBEAT` is a clock tick and carries no message; with any other it is refused.)

The seal is SHA-256 nested as H(key : H(key : text)) (no length extension), cut to 128 bits:
Spark SQL has `sha2` but no HMAC, and the cold tier seals in the JVM (sinks/cold.py `sealed`)."""
from __future__ import annotations

import hashlib
import hmac
import secrets

# Hex digits kept of the digest: 128 bits.
LENGTH = 32


def new_key() -> str:
    return secrets.token_hex(32)


def seal(key: str, text: str) -> str:
    inner = hashlib.sha256(f"{key}:{text}".encode()).hexdigest()
    return hashlib.sha256(f"{key}:{inner}".encode()).hexdigest()[:LENGTH]


def rolled_text(level: int, due_ms: int, uniq_key: str, topic: str, qid: int | None) -> str:
    """What a rolled record's seal covers (the cold tier builds the same text in Spark SQL; no
    REAL_QID: empty)."""
    return f"{level}:{due_ms}:{topic}:{'' if qid is None else qid}:{uniq_key}"


def is_sealed(key: str, text: str, claimed: str) -> bool:
    return hmac.compare_digest(seal(key, text).encode(), claimed.encode())
