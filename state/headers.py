"""Names of the wire contract (DESIGN.md section 2). Changing one breaks producers."""

REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
DELAY = "DELAY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
UNIQ_KEY = "UNIQ_KEY"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
DELIVER_MS = "DELIVER_MS"
DLQ_REASON = "DLQ_REASON"
# Internal: the job's own clock tick on the intake (moves the watermark when producers idle).
HEARTBEAT = "DELAYQ_HEARTBEAT"
# Internal: a message rolled back from the cold tier into the wheel; the value is its level.
ROLLED = "DELAYQ_ROLLED"
# Internal, on the ready topic: the wheel's notice of a cancel within the direct window, and its
# values: the wheel dropped the target or parked the cancel with it; or found nothing there.
READY_CANCEL = "DELAYQ_READY_CANCEL"
SETTLED, OPEN = b"settled", b"open"

TIMER_HEADERS = (TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC)
DELAY_HEADERS = (DELAY, *TIMER_HEADERS)
# Removed on delivery, as RocketMQ clears PROPERTY_DELAY_TIME_LEVEL when it restores.
CONTROL_HEADERS = frozenset((REAL_TOPIC, REAL_QID, *DELAY_HEADERS, UNIQ_KEY, TIMER_DEL_UNIQKEY,
                             DELIVER_MS, HEARTBEAT, ROLLED))
