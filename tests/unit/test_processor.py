"""The processor's state calls (state/processor.py), through tests/unit/test_wheel.py's stand-in
of its handle (no JVM). The real operator is run by tests/integration/test_delivery.py."""
import pandas as pd
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from state.processor import WheelProcessor
from state.wheel import decode_chunks

from tests.support import fresh_python
from tests.unit.test_wheel import CONFIG, NOW, Handle, envelopes, timers


def processor():
    handle = Handle()
    proc = WheelProcessor(CONFIG)
    proc.init(handle)
    return proc, handle


def rows_of(frames):
    out = pd.concat(list(frames), ignore_index=True)
    return out[out["kind"] != "tally"].reset_index(drop=True)


def watermark(real_ms):
    return TimerValues(currentWatermarkInMs=real_ms - CONFIG.watermark_delay_ms)


def test_a_later_batch_for_a_held_group_appends_one_element_and_moves_the_one_timer():
    proc, handle = processor()
    assert rows_of(proc.handleInputRows((-1, 0), iter([timers(("a", NOW + 30_000))]),
                                        watermark(NOW))).empty
    assert handle.chunks.calls == ["put"]
    first_timer = handle.meta.value[2]
    assert handle.timers == {first_timer}
    out = rows_of(proc.handleInputRows(
        (-1, 0), iter([timers(("b", NOW + 20_000), ("c", NOW + 100), first_offset=2)]),
        watermark(NOW)))
    assert list(out["uniq_key"]) == ["c"], "due within the lead: leaves at once"
    assert handle.chunks.calls == ["put", "append"], "the held chunk is not read or rewritten"
    count, earliest, timer = handle.meta.value
    assert (count, earliest) == (2, NOW + 20_000)
    assert timer + CONFIG.watermark_delay_ms == NOW + 20_000 - CONFIG.lead_for(2, -1)
    assert handle.timers == {timer}, "the earlier timer replaced the later one"


def test_an_expired_timer_releases_every_chunk_and_clears_the_group():
    proc, handle = processor()
    list(proc.handleInputRows((-1, 0), iter([timers(("a", NOW + 30_000))]), watermark(NOW)))
    list(proc.handleInputRows((-1, 0), iter([timers(("b", NOW + 40_000), first_offset=2)]),
                              watermark(NOW)))
    timer = handle.meta.value[2]
    handle.timers.remove(timer)   # Spark drops an expired timer before it calls the processor
    later = NOW + 45_000
    out = rows_of(proc.handleExpiredTimer((-1, 0), watermark(later), ExpiredTimerInfo(timer)))
    assert sorted(out["uniq_key"]) == ["a", "b"] and set(out["kind"]) == {"deliver"}
    assert handle.meta.value is None and handle.chunks.rows == [] and handle.timers == set()


def test_an_expired_timer_with_messages_beyond_the_horizon_keeps_them_as_one_chunk():
    proc, handle = processor()
    list(proc.handleInputRows((-1, 0), iter([timers(("a", NOW + 30_000))]), watermark(NOW)))
    list(proc.handleInputRows((-1, 0), iter([timers(("b", NOW + 90_000), first_offset=2)]),
                              watermark(NOW)))
    assert len(handle.chunks.rows) == 2
    timer = handle.meta.value[2]
    handle.timers.remove(timer)
    later = NOW + 30_000
    out = rows_of(proc.handleExpiredTimer((-1, 0), watermark(later), ExpiredTimerInfo(timer)))
    assert list(out["uniq_key"]) == ["a"]
    assert len(handle.chunks.rows) == 1
    assert decode_chunks([handle.chunks.rows[0][0]]).column("uniq_key").to_pylist() == ["b"]
    count, earliest, new_timer = handle.meta.value
    assert (count, earliest) == (1, NOW + 90_000) and handle.timers == {new_timer}


def test_a_cancel_reads_the_whole_group_and_writes_back_one_chunk():
    proc, handle = processor()
    list(proc.handleInputRows((-1, 0), iter([timers(("a", NOW + 30_000))]), watermark(NOW)))
    list(proc.handleInputRows((-1, 0), iter([timers(("b", NOW + 40_000), first_offset=2)]),
                              watermark(NOW)))
    cancel = envelopes(([("TIMER_DEL_UNIQKEY", b"a"),
                         ("TIMER_DELIVER_MS", str(NOW + 30_000).encode())], 9))
    cancel["bucket"], cancel["slot"] = -1, 0
    out = rows_of(proc.handleInputRows((-1, 0), iter([cancel]), watermark(NOW)))
    assert list(zip(out["kind"], out["uniq_key"])) == [("cancelled", "a")]
    assert handle.chunks.calls[-1] == "put" and len(handle.chunks.rows) == 1
    assert decode_chunks([handle.chunks.rows[0][0]]).column("uniq_key").to_pylist() == ["b"]
    assert handle.meta.value[:2] == (1, NOW + 40_000) and len(handle.timers) == 1


def test_pass_through_groups_keep_no_state():
    proc, handle = processor()
    frame = envelopes(([("REAL_TOPIC", b"t"), ("UNIQ_KEY", b"now")], 1))
    key = (int(frame["bucket"].iloc[0]), int(frame["slot"].iloc[0]))
    out = rows_of(proc.handleInputRows(key, iter([frame]), watermark(NOW)))
    assert list(out["uniq_key"]) == ["now"]
    assert handle.meta.writes == 0 and handle.chunks.calls == [] and handle.timers == set()


def test_the_processor_s_module_imports_neither_pandas_nor_pyarrow():
    """Spark plans a transformWithStateInPandas query by unpickling the processor in a Python
    process of its own on the driver; the wheel's imports there made every start's planning
    slower (state/groups.py)."""
    probe = ("import state.processor\n"
             "print(sorted(m for m in ('pandas', 'pyarrow', 'state.wheel') if m in sys.modules))")
    assert fresh_python(probe) == "[]"
