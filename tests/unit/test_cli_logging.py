"""`delayq run` and `delayq demo` show delayq's own log lines at the `log_level` setting
(Python's default left them at WARNING, so a dispatch task's restart or the pending gauge's
seed were never shown), and other libraries' only from WARNING."""
import logging
import tomllib
from pathlib import Path

import pytest

from conf.settings import load_settings
from streaming import arguments as cli


@pytest.fixture
def clean_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {p: logging.getLogger(p).level for p in cli.PACKAGES}
    root.handlers = []
    yield
    root.handlers, level, levels = saved
    root.setLevel(level)
    for package, level in levels.items():
        logging.getLogger(package).setLevel(level)


def test_delayqs_info_lines_are_shown_and_other_libraries_only_from_warning(clean_logging, capsys):
    cli.log_to_stderr(load_settings().log_level)
    logging.getLogger("streaming.dispatcher").info("dispatch task 1 restarted")
    logging.getLogger("streaming.job").info("batch 7 waited 1.2 s")
    logging.getLogger("kafka.net.manager").info("Attempting bootstrap")
    logging.getLogger("kafka.net.manager").warning("broker gone")
    err = capsys.readouterr().err
    assert "INFO streaming.dispatcher: dispatch task 1 restarted" in err
    assert "INFO streaming.job: batch 7 waited 1.2 s" in err
    assert "Attempting bootstrap" not in err
    assert "WARNING kafka.net.manager: broker gone" in err


def test_the_setting_quiets_delayqs_lines(clean_logging, capsys, monkeypatch):
    monkeypatch.setenv("DELAYQ_LOG_LEVEL", "WARNING")
    cli.log_to_stderr(load_settings().log_level)
    logging.getLogger("streaming.job").info("batch 7 waited 1.2 s")
    logging.getLogger("streaming.job").warning("restarting the query")
    err = capsys.readouterr().err
    assert "batch 7" not in err and "restarting the query" in err


def test_every_package_of_the_project_takes_the_level():
    pyproject = tomllib.loads((Path(cli.__file__).parents[1] / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    # A subpackage's loggers are its package's children: they take its level.
    assert sorted(cli.PACKAGES) == sorted({p.split(".")[0] for p in packages})
