"""A dispatch task's tombstones (streaming/dispatch/cancels.py), without Kafka: a tombstone ends
only once both sides of each of its cancels were read, its time is up and nothing due before its
target is held back."""
from __future__ import annotations

from state import headers as H
from streaming.dispatch.cancels import DIRECT, NOTICE, Tombstones
from streaming.dispatch.rules import Row

DUE = 10_000


def cancel(target: str = "t", offset: int = 5, due: int = DUE) -> Row:
    return Row(due, 0, offset, offset, None, None, None, None, [], -1, 1_000, target)


def never_legacy(part: int, offset: int) -> bool:
    return False


def ended(tombs: Tombstones, now: int, waiting: int | None = None, legacy=never_legacy):
    return list(tombs.ended(now, waiting, legacy))


def test_a_tombstone_ends_when_both_sides_are_read_and_its_time_is_up():
    tombs = Tombstones(linger_ms=2_000)
    tombs.add(cancel(), DIRECT)
    assert tombs.drop(cancel()) is not None, "it drops its target from the start"
    assert ended(tombs, DUE + 5_000) == [], "the wheel's notice is still to come"
    tombs.add(cancel(), NOTICE, H.OPEN)
    assert ended(tombs, DUE + 1_999) == [], "its time is not up"
    assert ended(tombs, DUE + 5_000, waiting=DUE) == [], "a row due with it is held back"
    [tomb] = ended(tombs, DUE + 5_000, waiting=DUE + 1)
    assert tomb.dropped is None and len(tomb.members) == 2 and tomb.ended
    assert not tombs and tombs.drop(cancel()) is None


def test_a_notice_first_waits_for_the_intake_read_but_not_below_the_older_split():
    tombs = Tombstones(linger_ms=0)
    tombs.add(cancel(offset=7), NOTICE, H.SETTLED)
    assert ended(tombs, DUE + 1) == []
    tombs.add(cancel(offset=7), DIRECT)
    [tomb] = ended(tombs, DUE + 1)
    assert tomb.dropped == "wheel" and tomb.settled
    older = Tombstones(linger_ms=0)
    older.add(cancel(offset=7), NOTICE, H.OPEN)
    assert len(ended(older, DUE + 1, legacy=lambda part, offset: offset < 10)) == 1


def test_two_cancels_of_one_target_share_its_tombstone_and_each_needs_both_sides():
    tombs = Tombstones(linger_ms=0)
    for offset in (5, 6):
        tombs.add(cancel(offset=offset), DIRECT)
    tombs.add(cancel(offset=5), NOTICE, H.OPEN)
    assert ended(tombs, DUE + 1) == [], "the second cancel's notice is still to come"
    tombs.add(cancel(offset=6), NOTICE, H.OPEN)
    [tomb] = ended(tombs, DUE + 1)
    assert [m.offset for m in tomb.members] == [5, 6, 5, 6]
