"""Read one intake record's headers into an Envelope: what to do with it, and why if it is bad.
Pure Python, unit-tested without Spark; state/parse.py applies these rules to Arrow batches."""
from __future__ import annotations

import re
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum

from state import headers as H
from state.levels import clamp_level
from state.reasons import reason
from state.seal import is_sealed, rolled_text
from state.values import BadInput, header_integer, header_text, legacy_integers
from state.timing import beyond_max_delay, correct_deliver_timestamps, in_the_past, is_cold

# Kafka's own rule for topic names (org.apache.kafka.common.internals.Topic).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Integers as Spark and Kafka's Java clients read them, and no wider than a long: ASCII digits
# only (Python's \\d takes "٣"), no spaces, no "+".
_INTEGER = re.compile(r"-?[0-9]{1,19}")
_LONG = 2**63

Header = tuple[str, bytes | None]


class Kind(str, Enum):
    HEARTBEAT = "hb"   # the job's own clock tick; never delivered
    NOW = "now"        # no delay: deliver at once
    DELAY = "delay"    # hold in the wheel until due
    CANCEL = "cancel"  # drop a pending message by UNIQ_KEY
    DEAD = "dead"      # bad input: dead-letter topic, with a reason
    COLD = "cold"      # due beyond the near horizon: parked in the cold tier (Delta) for now


@dataclass(frozen=True)
class Rules:
    """What parsing needs of the configuration (streaming/stages.py rules_of); no defaults."""
    level_delays_ms: tuple[int, ...]
    intake_topic: str
    dlq_topic: str
    _: KW_ONLY
    allowed_topics: frozenset[str]
    max_delay_ms: int
    clock_tolerance_ms: int
    # Due within near_horizon_ms of append: the wheel; later: cold tier, by cold_bucket_ms.
    near_horizon_ms: int
    cold_bucket_ms: int
    # The groups a timer slot is split into, by UNIQ_KEY (state/groups.py part_of).
    timer_parts: int
    # Timers (and their cancels) due within this of their append go to the dispatch tasks'
    # rings (streaming/dispatch/ring.py; 0: none), a rule of the record alone.
    ring_horizon_ms: int
    # The cold tier's rolls feed the rings (conf/settings.py rolls_to_ring): a timer due beyond
    # ring_horizon_ms of its append waits in the cold tier, and a rolled one goes to its ring.
    rolls_to_ring: bool
    # The checkpoint's key for the service's own records (state/seal.py): never shown.
    seal_key: str = field(repr=False)
    # Per intake partition, the offset below which records follow an older delayq's rules: its
    # unsealed service records honoured, its split (streaming/dispatch/direct.py) kept
    # (streaming/wheel/checkpoint.py seal_of): what it wrote and split before this one started.
    legacy_before: tuple[int, ...]


@dataclass(frozen=True)
class Envelope:
    kind: Kind
    uniq_key: str
    real_topic: str | None = None
    real_qid: int | None = None
    level: int = 0             # 1..N for level messages, 0 for immediate, TIMER_LEVEL for timers
    due_ms: int = 0
    reason: str | None = None
    cancel_key: str | None = None
    rolled: bool = False      # came back from the cold tier (already counted as received)


TIMER_LEVEL = -1


def topic_refusal(topic: str, rules: Rules) -> tuple[str, str] | None:
    """Why `topic` may not be a REAL_TOPIC, as (label, text) of its reason, or None."""
    if not _LEGAL_TOPIC.fullmatch(topic) or topic in (".", ".."):
        return "illegal_topic", f"REAL_TOPIC {topic[:64]!r} is not a legal Kafka topic name"
    if topic == rules.intake_topic:
        return "topic_not_allowed", f"REAL_TOPIC {topic!r} is the intake topic"
    if topic == rules.dlq_topic:
        return "topic_not_allowed", f"REAL_TOPIC {topic!r} is the dead-letter topic"
    if topic.startswith("__"):
        return "topic_not_allowed", f"REAL_TOPIC {topic!r} is an internal Kafka topic"
    if rules.allowed_topics and topic not in rules.allowed_topics:
        return ("topic_not_allowed",
                f"REAL_TOPIC {topic!r} is not in the allow-list (setting allowed_topics)")
    return None


def real_topic_of(raw: bytes | None, rules: Rules) -> str | None:
    """The topic a REAL_TOPIC value names, or None where `parse` would refuse it."""
    try:
        topic = header_text(H.REAL_TOPIC, raw).strip()
    except BadInput:
        return None
    return None if topic_refusal(topic, rules) else topic


