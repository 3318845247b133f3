"""The wheel's Python never sees a body (DESIGN.md section 4): its parse gets each intake record's
position, append time and control headers, its stateful function the index envelope; the
message itself is read back by the dispatch task and arrives whole."""
from __future__ import annotations

import json

import streaming.wheel.query as wheel_query
from streaming.producer import DelayProducer
from tests.integration.conftest import Sent
from tests.support import check_deliveries, consume_all

LOG_APPEND = {"message_timestamp_type": "LogAppendTime"}


def test_the_wheel_s_python_receives_no_key_no_value_and_no_user_header(
        job_settings, start_job, new_topic, kafka_bootstrap, work_dir, monkeypatch):
    seen = work_dir / f"wheel-columns-{new_topic()}"
    seen.mkdir()
    parser, wheel = wheel_query.make_parser, wheel_query.make_wheel

    def recording_parser(*args, **kwargs):
        parse = parser(*args, **kwargs)

        def recorded(batches):   # runs in a Python worker: what it got, to a file
            for batch in batches:
                (seen / "parse.json").write_text(json.dumps({
                    "columns": batch.schema.names,
                    "headers": sorted({h["key"] for hs in batch.column("headers").to_pylist()
                                       for h in hs or []})}))
                yield from parse(iter([batch]))
        return recorded

    def recording_wheel(config):
        turn = wheel(config)

        def recorded(key, frames, state):
            frames = list(frames)
            if frames:
                (seen / f"wheel-{key[0]}.json").write_text(json.dumps(list(frames[0].columns)))
            yield from turn(key, iter(frames), state)
        return recorded

    monkeypatch.setattr(wheel_query, "make_parser", recording_parser)
    monkeypatch.setattr(wheel_query, "make_wheel", recording_wheel)
    settings = job_settings()
    real = new_topic(**LOG_APPEND)
    start_job(settings)
    sent = {}
    with DelayProducer(settings) as producer:
        handle = producer.send(real, b"the body", key=b"the key", level=2,
                               headers=[("user-header", b"secret")])
        sent[handle.uniq_key] = Sent(b"the key", b"the body", [("user-header", b"secret")],
                                     handle.due_ms)
    check_deliveries(consume_all(kafka_bootstrap, real, expected=1, timeout_s=60), sent)

    parse = json.loads((seen / "parse.json").read_text())
    assert parse["columns"] == ["ipart", "ioff", "append_ms", "headers"]
    assert "user-header" not in parse["headers"]
    held = json.loads((seen / "wheel-2.json").read_text())
    assert not {"key", "value", "hkeys", "hvals", "headers"} & set(held), held
    assert {"ipart", "ioff", "append_ms", "due_ms", "uniq_key"} <= set(held)
