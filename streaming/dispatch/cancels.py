"""A dispatch task's cancels (DESIGN.md section 4, the direct window). A cancel due within the
window of its append reaches the task that holds, or will hold, its target (a producer writes
both to one intake partition): the task drops the target (UNIQ_KEY and due time) wherever it
waits there, a direct row, a fired reference or one still without its body, and whenever it
comes, until the target's due time and one window more have passed. No Spark import."""
from __future__ import annotations

import heapq
from typing import Iterator

from streaming.dispatch.rules import Row

# A cancel's outcome, the status of its ledger row (streaming/ledger/records.py): the target's
# row, dropped; or the cancel's own, its target sent before it came or never come.
CANCELLED, MISSED = "cancelled", "cancel_missed"


class Tombstones:
    def __init__(self, linger_ms: int):
        self._linger = linger_ms
        self._cancels: dict[tuple[str, int], Row] = {}   # (target's UNIQ_KEY, due) → its cancel
        self._expiry: list[tuple[int, str, int]] = []   # (expires at, *target)
        self._hits: set[tuple[str, int]] = set()

    def __bool__(self) -> bool:
        return bool(self._cancels)

    def add(self, cancel: Row) -> bool:
        """Keep `cancel` (its uniq_key and due_ms name its target); False if one is kept already
        for that target (the first one's outcome is the target's)."""
        target = (cancel.uniq_key, cancel.due_ms)
        if target in self._cancels:
            return False
        self._cancels[target] = cancel
        heapq.heappush(self._expiry, (cancel.due_ms + self._linger, *target))
        return True

    def drop(self, row: Row) -> tuple[Row | None, bool]:
        """The cancel that drops `row` (None: none), and whether `row` is the first it dropped
        (a later one is a copy: a wheel batch fired again, a roll retried)."""
        target = (row.uniq_key, row.due_ms)
        cancel = self._cancels.get(target)
        first = cancel is not None and target not in self._hits
        if first:
            self._hits.add(target)
        return cancel, first

    def expired(self, now_ms: int, waiting_ms: int | None) -> Iterator[tuple[Row, bool]]:
        """The cancels whose time is up by the broker's clock, and whether each dropped its
        target (else it missed); none whose target is due at or after `waiting_ms`, the due time
        of the first row the task still holds back (the target may be that row, or behind it)."""
        while self._expiry and self._expiry[0][0] <= now_ms and (
                waiting_ms is None or self._expiry[0][2] < waiting_ms):
            target = tuple(heapq.heappop(self._expiry)[1:])
            hit = target in self._hits
            self._hits.discard(target)
            yield self._cancels.pop(target), hit
