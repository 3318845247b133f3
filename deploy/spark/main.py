"""The job's main file for spark-submit (`delayq submit` passes it): `delayq run` under the
session spark-submit prepared. Arguments after the file go to `delayq run`.

The driver imports the project from the folder this file lives in (a checkout, or /opt/delayq
in the image), where conf/ holds the defaults and the log4j and metrics files the JVM reads;
executors import the same code from the zip shipped with --py-files."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if (ROOT / "conf" / "defaults.toml").is_file():
    sys.path.insert(0, str(ROOT))

import streaming.cli.main  # noqa: E402

sys.exit(streaming.cli.main.main(["run", *sys.argv[1:]]))
