"""The checkpoint guard: a missing, unreadable or differently configured checkpoint is refused
with its reason, never silently reset."""
from __future__ import annotations

import json
import os

import pytest

from conf import load_settings
from state.columns import STATE_FORMAT
from streaming.wheel.checkpoint import (STAMP, CheckpointError, check, direct_was_on, seal_of,
                                        spark_line, started_ms, write_stamp)

SETTINGS = load_settings(bootstrap_servers="127.0.0.1:1", intake_topic="intake",
                         delay_levels="1s 2s 3s")


def spark_checkpoint(path, batches=2):
    """The files Spark writes for a query that committed `batches` batches."""
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    (path / "metadata").write_text(json.dumps({"id": "8c0c6b6e-3b4f-4f43-9a59-3c5c3a1d7c11"}) + "\n")
    for n in range(batches):
        (path / "offsets" / str(n)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"intake":{"0":%d}}\n' % n)
        (path / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(path)


def test_a_new_checkpoint_on_a_new_intake_starts_fresh(tmp_path):
    assert check(SETTINGS, str(tmp_path / "ckpt"), lambda: {}) == "fresh"


def test_a_lost_checkpoint_is_refused_while_the_group_shows_an_earlier_run(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing or empty.*0:42.*allow-fresh-checkpoint"):
        check(SETTINGS, str(tmp_path / "ckpt"), lambda: {0: 42})
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="missing or empty"):
        check(SETTINGS, str(tmp_path / "empty"), lambda: {0: 42})
    assert check(SETTINGS, str(tmp_path / "ckpt"), lambda: {0: 42}, allow_fresh=True) == "fresh"


def test_the_group_is_asked_only_for_a_missing_checkpoint_and_its_refusal_stops_the_start(
        tmp_path):
    def unreadable():
        raise CheckpointError("consumer group delayq.x could not be read")

    with pytest.raises(CheckpointError, match="could not be read"):
        check(SETTINGS, str(tmp_path / "ckpt"), unreadable)
    assert check(SETTINGS, str(tmp_path / "ckpt"), unreadable, allow_fresh=True) == "fresh"
    ckpt = spark_checkpoint(tmp_path / "kept")
    write_stamp(SETTINGS, ckpt)
    assert check(SETTINGS, ckpt, unreadable) == "resume"


def test_an_existing_checkpoint_resumes_under_the_same_settings(tmp_path):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    write_stamp(SETTINGS, ckpt)
    assert check(SETTINGS, ckpt, lambda: {0: 1}) == "resume"


def test_the_checkpoint_s_first_start_is_kept_across_restarts(tmp_path):
    """Level messages due before it pass through without state, which keeps due order only if
    the moment is the checkpoint's first start, for every run on that checkpoint."""
    ckpt = str(tmp_path / "ckpt")
    first = started_ms(ckpt, check(SETTINGS, ckpt, lambda: {}), now_ms=1_000)
    assert first == 1_000, "a fresh checkpoint starts now"
    write_stamp(SETTINGS, ckpt, first)
    spark_checkpoint(tmp_path / "ckpt")
    assert started_ms(ckpt, check(SETTINGS, ckpt, lambda: {0: 1}), now_ms=9_000) == 1_000, \
        "a resumed one keeps its first start"
    stamp = json.loads((tmp_path / "ckpt" / STAMP).read_text())
    del stamp["started_ms"]
    (tmp_path / "ckpt" / STAMP).write_text(json.dumps(stamp))
    assert started_ms(ckpt, "resume", now_ms=9_000) == 0, \
        "stamped before the moment was kept: nothing passes"
    (tmp_path / "ckpt" / STAMP).write_text("{torn")
    with pytest.raises(CheckpointError, match="unreadable"):
        started_ms(ckpt, "resume", now_ms=9_000)


def test_a_checkpoint_written_with_other_settings_is_refused(tmp_path):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    write_stamp(SETTINGS, ckpt)
    moved = load_settings(**{**SETTINGS.model_dump(), "delay_levels": "1s 5s 10s",
                             "slot_ms": 500})
    with pytest.raises(CheckpointError) as err:
        check(moved, ckpt, {0: 1})
    assert "level_delays_ms: [1000, 2000, 3000] in the checkpoint, [1000, 5000, 10000] now" in str(err.value)
    assert "slot_ms: 1000 in the checkpoint, 500 now" in str(err.value)
    assert check(moved, ckpt, {0: 1}, allow_config_change=True) == "resume"


def test_a_checkpoint_with_wheel_state_of_another_format_is_refused(tmp_path):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    stamp = tmp_path / "ckpt" / "delayq.json"
    write_stamp(SETTINGS, ckpt)
    assert json.loads(stamp.read_text())["state_format"] == STATE_FORMAT
    old = json.loads(stamp.read_text())
    del old["state_format"]  # stamps written before the format was recorded: format 1
    stamp.write_text(json.dumps(old))
    with pytest.raises(CheckpointError, match=rf"wheel state in format 1; this delayq reads "
                                              rf"format {STATE_FORMAT}\. Let that checkpoint drain"):
        check(SETTINGS, ckpt, lambda: {0: 1}, allow_config_change=True)


@pytest.mark.parametrize("was", [4, 5])
def test_a_checkpoint_of_an_earlier_wheel_is_refused_not_handed_to_spark(tmp_path, was):
    """Format 5 held whole messages in transformWithState's state, format 4 under either
    operator: none is read by this wheel's applyInPandasWithState over references."""
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    stamp = tmp_path / "ckpt" / "delayq.json"
    write_stamp(SETTINGS, ckpt)
    old = {**json.loads(stamp.read_text()), "state_format": was}
    stamp.write_text(json.dumps(old))
    with pytest.raises(CheckpointError, match=rf"wheel state in format {was}; .*Let that "
                                              rf"checkpoint drain .*delayq_pending_messages is 0"):
        check(SETTINGS, ckpt, lambda: {0: 1})


def test_wheel_state_without_a_stamp_is_refused(tmp_path):
    """State from before stamps were written: its format is unknown, so it is not read."""
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "state" / "0").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"wheel state in format 1; .*Let that checkpoint"):
        check(SETTINGS, ckpt, lambda: {0: 1}, allow_config_change=True)


