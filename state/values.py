"""Header values as the parse reads them (state/envelope.py): UTF-8 text, and integers as Spark
and Kafka's Java clients read them, no wider than a long; a value refused raises BadInput."""
from __future__ import annotations

import re

from state import headers as H
from state.reasons import reason

# ASCII digits only (Python's \d takes "٣"), no spaces, no "+".
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_LONG = 2**63
# The rule of the delayq before, for its records (state/envelope.py Rules.legacy_before): spaces
# around, a sign, any Unicode digits.
_LEGACY_INTEGER = re.compile(r"[+-]?\d{1,19}")
_INTEGER_HEADERS = (H.REAL_QID, *H.DELAY_HEADERS)


class BadInput(Exception):
    """Raised inside parsing; becomes a DEAD envelope with its reason (state/reasons.py)."""

    def __init__(self, label: str, text: str):
        super().__init__(text)
        self.reason = reason(label, text)


def header_text(name: str, raw: bytes | None) -> str:
    if raw is None:
        raise BadInput("no_value", f"header {name} has no value")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("not_utf8", f"header {name} is not valid UTF-8") from None


def header_integer(name: str, raw: bytes | None, text: str | None = None) -> int:
    """The header's value (or `text`, a part of it) as a long."""
    text = header_text(name, raw) if text is None else text
    if not _INTEGER.fullmatch(text):
        raise BadInput("not_an_integer", f"header {name}={text[:64]!r} is not an integer "
                       f"(ASCII digits, no spaces)")
    value = int(text)
    if not fits_long(value):
        raise BadInput("out_of_range", f"header {name}={text!r} does not fit a 64-bit integer")
    return value


def fits_long(value: int) -> bool:
    return -_LONG <= value < _LONG


def long_of(raw: bytes | None) -> int | None:
    """A header value as `parse` reads an integer, or None where it refuses it."""
    try:
        return header_integer("", raw)
    except BadInput:
        return None


def legacy_integers(control: dict[str, bytes | None]) -> dict[str, bytes | None]:
    """`control` with each integer header the older rule took written as the rule takes it now:
    what an older delayq accepted (and may hold a reference to) is accepted still."""
    out = dict(control)
    for name in _INTEGER_HEADERS:
        try:
            text = control[name].decode("utf-8").strip()
        except (KeyError, AttributeError, UnicodeDecodeError):
            continue
        if _LEGACY_INTEGER.fullmatch(text):
            out[name] = str(int(text)).encode()
    return out
