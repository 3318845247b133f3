"""Partitions left at 0 sized from the job's task slots at a checkpoint's first start; a resumed
checkpoint keeps what Spark recorded in it."""
from __future__ import annotations

import json
import logging
import time

from conf.settings import Settings
from sinks import store
from state.errors import JobError
from streaming.wheel.offsets import latest_batch

log = logging.getLogger(__name__)


def task_slots(conf: dict[str, str], default_parallelism: int) -> int:
    """`spark.cores.max`, else executor instances × cores, else Spark's default parallelism."""
    if conf.get("spark.cores.max"):
        return int(conf["spark.cores.max"])
    if conf.get("spark.executor.instances"):
        return int(conf["spark.executor.instances"]) * int(conf.get("spark.executor.cores", "1"))
    return default_parallelism


def sized(slots: int) -> tuple[int, int]:
    """(state, ready): 1/4 (at least 2) for dispatch, one for intake and ledger, the rest state."""
    ready = max(2, slots // 4)
    return max(1, slots - ready - 1), ready


def recorded_partitions(checkpoint) -> int | None:
    """The shuffle partitions Spark recorded (for the checkpoint's life); None before a batch."""
    batch = latest_batch(checkpoint / "offsets")
    if batch is None:
        return None
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
    value = conf.get("spark.sql.shuffle.partitions")
    return int(value) if value else None


def resolve(settings: Settings, checkpoint, slots: int) -> Settings:
    """`settings` with 0 partitions replaced: the checkpoint's own, or sized for `slots`."""
    if settings.spark_shuffle_partitions and settings.ready_partitions:
        return settings
    state, ready = sized(slots)
    recorded = recorded_partitions(checkpoint)
    resolved = settings.model_copy(update={
        "ready_partitions": settings.ready_partitions or ready,
        "spark_shuffle_partitions": settings.spark_shuffle_partitions or recorded or state})
    if recorded:
        log.info("the checkpoint keeps its %d wheel state partitions (frozen at its first "
                 "start; to grow, start a new checkpoint: docs/operations.md)", recorded)
    else:
        log.info("sized for %d task slots: %d wheel state partitions, %d ready partitions, "
                 "frozen into this new checkpoint", slots, resolved.spark_shuffle_partitions,
                 resolved.ready_partitions)
    return resolved


def size_partitions(spark, settings: Settings, checkpoint: str) -> Settings:
    """Sizes partitions set to 0 before the checkpoint's check compares them."""
    context = spark.sparkContext
    slots = task_slots(dict(context.getConf().getAll()), context.defaultParallelism)
    settings = resolve(settings, store.path(checkpoint), slots)
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
    return settings


def check_slots(spark, settings: Settings, partitions: int) -> None:
    """Refuse to start where the dispatch tasks, each holding a slot for good, would leave the
    wheel's stages none (DESIGN.md section 4)."""
    need = partitions + settings.spark_shuffle_partitions + 1
    deadline = time.monotonic() + settings.executor_slots_wait_s
    slots = spark.sparkContext.defaultParallelism
    while slots < need and time.monotonic() < deadline:   # executors still registering
        time.sleep(1)
        slots = spark.sparkContext.defaultParallelism
    if slots < need:
        raise JobError(f"delayq needs {need} task slots ({partitions} dispatch tasks, "
                       f"{settings.spark_shuffle_partitions} wheel state partitions and one more "
                       f"for the intake and the ledger query) and Spark has {slots}: give it more "
                       f"(spark_master = \"local[{need}]\", or more executor cores)")
    conf = spark.sparkContext.getConf()
    for key in ("spark.speculation", "spark.dynamicAllocation.enabled"):
        if conf.get(key, "false").lower() == "true":
            raise JobError(f"delayq runs dispatch tasks that never end: {key} must be off")