def test_a_checkpoint_of_another_spark_line_is_refused_with_how_to_drain_it(tmp_path):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    stamp = tmp_path / "ckpt" / "delayq.json"
    write_stamp(SETTINGS, ckpt)
    assert json.loads(stamp.read_text())["spark"] == spark_line()
    assert check(SETTINGS, ckpt, lambda: {0: 1}) == "resume"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "spark": "4.1"}))
    with pytest.raises(CheckpointError, match=rf"written on Spark 4\.1; this delayq runs Spark "
                                              rf"{spark_line()}.*Let that checkpoint drain"):
        check(SETTINGS, ckpt, lambda: {0: 1}, allow_config_change=True)


@pytest.mark.parametrize("damage", ["offsets", "commits", "metadata"])
def test_a_torn_checkpoint_is_refused(tmp_path, damage):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    target = {"offsets": tmp_path / "ckpt" / "offsets" / "1",
              "commits": tmp_path / "ckpt" / "commits" / "1",
              "metadata": tmp_path / "ckpt" / "metadata"}[damage]
    target.write_bytes(b"\x00\x00garbage{")
    with pytest.raises(CheckpointError, match="unreadable"):
        check(SETTINGS, ckpt, lambda: {})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_checkpoint_without_access_is_refused(tmp_path):
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    os.chmod(tmp_path / "ckpt" / "offsets", 0)
    try:
        with pytest.raises(CheckpointError, match="no read/write access"):
            check(SETTINGS, ckpt, lambda: {})
    finally:
        os.chmod(tmp_path / "ckpt" / "offsets", 0o755)


def test_a_checkpoint_that_is_not_a_folder_is_refused(tmp_path):
    (tmp_path / "ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a folder"):
        check(SETTINGS, str(tmp_path / "ckpt"), lambda: {0: 1})


def test_an_uncommitted_intake_partition_starts_at_the_wheel_only_where_the_wheel_had_it(tmp_path):
    """`direct_was_on`: a checkpoint whose earlier runs sent every level through the wheel (no
    stamp value, or -1) hands the dispatch tasks the wheel's position; one that already had the
    short levels around the wheel, or a fresh one, does not."""
    ckpt = spark_checkpoint(tmp_path / "ckpt")
    assert not direct_was_on(ckpt, "resume")   # no stamp yet
    write_stamp(SETTINGS.model_copy(update={"dispatch_direct_max_delay_ms": -1}), ckpt)
    assert not direct_was_on(ckpt, "resume")
    write_stamp(SETTINGS, ckpt)
    assert SETTINGS.dispatch_direct_max_delay_ms >= 0
    assert direct_was_on(ckpt, "resume") and not direct_was_on(ckpt, "fresh")
    stamp = json.loads((tmp_path / "ckpt" / STAMP).read_text())
    del stamp["settings"]["dispatch_direct_max_delay_ms"]   # written before the setting existed
    (tmp_path / "ckpt" / STAMP).write_text(json.dumps(stamp))
    assert not direct_was_on(ckpt, "resume")


def test_the_seal_key_is_made_once_and_kept_and_an_older_checkpoint_honours_what_it_wrote(
        tmp_path):
    """A new checkpoint gets a new key; later starts keep the stamp's; a checkpoint an older
    delayq stamped without one gets a key and the intake's end offsets at that start, kept too."""
    fresh = str(tmp_path / "fresh")
    key, before = seal_of(fresh, "fresh", lambda: pytest.fail("not asked"))
    assert len(key) == 64 and before == ()
    write_stamp(SETTINGS, spark_checkpoint(tmp_path / "fresh"), 1, (key, before))
    assert seal_of(fresh, "resume", lambda: pytest.fail("not asked")) == (key, ())
    older = spark_checkpoint(tmp_path / "older")
    write_stamp(SETTINGS, older, 1)   # as an older delayq wrote it: no key
    stamp = json.loads((tmp_path / "older" / STAMP).read_text())
    (tmp_path / "older" / STAMP).write_text(json.dumps(
        {k: v for k, v in stamp.items() if k not in ("seal_key", "legacy_before")}))
    upgraded = seal_of(older, "resume", lambda: {0: 7, 2: 9})
    assert upgraded[0] != key and upgraded[1] == (7, 0, 9)
    write_stamp(SETTINGS, older, 1, upgraded)
    assert seal_of(older, "resume", lambda: pytest.fail("not asked")) == upgraded
