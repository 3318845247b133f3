"""Dead-letter reasons: `<label>: <text>`. The label names the rule a record broke (a parse rule,
or the client's error code for a send the real topic refused) and is what the metrics count by
(`delayq_messages_dead_lettered_total{reason}`); the text says it of this record, for people."""
from __future__ import annotations

LABELS = frozenset({
    # the wheel's parse (state/envelope.py)
    "missing_real_topic", "illegal_topic", "topic_not_allowed", "no_value", "not_utf8",
    "not_an_integer", "negative", "not_a_partition", "empty_header", "duplicate_header",
    "several_delay_headers", "beyond_max_delay", "timer_in_past", "out_of_range",
    # a service header (DELAYQ_ROLLED, DELAYQ_HEARTBEAT) without the service's seal (state/seal.py)
    "forged_header",
    # a record the parse failed on for a reason no rule names (state/parse.py): a bug to report
    "unparsable",
    # a send the real topic refused (streaming/dispatch/rules.py, by librdkafka's error code)
    "unknown_topic", "partition_out_of_range", "too_large", "not_authorized", "invalid_record",
    # a reference whose intake record is gone or replaced (streaming/dispatch/bodies.py)
    "intake_record_gone", "intake_record_replaced",
})


def reason(label: str, text: str) -> str:
    """The reason a dead letter carries (its DLQ_REASON header and its dead-letter row)."""
    assert label in LABELS, label
    return f"{label}: {text}"


def reason_label(text: str | None) -> str:
    """The label of a reason made by `reason`; "unknown" for any other text."""
    label = (text or "").partition(": ")[0]
    return label if label in LABELS else "unknown"
