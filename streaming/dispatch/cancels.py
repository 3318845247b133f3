"""A dispatch task's cancels (DESIGN.md section 4, the direct window). A cancel due within the
window of its append reaches the task that holds, or will hold, its target (a producer writes
both to one intake partition) twice: read from the intake at once, and as the wheel's notice of
it (sinks/ready.py), which follows every reference the wheel fired before it read the cancel.
The task drops the target (UNIQ_KEY and due time) wherever it waits there, a direct row, a fired
reference or one still without its body, and whenever it comes. A tombstone ends once both
sides have been read, its target's due time and one window more have passed and nothing due
before it is held back: the wheel dropped the target itself (or parked the cancel beside it in
the cold tier), the task dropped it (ledger row `cancelled`), or it missed (`cancel_missed`,
the cancel's own row). The commit points stay below a cancel until its outcome is in the ledger,
so a restarted task hears it again. No Spark import."""
from __future__ import annotations

import heapq
from typing import Iterator

from state import headers as H
from streaming.dispatch.rules import Row

# A cancel's outcome, the status of its ledger row (streaming/ledger/records.py): the target's
# row, dropped; or the cancel's own, its target sent before it came or never come.
CANCELLED, MISSED = "cancelled", "cancel_missed"
# The ledger status of a timer written to the ring (ring.py): its intake record is done.
RINGED = "ringed"
# Where the task read a cancel: the intake, or the wheel's notice (H.READY_CANCEL).
DIRECT, NOTICE = "direct", "notice"


class Tombstone:
    """One target's cancels, as the task has heard of them."""

    __slots__ = ("due_ms", "members", "heard", "dropped", "settled", "ended")

    def __init__(self, due_ms: int):
        self.due_ms = due_ms
        self.members: list[Row] = []   # the rows read of its cancels, open until it is settled
        self.heard: dict[tuple[int, int], set[str]] = {}   # a cancel's intake position → sides
        self.dropped = None   # who dropped the target: "task" or "wheel"
        self.settled = False   # the outcome is durable: the ledger (or the wheel's state) has it
        self.ended = False

    def complete(self, legacy) -> bool:
        """Whether each cancel has been read from both sides (one below the older split's
        offsets only from the wheel's, which took it alone)."""
        return all(NOTICE in sides and (DIRECT in sides or legacy(*at))
                   for at, sides in self.heard.items())


class Tombstones:
    def __init__(self, linger_ms: int):
        self._linger = linger_ms
        self._by: dict[tuple[str, int], Tombstone] = {}   # (target's UNIQ_KEY, due) → it
        self._expiry: list[tuple[int, str, int]] = []   # (ends at the earliest, *target)

    def __bool__(self) -> bool:
        return bool(self._by)

    def add(self, cancel: Row, side: str, notice: bytes | None = None) -> None:
        """`cancel` (its uniq_key and due_ms name its target) read from `side`; a notice says
        whether the wheel settled it."""
        target = (cancel.uniq_key, cancel.due_ms)
        tomb = self._by.get(target)
        if tomb is None:
            tomb = self._by[target] = Tombstone(cancel.due_ms)
            heapq.heappush(self._expiry, (cancel.due_ms + self._linger, *target))
        tomb.members.append(cancel)
        tomb.heard.setdefault((cancel.ipart, cancel.ioff), set()).add(side)
        if notice == H.SETTLED and tomb.dropped is None:
            tomb.dropped, tomb.settled = "wheel", True

    def drop(self, row: Row) -> Tombstone | None:
        """The tombstone that drops `row`, if any."""
        return self._by.get((row.uniq_key, row.due_ms))

    def ended(self, now_ms: int, waiting_ms: int | None, legacy) -> Iterator[Tombstone]:
        """The tombstones that end now (their time up by the broker's clock, both sides heard),
        none whose target is due at or after `waiting_ms`, the due time of the first row the
        task still holds back (the target may be that row, or behind it)."""
        later = []
        while self._expiry and self._expiry[0][0] <= now_ms and (
                waiting_ms is None or self._expiry[0][2] < waiting_ms):
            entry = heapq.heappop(self._expiry)
            tomb = self._by[entry[1:]]
            if not tomb.complete(legacy):   # the other side is still to come: asked again
                later.append(entry)
                continue
            del self._by[entry[1:]]
            tomb.ended = True
            yield tomb
        for entry in later:
            heapq.heappush(self._expiry, entry)