def level_of(raw: bytes | None, rules: Rules) -> int | None:
    """The level a DELAY value names, clamped as `parse` does, or None where it refuses it."""
    try:
        return _level({H.DELAY: raw}, rules)
    except BadInput:
        return None


def default_uniq_key(partition: int, offset: int) -> str:
    """The UNIQ_KEY of a record that names none: its intake partition and offset."""
    return f"{partition}-{offset}"


def parse(headers: list[Header], partition: int, offset: int, append_ms: int,
          rules: Rules, now_ms: int) -> Envelope:
    """Decide what one intake record is. Never raises for bad input: returns a DEAD envelope."""
    default_key = default_uniq_key(partition, offset)
    control: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in H.CONTROL_HEADERS:
            if name in control:
                return Envelope(Kind.DEAD, default_key,
                                reason=reason("duplicate_header", f"header {name} appears twice"))
            control[name] = value
    older = is_legacy(rules, partition, offset)
    if older:
        control = legacy_integers(control)
    uniq = default_key   # a dead letter's too, unless its own UNIQ_KEY is good
    try:
        if H.HEARTBEAT in control:   # the job's clock tick carries no message
            if len(control) > 1:
                raise BadInput("forged_header", f"header {H.HEARTBEAT} marks the job's clock "
                               f"tick, which carries no other control header")
            return Envelope(Kind.HEARTBEAT, default_key)
        if H.UNIQ_KEY in control:
            key = header_text(H.UNIQ_KEY, control[H.UNIQ_KEY]).strip()
            if not key:
                raise BadInput("empty_header", "header UNIQ_KEY is empty")
            uniq = key
        return _parse_control(control, uniq, append_ms, rules, now_ms, older)
    except BadInput as bad:
        return Envelope(Kind.DEAD, uniq, reason=bad.reason)


def is_legacy(rules: Rules, partition: int, offset: int) -> bool:
    """Whether the record follows the rules of the delayq that wrote the checkpoint before."""
    return partition < len(rules.legacy_before) and offset < rules.legacy_before[partition]


def _forged() -> BadInput:
    return BadInput("forged_header", f"header {H.ROLLED} is the cold tier's, and this record "
                    f"does not carry its seal: producers may not write it")


def _rolled(control: dict[str, bytes | None], uniq: str, topic: str, qid: int | None,
            append_ms: int, rules: Rules, older: bool) -> tuple[Kind, int, int]:
    """A message the cold tier rolled back onto the intake (sinks/cold.py roll), placed by the
    level and due time it sealed: (kind, level, due)."""
    text, _, claimed = header_text(H.ROLLED, control[H.ROLLED]).partition(":")
    if not (claimed or older):
        raise _forged()
    level = header_integer(H.ROLLED, None, text)
    due = header_integer(H.TIMER_DELIVER_MS, control.get(H.TIMER_DELIVER_MS))
    if not (is_sealed(rules.seal_key, rolled_text(level, due, uniq, topic, qid), claimed)
            or older and not claimed) or (level != TIMER_LEVEL and level < 1):
        raise _forged()
    if level > 0:
        level = clamp_level(level, len(rules.level_delays_ms))
    return Kind.DELAY if due > append_ms else Kind.NOW, level, due


def _parse_control(control: dict[str, bytes | None], uniq: str, append_ms: int, rules: Rules,
                   now_ms: int, older: bool) -> Envelope:
    present = [name for name in H.DELAY_HEADERS if name in control]
    if H.TIMER_DEL_UNIQKEY in control:
        return _cancel(control, present, uniq, append_ms, rules, now_ms)
    if len(present) > 1:
        raise BadInput("several_delay_headers", f"more than one delay header: {', '.join(present)}")
    if H.REAL_TOPIC not in control:
        raise BadInput("missing_real_topic", "header REAL_TOPIC is missing")
    topic = header_text(H.REAL_TOPIC, control[H.REAL_TOPIC]).strip()
    refusal = topic_refusal(topic, rules)
    if refusal:
        raise BadInput(*refusal)
    qid = None
    if H.REAL_QID in control:
        qid = header_integer(H.REAL_QID, control[H.REAL_QID])
        if qid < 0 or qid > 2**31 - 1:
            raise BadInput("not_a_partition", f"header REAL_QID={qid} is not a partition number")
    if H.ROLLED in control:
        kind, level, due = _rolled(control, uniq, topic, qid, append_ms, rules, older)
        return Envelope(kind, uniq, topic, qid, level, due, rolled=True)
    level, due = _due(control, present, append_ms, rules, now_ms)
    kind = Kind.NOW if level == 0 or due <= append_ms else Kind.DELAY
    if kind == Kind.DELAY and _cold(due, append_ms, level, rules):
        kind = Kind.COLD
    return Envelope(kind, uniq, topic, qid, level, due)


