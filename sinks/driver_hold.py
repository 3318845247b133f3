"""The driver's hold: a batch's rows not yet due sent to Kafka at their due time by a thread of
the driver, after the batch has ended.

The tasks' hold (sinks/kafka.py) keeps its micro-batch open until the last fired row is due, so
every batch lasts at least as long as the fire lead reaches past its start, and a longer lead,
which would fire more messages in time, makes every batch longer (docs/benchmarks.md, "The
fire lead"). With this hold the batch's tasks send only the rows already due, through Spark's
Kafka writer as the tasks' hold does (a drain, a restart's backlog), and hand the rest to the
driver (sinks/kafka.py `release_due`), which writes them to a spool file beside the checkpoint
and returns; this thread sends each row when it is due, through librdkafka.

Never lost: a batch's file is written (temporary name, fsync, rename) before the batch commits,
and deleted only once Kafka has acknowledged every row in it. A start sends again every file of
a committed batch that is still there, from the rows a clean stop recorded as sent
(`<file>.sent`); files of batches Spark did not commit are deleted, since Spark runs those
batches again and they spool their rows anew. After a crash a row can so be sent twice, with
the same UNIQ_KEY. Never early: a row is handed to the producer only once the clock has reached
its due time.

The tasks hand their rows over through files where they can (`hand_over`): a task that sees the
hold's hand-off folder (`incoming/`, marked by the running hold's token, so a task on another
machine never writes one) writes its rows there, in the spool's layout, and reports only the
file's name; the driver moves it into the spool as one more file of the batch, queues it, and
syncs it to disk before the batch commits. A task that does not see the folder reports its rows
to the driver through Spark (sinks/kafka.py HoldReports), which writes them into the batch's
own file. A burst of 500,000 rows of 1 KiB was 590 MB through Spark's task results, received,
decoded and written again by the driver before its first row could leave (docs/benchmarks.md).

The batch's own file also lists the batch's deliveries its tasks sent (with their `sent_ms`,
no payload), first: they are never sent again, and are reported with the rest. `on_sent(batch_id,
batch_time_ms, released)` is called once per batch, in batch order, when all of its files' rows
are acknowledged, with its deliveries' RELEASED columns (sent_ms: when each was handed to a
producer): what the ledger and the lateness histogram record.
"""
from __future__ import annotations

import functools
import heapq
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sinks.durable import fsync_dir, write_durably
from state.errors import JobError
from state.columns import OUTPUT

log = logging.getLogger(__name__)

SPOOL_FOLDER = "hold-spool"
# Inside the spool: where tasks write the rows they hand over, until the driver takes them.
HANDOFF_FOLDER = "incoming"
# What a spooled row keeps: the record as written to Kafka, and what the ledger records.
SPOOLED = ("topic", "partition", "key", "value", "headers", "kind", "uniq_key", "level", "ipart",
           "ioff", "append_ms", "due_ms")
# A delivery's columns the driver keeps once it is sent, with `sent_ms`, the moment a hold
# released it: what the ledger records and the lateness histogram counts.
RELEASED = ("uniq_key", "topic", "partition", "level", "ipart", "ioff", "append_ms", "due_ms",
            "sent_ms")
# A spool file's layout: SPOOLED, and when the batch's tasks sent the row (null: the hold sends
# it). The tasks' rows come first, then the hold's in due order.
_SCHEMA = pa.schema([OUTPUT.field(name) for name in SPOOLED] + [("sent_ms", pa.int64())])
_BATCH_TIME = b"delayq.batch_time_ms"
_RETRY_S = 0.5
# Rows handed to the producer per step: each step first converts its rows to Python objects
# (about 3 µs a row), so the first of a burst of rows due together leaves without waiting for
# the whole burst to be converted, and other files' due rows take turns with it.
_STEP_ROWS = 2048


