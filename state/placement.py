"""Where Spark runs a wheel group: `pmod(murmur3(bucket, slot), partitions)`, Spark's Murmur3 x86
32-bit hash (seed 42, int32 bucket then int64 slot). Spark cannot change it without breaking every
checkpoint; `tests/integration/test_placement.py` checks it against Spark's own placement."""
from __future__ import annotations

import struct
from functools import lru_cache

import mmh3

_SEED = 42


def _hash_long(slot: int, seed: int) -> int:
    """Spark's Murmur3_x86_32 hashLong: the standard hash of the long's 8 little-endian bytes."""
    return mmh3.hash(struct.pack("<q", slot), seed)


# How many slot numbers `balanced_slot` may try per group: the key of group g is one of
# g * BALANCE_WIDTH + j for j < BALANCE_WIDTH, so distinct groups never share a key.
BALANCE_WIDTH = 4096


def spark_hash(bucket: int, slot: int) -> int:
    """Spark's `hash(bucket, slot)` for an int bucket and a long slot (a signed 32-bit int)."""
    return _hash_long(slot, mmh3.hash(struct.pack("<i", bucket), _SEED, signed=False))


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
    seed = mmh3.hash(struct.pack("<i", bucket), _SEED, signed=False)
    base, target = group * BALANCE_WIDTH, group % partitions
    for slot in range(base, base + BALANCE_WIDTH):
        if _hash_long(slot, seed) % partitions == target:
            return slot
    return base
