"""RocketMQ's `messageDelayLevel` syntax: "1s 5s 10s 30s 1m ... 2h" → delays in milliseconds.
Level L (1-based) delays by the L-th entry; level 0 is at once; above the last: clamped to it."""
from __future__ import annotations

import re

from state.errors import DelayLevelError

_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOKEN = re.compile(r"(-?\d+)([smhd])")


def parse_duration(token: str) -> int:
    """One duration token ("5s", "2h") in milliseconds; refuses zero and negatives."""
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        raise DelayLevelError(f"delay token {token!r} is not a whole number followed by one of "
                              f"s, m, h, d (for example '5s' or '2h')")
    millis = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if millis <= 0:
        raise DelayLevelError(f"delay token {token!r} is not positive; every level must delay")
    return millis


def parse_levels(spec: str) -> tuple[int, ...]:
    """Parse a level string into strictly increasing delays (ms), level 1 first."""
    tokens = spec.split()
    if not tokens:
        raise DelayLevelError(
            "delay_levels is empty; give at least one level, e.g. '1s 5s 10s 30s 1m'")
    delays = tuple(parse_duration(token) for token in tokens)
    for index in range(1, len(delays)):
        if delays[index] <= delays[index - 1]:
            raise DelayLevelError(
                f"delay token {tokens[index]!r} (level {index + 1}) is not longer than "
                f"{tokens[index - 1]!r} (level {index}); levels must strictly increase")
    return delays


def clamp_level(level: int, level_count: int) -> int:
    """RocketMQ's rule: levels above the maximum use the maximum. Level 0 stays 0."""
    if level < 0:
        raise ValueError(f"delay level {level} is negative")
    return min(level, level_count)
