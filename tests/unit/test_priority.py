"""A dispatch task lowers the JVM above its Python worker, never itself (priority.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from streaming.dispatch.priority import lower_jvm

ROOT = Path(__file__).resolve().parents[2]


def test_the_nearest_java_ancestor_is_lowered_and_the_worker_is_not(tmp_path):
    # A process named java (as Linux names a script: its file's name) whose child's child calls
    # lower_jvm, as a PySpark worker under its daemon under the executor.
    worker = "import os; from streaming.dispatch.priority import lower_jvm; " \
             "print(lower_jvm(7), os.nice(0))"
    daemon = f"import os, subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"
    java = tmp_path / "java"
    java.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        "{sys.executable}" -c "import os; {daemon}" &
        wait
        cat /proc/$$/stat
        """))
    java.chmod(0o755)
    out = subprocess.run([str(java)], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split("\n")
    pid, own_nice = map(int, out[0].split())
    stat = out[1].rsplit(")", 1)[1].split()
    assert pid == int(out[1].split()[0])
    assert int(stat[16]) == max(7, os.getpriority(os.PRIO_PROCESS, 0))   # read by the script
    assert own_nice == os.getpriority(os.PRIO_PROCESS, 0), "the caller's own left as it was"


def test_without_a_jvm_above_nothing_is_lowered():
    own = os.getpriority(os.PRIO_PROCESS, 0)   # a suite started under `nice` runs above 0
    assert lower_jvm(own + 5) == 0
    assert os.getpriority(os.PRIO_PROCESS, 0) == own
    assert lower_jvm(0) == 0