def producer_config(bootstrap: str, security: dict[str, object] | None = None,
                    max_request_bytes: int = 1_048_576) -> dict:
    """librdkafka's settings for the hold: send each row as soon as it is released, wait for
    every in-sync replica, take the largest record the tasks' writer takes, and place keyed
    rows without REAL_QID as Kafka's Java client does (murmur2), as Spark's Kafka writer in the
    tasks' hold places them."""
    return {"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
            "message.max.bytes": max_request_bytes,
            "enable.idempotence": True, "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_097_151,
            **(security or {})}


@dataclass
class _File:
    batch_id: int
    batch_time_ms: int
    path: Path
    rows: pa.Table
    due: np.ndarray
    sent_ms: np.ndarray            # when each row was handed to the producer (-1: not yet)
    ok: np.ndarray                 # acknowledged by Kafka
    next: int = 0                  # rows before this one have been handed to the producer
    failed: list[int] = field(default_factory=list)   # rows Kafka did not take: sent again
    retry_at: float = 0.0          # ... not before this (time.monotonic)

    @property
    def acked(self) -> int:
        return int(np.count_nonzero(self.ok))

    @property
    def done(self) -> bool:
        return bool(self.ok.all())

    def acked_prefix(self) -> int:
        """How many rows, in due order, are acknowledged without a gap."""
        return len(self.ok) if self.ok.all() else int(np.argmin(self.ok))