def _cold(due: int, append_ms: int, level: int, rules: Rules) -> bool:
    """Whether a message waits in the cold tier: a timer beyond the ring's horizon when the
    rolls feed the rings (state/common.py `_placed` alike), else by its bucket (`is_cold`)."""
    if level == TIMER_LEVEL and rules.rolls_to_ring:
        return due - append_ms > rules.ring_horizon_ms
    return is_cold(due, append_ms, rules.near_horizon_ms, rules.cold_bucket_ms)


def _cancel(control: dict[str, bytes | None], present: list[str], uniq: str, append_ms: int,
            rules: Rules, now_ms: int) -> Envelope:
    """A cancel names its target (TIMER_DEL_UNIQKEY), its level (DELAY; none for a timer) and due
    time (TIMER_DELIVER_MS). With only its original delay header it is placed by that alone,
    which finds timers with an absolute time; for levels the client always sends the due time."""
    if H.ROLLED in control:   # the cold tier rolls messages, never cancels
        raise _forged()
    target = header_text(H.TIMER_DEL_UNIQKEY, control[H.TIMER_DEL_UNIQKEY]).strip()
    if not target:
        raise BadInput("empty_header", "header TIMER_DEL_UNIQKEY is empty")
    if len(present) > 1 and present != [H.DELAY, H.TIMER_DELIVER_MS]:
        raise BadInput("several_delay_headers", f"more than one delay header: {', '.join(present)}")
    if H.TIMER_DELIVER_MS in present:
        level = _level(control, rules) if H.DELAY in present else TIMER_LEVEL
        due = header_integer(H.TIMER_DELIVER_MS, control[H.TIMER_DELIVER_MS])
        # No target can be due then: not before the epoch, not beyond the maximum delay.
        if due < 0:
            raise BadInput("negative", f"header {H.TIMER_DELIVER_MS}={due} is negative")
        if beyond_max_delay(due, append_ms, rules.max_delay_ms):
            raise _beyond_max_delay(H.TIMER_DELIVER_MS, due, rules)
    else:
        level, due = _due(control, present, append_ms, rules, now_ms)
    return Envelope(Kind.CANCEL, uniq, level=level, due_ms=due, cancel_key=target)


def _beyond_max_delay(name: str, value: int, rules: Rules) -> BadInput:
    return BadInput("beyond_max_delay", f"header {name}={value} is beyond the maximum delay of "
                    f"{rules.max_delay_ms // 1000} s (setting max_delay)")


def _level(control: dict[str, bytes | None], rules: Rules) -> int:
    """The DELAY header's level, clamped to the highest configured (RocketMQ's rule)."""
    level = header_integer(H.DELAY, control[H.DELAY])
    if level < 0:
        raise BadInput("negative", f"header DELAY={level} is negative")
    return clamp_level(level, len(rules.level_delays_ms))


def _due(control: dict[str, bytes | None], present: list[str], append_ms: int,
         rules: Rules, now_ms: int) -> tuple[int, int]:
    """(level, due time) from the one delay header present, or (0, append time) for none."""
    if not present:
        return 0, append_ms
    name = present[0]
    if name == H.DELAY:
        level = _level(control, rules)
        if level == 0:
            return 0, append_ms
        delay = rules.level_delays_ms[level - 1]
        return level, int(correct_deliver_timestamps(now_ms, append_ms + delay, delay,
                                                     rules.clock_tolerance_ms))
    value = header_integer(name, control[name])
    if name == H.TIMER_DELIVER_MS:
        due = value
    elif value < 0:
        raise BadInput("negative", f"header {name}={value} is negative")
    else:
        due = append_ms + value * (1000 if name == H.TIMER_DELAY_SEC else 1)
    if beyond_max_delay(due, append_ms, rules.max_delay_ms):
        raise _beyond_max_delay(name, value, rules)
    if in_the_past(due, append_ms, rules.clock_tolerance_ms):
        raise BadInput("timer_in_past",
                       f"header {name}={value} is {(append_ms - due) // 1000} s in the past, more "
                       f"than the clock tolerance of {rules.clock_tolerance_ms // 1000} s")
    return TIMER_LEVEL, max(due, append_ms)
