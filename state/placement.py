"""Where Spark runs a wheel group: `pmod(murmur3(bucket, slot), partitions)`, Spark's Murmur3 x86
32-bit hash (seed 42, int32 bucket then int64 slot). Spark cannot change it without breaking every
checkpoint; `tests/integration/test_placement.py` checks it against Spark's own placement."""
from __future__ import annotations

from functools import lru_cache

_MASK = 0xFFFF_FFFF
_SEED = 42


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E_2D51) & _MASK
    return (_rotl(k1, 15) * 0x1B87_3593) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE654_6B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EB_CA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2_AE35) & _MASK
    return h1 ^ (h1 >> 16)


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value & _MASK)), 4)


def _hash_long(value: int, seed: int) -> int:
    value &= 0xFFFF_FFFF_FFFF_FFFF
    h1 = _mix_h1(seed, _mix_k1(value & _MASK))
    return _fmix(_mix_h1(h1, _mix_k1(value >> 32)), 8)


# How many slot numbers `balanced_slot` may try per group: the key of group g is one of
# g * BALANCE_WIDTH + j for j < BALANCE_WIDTH, so distinct groups never share a key.
BALANCE_WIDTH = 4096


def spark_hash(bucket: int, slot: int) -> int:
    """Spark's `hash(bucket, slot)` for an int bucket and a long slot (a signed 32-bit int)."""
    h = _hash_long(slot, _hash_int(bucket, _SEED))
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_of(bucket: int, slot: int, partitions: int) -> int:
    """The state partition of the group (bucket, slot): Spark's pmod of the hash."""
    return spark_hash(bucket, slot) % partitions


@lru_cache(maxsize=None)
def spread_slots(bucket: int, partitions: int) -> tuple[int, ...]:
    """For each state partition in order, the smallest slot number ≥ 0 whose group of `bucket`
    Spark runs there (pass-through groups keep no state, so their slots are free). Plain `ioff %
    n` would not spread: for two, slots 0 and 1 of the immediate bucket both hash to partition 1."""
    slots: dict[int, int] = {}
    slot = 0
    while len(slots) < partitions:
        slots.setdefault(partition_of(bucket, slot, partitions), slot)
        slot += 1
    return tuple(slots[p] for p in range(partitions))


@lru_cache(maxsize=1 << 16)
def balanced_slot(bucket: int, group: int, partitions: int) -> int:
    """A slot for group `group` of `bucket` that Spark runs on partition `group % partitions`, so
    consecutive groups (a timer slot's parts) take the partitions in turn and no task holds most
    of a burst: the smallest `group * BALANCE_WIDTH + j` there, else (for 200 partitions, one
    group in about 800 million) `group * BALANCE_WIDTH`, placed by the hash."""
    seed = _hash_int(bucket, _SEED)
    base, target = group * BALANCE_WIDTH, group % partitions
    for slot in range(base, base + BALANCE_WIDTH):
        h = _hash_long(slot, seed)
        if (h - (1 << 32) if h >= 1 << 31 else h) % partitions == target:
            return slot
    return base