class DriverHold:
    def __init__(self, folder: Path, config: dict,
                 on_sent: Callable[[int, int, pa.Table], None] | None = None,
                 clock: Callable[[], float] = time.time):
        from confluent_kafka import Producer

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._producer = Producer(config)
        self._on_sent = on_sent
        self._clock = clock
        self._token = uuid.uuid4().hex[:8]
        self._files: dict[tuple[int, str], _File] = {}   # in put order, which is batch order
        self._heap: list[tuple[int, int, str]] = []      # (next due, batch id, file name)
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Finished files, reported by a thread of their own (in order), so that no send waits
        # for the ledger's file or the metrics.
        self._reports: queue.Queue = queue.Queue()
        self._reporter: threading.Thread | None = None
        self.last_error: str | None = None
        # Rows put already sent by their batch's tasks, and rows this hold handed to Kafka.
        self.sent_by = {"tasks": 0, "hold": 0}
        # Files the batches' tasks handed their rows over in, and those rows.
        self.handed_over = {"files": 0, "rows": 0}
        # The hand-off folder's marker: a task writes its rows there only if it sees this file,
        # that is, if it shares this folder with the running hold (`hand_over`).
        self.handoff = self.folder / HANDOFF_FOLDER
        self.handoff.mkdir(exist_ok=True)
        self.handoff_marker = str(self.handoff / f".hold-{self._token}")

    # ---- spool files ---------------------------------------------------------------------
    @staticmethod
    def _batch_of(path: Path) -> int:
        return int(path.name.split("-", 1)[0])

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.arrow"), key=lambda p: (self._batch_of(p), p.name))

    def put(self, batch_id: int, batch_time_ms: int, rows: pa.Table | None,
            sent: pa.Table | None = None, files: list[str] = ()) -> None:
        """Spool a batch's rows to send (SPOOLED columns) and queue them; with them the
        deliveries the batch's tasks sent already (RELEASED columns, `sent`), so that the
        batch's deliveries are all reported together, in batch order, and a crash before that
        loses none of their ledger rows; and `files`, the names of the files its tasks wrote to
        the hand-off folder (`hand_over`), which become files of the batch. Returns once they
        are all on disk: the batch may commit then. The tasks' files are queued before they are
        synced, so their rows can leave meanwhile: if the sync fails, the batch fails and runs
        again, and a row already sent is sent again, with the same UNIQ_KEY."""
        taken = self._take_over(batch_id, files)
        parts = []
        if sent is not None and sent.num_rows:
            n = sent.num_rows
            self.sent_by["tasks"] += n
            parts.append(pa.table({name: (sent.column(name) if name in sent.schema.names else
                                          pa.array(["deliver"] * n) if name == "kind" else
                                          pa.nulls(n, _SCHEMA.field(name).type))
                                   for name in SPOOLED + ("sent_ms",)}, schema=_SCHEMA))
        if rows is not None and rows.num_rows:
            parts.append(_spooled(rows))
        if not parts and not taken:
            return
        # The batch's own file, even empty: it carries the batch's time for a restart.
        rows = (pa.concat_tables(parts) if len(parts) > 1 else parts[0] if parts
                else _SCHEMA.empty_table())
        rows = rows.replace_schema_metadata({_BATCH_TIME: str(batch_time_ms).encode()})
        final = self.folder / f"{batch_id:019d}-{self._token}.arrow"
        write_durably(final, functools.partial(_write_arrow, rows))
        entries = [(final, rows)] + [(path, _read_arrow(path)) for path in taken]
        self.handed_over["files"] += len(taken)
        self.handed_over["rows"] += sum(table.num_rows for _, table in entries[1:])
        with self._wake:       # a batch's files are queued together: reported together
            queued = [self._queue(path, table, batch_id, batch_time_ms, sent=None)
                      for path, table in entries]
        if taken:
            try:
                for path in taken:
                    _fsync(path)
                fsync_dir(self.folder)
            except OSError:
                self._unqueue(queued)
                raise

    def _take_over(self, batch_id: int, names: list[str]) -> list[Path]:
        """Move the files a batch's tasks handed over into the spool, as files of the batch;
        delete what earlier attempts of its tasks left in the hand-off folder."""
        taken = []
        for k, name in enumerate(sorted(names), 1):
            source = self.handoff / name
            if not source.exists():
                raise JobError(f"batch {batch_id}: a task handed its rows over in {source}, "
                               f"which the driver does not see")
            final = self.folder / f"{batch_id:019d}-{self._token}-{k:04d}.arrow"
            os.replace(source, final)
            taken.append(final)
        for left in self.handoff.glob("*.arrow"):      # attempts Spark did not keep
            prefix = left.name.split("-", 1)[0]
            if prefix.isdigit() and int(prefix) <= batch_id:
                left.unlink(missing_ok=True)
        return taken

    def _unqueue(self, entries: list["_File"]) -> None:
        with self._wake:
            for entry in entries:
                self._files.pop((entry.batch_id, entry.path.name), None)
            self._heap = [(int(f.due[f.next]), f.batch_id, f.path.name)
                          for f in self._files.values() if f.next < len(f.due)]
            heapq.heapify(self._heap)

    def _queue(self, path: Path, rows: pa.Table, batch_id: int, batch_time_ms: int,
               sent: np.ndarray | None) -> _File:
        due = rows.column("due_ms").to_numpy()
        entry = _File(batch_id, batch_time_ms, path, rows, due,
                      np.full(len(due), -1, np.int64), np.zeros(len(due), bool))
        if "sent_ms" in rows.schema.names:   # rows the batch's tasks sent: they come first
            done = pc.fill_null(rows.column("sent_ms"), -1).to_numpy()
            entry.sent_ms[:] = done
            entry.ok[:] = done >= 0
            entry.next = int(np.count_nonzero(entry.ok))
        if sent is not None:       # rows a clean stop recorded as acknowledged
            entry.sent_ms[:len(sent)] = sent
            entry.ok[:len(sent)] = True
            entry.next = max(entry.next, len(sent))
        with self._wake:
            self._files[(batch_id, path.name)] = entry
            if entry.next < len(due):
                heapq.heappush(self._heap, (int(due[entry.next]), batch_id, path.name))
            self._wake.notify()
        return entry

    def start(self, last_committed: int | None) -> "DriverHold":
        """Queue what an earlier run left: files of committed batches (up to `last_committed`)
        are sent again from where a clean stop left them; later ones are deleted, their
        batches run again."""
        for stale in self.folder.glob(".*.tmp"):
            stale.unlink()
        # Files the tasks handed over that no batch took: their batches run again.
        for left in self.handoff.iterdir():
            left.unlink()
        Path(self.handoff_marker).touch()
        kept = []
        for path in self.files():
            batch_id = self._batch_of(path)
            marker = path.with_name(path.name + ".sent")
            if last_committed is None or batch_id > last_committed:
                path.unlink()
                marker.unlink(missing_ok=True)
                continue
            rows = _read_arrow(path)
            sent = None
            if marker.exists():
                sent = _read_arrow(marker).column("sent_ms").to_numpy()
            kept.append((path, rows, batch_id, sent))
        # A batch's time is in its own file; its tasks' files do not carry it.
        times: dict[int, int] = {}
        for _, rows, batch_id, _ in kept:
            meta = rows.schema.metadata or {}
            times[batch_id] = max(times.get(batch_id, 0), int(meta.get(_BATCH_TIME, b"0")))
        for path, rows, batch_id, sent in kept:
            entry = self._queue(path, rows, batch_id, times[batch_id], sent)
            log.info("hold: sending again %d rows of batch %d left by the last run",
                     len(entry.due) - entry.next, batch_id)
        for marker in self.folder.glob("*.arrow.sent"):
            if not marker.with_name(marker.name[:-len(".sent")]).exists():
                marker.unlink()
        self._send_overdue()
        self._reporter = threading.Thread(target=self._report, name="delayq-hold-report",
                                          daemon=True)
        self._reporter.start()
        self._thread = threading.Thread(target=self._run, name="delayq-hold", daemon=True)
        self._thread.start()
        return self

    def _send_overdue(self, timeout_s: float = 60.0) -> None:
        """Send what an earlier run left that is due already, in due order across its files
        (each file is in due order, but the files of consecutive batches overlap), and wait
        until Kafka has taken it: before this run's first batch sends anything, so that a
        level's overdue messages leave in due order after a restart."""
        now_ms = int(self._clock() * 1000)
        runs = []
        for entry in self._files.values():       # batch order: ties go to the earlier batch
            end = int(entry.due.searchsorted(now_ms, side="right"))
            if end > entry.next:
                runs.append((entry, np.arange(entry.next, end)))
        if not runs:
            return
        order = np.argsort(np.concatenate([entry.due[rows] for entry, rows in runs]),
                           kind="stable")
        which = np.concatenate([np.full(len(rows), k) for k, (_, rows) in enumerate(runs)])[order]
        rows = np.concatenate([rows for _, rows in runs])[order]
        cuts = np.flatnonzero(np.diff(which)) + 1
        for part_which, part_rows in zip(np.split(which, cuts), np.split(rows, cuts)):
            entry = runs[int(part_which[0])][0]
            for at in range(0, len(part_rows), _STEP_ROWS):
                self._send(entry, part_rows[at:at + _STEP_ROWS].tolist(), now_ms)
        with self._wake:
            for entry, sent in runs:
                entry.next = int(sent[-1]) + 1
            self._heap = [(int(f.due[f.next]), f.batch_id, f.path.name)
                          for f in self._files.values() if f.next < len(f.due)]
            heapq.heapify(self._heap)
        left = self._producer.flush(timeout_s)
        log.info("hold: sent %d overdue rows left by the last run before the first batch%s",
                 len(rows), f" ({left} not yet acknowledged)" if left else "")

    def overdue(self) -> int:
        """Rows due by now that the sending thread has not yet handed to the producer: how far
        behind it is (a burst due at once, sent from one Python thread)."""
        now_ms = int(self._clock() * 1000)
        with self._wake:
            return sum(max(0, int(f.due.searchsorted(now_ms, side="right")) - f.next)
                       for f in self._files.values())

    def pending(self) -> int:
        """Rows spooled and not yet acknowledged."""
        with self._wake:
            return sum(len(f.due) - f.acked for f in self._files.values())

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop releasing, wait for what was sent to be acknowledged, and record for each
        file how far it was sent; the rest is sent by the next start."""
        if self._thread is None:
            self._close()
            return
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=timeout_s)
        self._producer.flush(timeout_s)
        self._complete()
        with self._wake:
            left = list(self._files.values())
        for entry in left:
            acked = entry.acked_prefix()
            if acked:
                sent = pa.table({"sent_ms": pa.array(entry.sent_ms[:acked], pa.int64())})
                write_durably(entry.path.with_name(entry.path.name + ".sent"),
                              functools.partial(_write_arrow, sent))
        if left:
            log.info("hold: %d rows not yet due at the stop stay spooled for the next start",
                     sum(len(f.due) - f.acked for f in left))
        Path(self.handoff_marker).unlink(missing_ok=True)
        self._thread = None
        self._reports.put(None)
        self._reporter.join(timeout=timeout_s)
        self._close()

    def _report(self) -> None:
        while True:
            item = self._reports.get()
            if item is None:
                return
            entries = item
            first = entries[0]
            if self._on_sent is not None:
                parts = [entry.rows.select(list(RELEASED[:-1])).append_column(
                             "sent_ms", pa.array(entry.sent_ms, pa.int64()))
                         .filter(pc.equal(entry.rows.column("kind"), "deliver"))
                         for entry in entries]
                released = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
                try:
                    self._on_sent(first.batch_id, first.batch_time_ms, released)
                except Exception:  # the ledger or a gauge, never a reason to stop sending
                    log.exception("hold: reporting batch %d failed", first.batch_id)
            for entry in entries:
                entry.path.unlink(missing_ok=True)
                entry.path.with_name(entry.path.name + ".sent").unlink(missing_ok=True)

    def _close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    # ---- the sending thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
                now = time.monotonic()
                retry = [f for f in self._files.values() if f.failed and f.retry_at <= now]
                wait = 0.1
                if not retry and self._heap:
                    wait = (self._heap[0][0] - self._clock() * 1000) / 1000
                if not retry and wait > 0:
                    self._wake.wait(min(wait, 0.1))
            self._producer.poll(0)
            self._complete()
            for entry in retry:
                self._resend(entry)
            self._release()

    def _release(self) -> None:
        """Hand every row that is due now to the producer."""
        while True:
            with self._wake:
                if not self._heap or self._stopping:
                    return
                due, batch_id, name = self._heap[0]
                now_ms = int(self._clock() * 1000)
                if due > now_ms:
                    return
                heapq.heappop(self._heap)
                entry = self._files[(batch_id, name)]
            start = entry.next
            end = min(int(entry.due.searchsorted(now_ms, side="right")), start + _STEP_ROWS)
            self._send(entry, range(start, end), now_ms)
            with self._wake:
                entry.next = end
                if end < len(entry.due):
                    heapq.heappush(self._heap, (int(entry.due[end]), batch_id, name))

    def _send(self, entry: _File, indexes, now_ms: int) -> None:
        rows = entry.rows
        if isinstance(indexes, range):
            chunk = rows.slice(indexes.start, len(indexes))
        else:
            chunk = rows.take(pa.array(indexes, pa.int64()))
        topics, partitions, keys, values = (chunk.column(name).to_pylist()
                                            for name in ("topic", "partition", "key", "value"))
        headers = _header_lists(chunk.column("headers"))
        produce, poll, delivered = self._producer.produce, self._producer.poll, self._delivered
        self.sent_by["hold"] += len(indexes)
        for i, topic, partition, key, value, hs in zip(indexes, topics, partitions, keys, values,
                                                       headers):
            entry.sent_ms[i] = now_ms
            callback = functools.partial(delivered, entry, i)
            while True:
                try:
                    if partition is None:
                        produce(topic, value, key, headers=hs, on_delivery=callback)
                    else:
                        produce(topic, value, key, partition=partition, headers=hs,
                                on_delivery=callback)
                    break
                except BufferError:     # the producer's queue is full: let it drain
                    poll(0.05)
        poll(0)

    def _delivered(self, entry: _File, index: int, error, message) -> None:
        if error is None:
            entry.ok[index] = True
            return
        self.last_error = str(error)
        log.warning("hold: %s of batch %d not acknowledged (%s); sending it again",
                    entry.rows.column("uniq_key")[index], entry.batch_id, error)
        with self._wake:
            entry.failed.append(index)
            # Half a second apart (a broker that is down fails every row), without holding up
            # the rows of other files that fall due meanwhile.
            entry.retry_at = time.monotonic() + _RETRY_S

    def _resend(self, entry: _File) -> None:
        with self._wake:
            failed, entry.failed = entry.failed, []
        self._send(entry, failed, int(self._clock() * 1000))

    def _complete(self) -> None:
        """Report and delete the batches all of whose files' rows are acknowledged, in batch
        order (a batch's files are queued together, so they are next to each other)."""
        while True:
            with self._wake:
                if not self._files:
                    return
                batch_id = next(iter(self._files))[0]
                batch = [(key, entry) for key, entry in self._files.items()
                         if key[0] == batch_id]
                if not all(entry.done for _, entry in batch):
                    return
                for key, _ in batch:
                    del self._files[key]
            self._reports.put([entry for _, entry in batch])


def held(folder: Path, uniq_key: str) -> dict | None:
    """The spooled row of a message the driver's hold has not finished with (SPOOLED columns
    but the payload, `sent_ms`: when the batch's tasks sent it, else None; and `batch_id`), or
    None. A file is deleted once all its rows are acknowledged, so a row found here may have
    left moments ago."""
    for path in sorted(Path(folder).glob("*.arrow")) if Path(folder).is_dir() else ():
        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        except (OSError, pa.ArrowInvalid):   # finished and deleted while we looked
            continue
        hit = table.filter(pc.equal(table.column("uniq_key"), uniq_key))
        if hit.num_rows:
            row = hit.drop_columns(["key", "value", "headers"]).slice(0, 1).to_pylist()[0]
            return {"sent_ms": None, **row, "batch_id": DriverHold._batch_of(path)}
    return None


def _header_lists(column: pa.ChunkedArray) -> list[list[tuple[str, bytes]] | None]:
    """Each row's headers as librdkafka takes them, (name, value) pairs, from the flattened
    names and values (a dict per header from `to_pylist` cost more than the send itself)."""
    out: list = []
    for chunk in column.chunks:
        flat = chunk.flatten()
        names = pc.struct_field(flat, "key").to_pylist()
        values = pc.struct_field(flat, "value").to_pylist()
        offsets = (chunk.offsets.to_numpy() - chunk.offsets[0].as_py()).tolist()
        valid = chunk.is_valid().to_pylist()
        pairs = list(zip(names, values))
        out.extend(pairs[offsets[i]:offsets[i + 1]] if valid[i] else None
                   for i in range(len(chunk)))
    return out


def hand_over(marker: str, tables: list[pa.Table]) -> str | None:
    """A task's rows not yet due (tables of SPOOLED columns, in due order), written to the
    hand-off folder of the driver's hold that `marker` names: the file's name, for the task's
    report; None when this task does not see the marker (it runs on another machine, or the
    hold has stopped), and its rows go in its report instead. Named by the micro-batch and the
    task's attempt, so that the driver can delete what attempts Spark did not keep left; not
    synced here, the driver syncs the files it takes before the batch commits."""
    if not os.path.exists(marker):
        return None
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty("streaming.sql.batchId") if context else None
    task = f"{context.partitionId()}.{context.attemptNumber()}" if context else "0.0"
    name = f"{batch if batch is not None else 'x'}-{task}-{uuid.uuid4().hex[:8]}.arrow"
    rows = _spooled(pa.concat_tables(tables))
    folder = os.path.dirname(marker)
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "wb") as f:
        _write_arrow(rows, f)
    os.replace(tmp, os.path.join(folder, name))
    return name


def _spooled(rows: pa.Table) -> pa.Table:
    """Rows to send (SPOOLED columns) in a spool file's layout: in due order, `sent_ms` null."""
    rows = rows.select(list(SPOOLED))
    due = rows.column("due_ms").to_numpy()
    if (due[1:] < due[:-1]).any():   # one task's rows come sorted: no copy then
        rows = rows.take(pc.sort_indices(rows, [("due_ms", "ascending")]))
    rows = rows.append_column("sent_ms", pa.nulls(rows.num_rows, pa.int64()))
    return rows.cast(_SCHEMA)


def _read_arrow(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_arrow(table: pa.Table, f) -> None:
    with pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
