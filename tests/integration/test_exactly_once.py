"""delivery = "exactly_once" (streaming/dispatch/txn.py): a dispatch task's sends and ledger rows in
one transaction, on the real broker; what a read_committed reader sees after a kill and a task
that was paused while another took its place (a refusal: tests/integration/test_dispatch.py)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import replace

import pytest

from streaming.ledger.records import ledger_rows
from tests.integration.test_dispatch import (_run, dispatch, in_thread, stop,  # noqa: F401
                                              transactional)
from tests.support import consume_all, header_map


@pytest.fixture
def exactly(dispatch):  # noqa: F811
    config, write = dispatch
    return transactional(config), write


def keys(records) -> list[str]:
    return sorted(header_map(r)["UNIQ_KEY"].decode() for r in records)


def committed(bootstrap: str, topic: str, expected: int, idle_s: float = 2.0) -> list:
    return consume_all(bootstrap, topic, expected=expected, timeout_s=60, idle_s=idle_s,
                       committed=True)


def ledger_keys(bootstrap: str, topic: str, expected: int) -> list[str]:
    flat = lambda records: [row["uniq_key"] for r in records if r.value
                            for row in ledger_rows(r.value).to_pylist()]
    return sorted(flat(consume_all(bootstrap, topic, expected=10**9, timeout_s=60, idle_s=2,
                                   committed=True, done=lambda got: len(flat(got)) >= expected)))


def in_process(config) -> multiprocessing.Process:
    task = multiprocessing.get_context("spawn").Process(target=_run, args=(config,))
    task.start()
    return task


def test_a_task_killed_in_and_between_transactions_delivers_each_message_once_to_read_committed(
        exactly, kafka_bootstrap):
    """Run 1 sends the prompt rows and is killed before it commits: its transaction is aborted
    when run 2 starts, which sends them again, commits, and is killed while the held rows keep
    the commit point below the prompt ones; run 3 skips those by the ledger and sends the held
    ones. A read_committed reader sees each message once; a read_uncommitted one also sees run
    1's aborted copies, with the same UNIQ_KEY."""
    config, write = exactly
    now = int(time.time() * 1000)
    held = [{"uniq": f"h{i}", "due": now + 20_000} for i in range(10)]
    prompt = [{"uniq": f"p{i}", "due": now} for i in range(300)]
    write(held + prompt)
    first = in_process(replace(config, commit_interval_s=600))   # commits nothing
    consume_all(kafka_bootstrap, config.real, expected=300, timeout_s=60, committed=False)
    assert consume_all(kafka_bootstrap, config.real, expected=1, timeout_s=2, committed=True) == []
    first.kill()
    first.join(30)
    second = in_process(config)
    assert keys(committed(kafka_bootstrap, config.real, expected=300, idle_s=0)) == \
        sorted(r["uniq"] for r in prompt)
    second.kill()
    second.join(30)
    assert int(time.time() * 1000) < now + 20_000, "the held rows were due before the kill"
    thread, result = in_thread(config)
    delivered = committed(kafka_bootstrap, config.real, expected=310, idle_s=3)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert keys(delivered) == sorted(r["uniq"] for r in held + prompt), "once each, none lost"
    assert all(int(header_map(r)["DELIVER_MS"]) <= r.timestamp for r in delivered), "none early"
    assert result == [{"partition": 0, "sent": 10, "dead": 0, "skipped": 300}]
    everything = consume_all(kafka_bootstrap, config.real, expected=610, timeout_s=30, idle_s=2,
                             committed=False)
    assert keys(everything) == sorted([r["uniq"] for r in held + prompt] +
                                      [r["uniq"] for r in prompt])
    assert ledger_keys(kafka_bootstrap, config.ledger_topic, 310) == keys(delivered)


def test_a_paused_task_is_fenced_by_its_replacement_and_nothing_is_seen_twice(
        exactly, kafka_bootstrap):
    """Task 1 sends and is paused (SIGSTOP) before it commits; task 2 takes the partition (the
    same transactional.id), which aborts task 1's transaction, and sends everything itself.
    Resumed, task 1 reads the rows written next and is refused as fenced: it ends with an
    error, and a read_committed reader sees every message once, from task 2."""
    config, write = exactly
    now = int(time.time() * 1000)
    first_rows = [{"uniq": f"a{i}", "due": now} for i in range(200)]
    write(first_rows)
    zombie = in_process(replace(config, commit_interval_s=600))
    consume_all(kafka_bootstrap, config.real, expected=200, timeout_s=60, committed=False)
    os.kill(zombie.pid, signal.SIGSTOP)
    thread, result = in_thread(config)
    committed(kafka_bootstrap, config.real, expected=200, idle_s=0)
    os.kill(zombie.pid, signal.SIGCONT)
    later = [{"uniq": f"b{i}", "due": int(time.time() * 1000)} for i in range(50)]
    write(later)
    zombie.join(60)
    assert zombie.exitcode not in (0, None), "the fenced task ended with an error"
    delivered = committed(kafka_bootstrap, config.real, expected=250)
    stop(config, kafka_bootstrap)
    thread.join(60)
    assert keys(delivered) == sorted(r["uniq"] for r in first_rows + later)
    assert result == [{"partition": 0, "sent": 250, "dead": 0, "skipped": 0}]
