"""`delayq run` and `delayq demo` show delayq's own log lines at the `log_level` setting
(Python's default left them at WARNING, so a dispatch task's restart or the pending gauge's
seed were never shown), and other libraries' only from WARNING."""
import logging
import tomllib
from pathlib import Path

import pytest

from conf.settings import load_settings
from streaming.cli import arguments as cli
@pytest.fixture
def clean_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {p: logging.getLogger(p).level
                                           for p in (*cli.PACKAGES, "kafka")}
    root.handlers = []
    yield
    root.handlers, level, levels = saved
    root.setLevel(level)
    for package, level in levels.items():
        logging.getLogger(package).setLevel(level)


def test_delayqs_info_lines_are_shown_and_other_libraries_only_from_warning(clean_logging, capsys):
    cli.log_to_stderr(load_settings().log_level)
    logging.getLogger("streaming.dispatch.supervisor").info("dispatch task 1 restarted")
    logging.getLogger("streaming.job").info("batch 7 waited 1.2 s")
    logging.getLogger("py4j.clientserver").info("Python Server ready")
    logging.getLogger("py4j.clientserver").warning("answer lost")
    err = capsys.readouterr().err
    assert "INFO streaming.dispatch.supervisor: dispatch task 1 restarted" in err
    assert "INFO streaming.job: batch 7 waited 1.2 s" in err
    assert "Python Server ready" not in err
    assert "WARNING py4j.clientserver: answer lost" in err


def test_kafka_pythons_lines_are_not_shown_and_an_unreachable_broker_is_one_line(clean_logging,
                                                                                 capsys):
    """A broker away for 15 s put 60 lines of kafka-python's and a traceback per progress report
    of the offset mirror's into the job's log, before its own lines; its failures reach delayq
    as exceptions: the mirror says so once, and once when it commits again."""
    from streaming.spark.listener import OffsetMirror

    cli.log_to_stderr(load_settings().log_level)
    logging.getLogger("kafka.net.manager").info("Attempting bootstrap")
    logging.getLogger("kafka.cluster").warning("No node available for metadata refresh")
    logging.getLogger("kafka.net.connection").error("Connection lost: 111 ECONNREFUSED")
    broker_away, committed = True, []

    def commit(offsets):
        if broker_away:
            raise ConnectionError("111 ECONNREFUSED")
        committed.append(offsets)

    mirror = OffsetMirror("intake", commit)
    for end in (5, 6, 7):
        mirror({"sources": [{"endOffset": {"intake": {"0": end}}}]})
    broker_away = False
    mirror({"sources": [{"endOffset": {"intake": {"0": 7}}}]})   # the same end: committed now
    assert committed == [{0: 7}]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "WARNING streaming.spark.listener: could not commit the intake's offsets to its consumer "
        "group (ConnectionError: 111 ECONNREFUSED); retrying with the next progress report",
        "INFO streaming.spark.listener: the intake's offsets are committed to its consumer group "
        "again"]


def test_the_setting_quiets_delayqs_lines(clean_logging, capsys, monkeypatch):
    monkeypatch.setenv("DELAYQ_LOG_LEVEL", "WARNING")
    cli.log_to_stderr(load_settings().log_level)
    logging.getLogger("streaming.job").info("batch 7 waited 1.2 s")
    logging.getLogger("streaming.job").warning("restarting the query")
    err = capsys.readouterr().err
    assert "batch 7" not in err and "restarting the query" in err


def test_every_package_of_the_project_takes_the_level():
    pyproject = tomllib.loads((Path(cli.__file__).parents[2] / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    # A subpackage's loggers are its package's children: they take its level.
    assert sorted(cli.PACKAGES) == sorted({p.split(".")[0] for p in packages})


def test_a_start_no_broker_answers_says_so_in_one_line_and_exits_non_zero(tmp_path):
    """Before Spark is built (no JVM here): the broker, the client's error and what to check,
    without a traceback or kafka-python's line per failed try."""
    import os
    import subprocess
    import sys

    from tests.support import free_ports

    (port,) = free_ports(1)   # nothing listens there
    env = {**os.environ, "DELAYQ_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
           "DELAYQ_CONNECT_TIMEOUT": "2s", "DELAYQ_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "streaming.cli.main", "run"], env=env,
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(cli.__file__).parents[2])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"delayq: no Kafka broker answers at 127.0.0.1:{port}")
    assert "DELAYQ_BOOTSTRAP_SERVERS" in lines[0]


def test_librdkafkas_own_lines_are_delayqs_and_what_it_retries_is_debug(clean_logging, capsys):
    from streaming.kafka.config import ClientLog

    cli.log_to_stderr("INFO")
    client = ClientLog()   # as confluent-kafka calls it: level, format, facility, client, text
    client.log(logging.WARNING, "%s [%s] %s", "GETPID", "rdkafka#producer-2",
               "Failed to acquire transactional PID from broker: Not coordinator: retrying")
    client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
    client.log(logging.ERROR, "%s [%s] %s", "SASL", "rdkafka#producer-1", "Authentication failed")
    err = capsys.readouterr().err
    assert "GETPID" not in err and "Connection refused" not in err, err
    assert "ERROR streaming.kafka.client: SASL [rdkafka#producer-1] Authentication failed" in err
