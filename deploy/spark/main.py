"""The job's main file for spark-submit (`delayq submit` passes it): `delayq run` under the
session spark-submit prepared. Arguments after the file go to `delayq run`."""
import sys
from pathlib import Path

try:
    import streaming.cli  # installed (a container image) or shipped with --py-files
except ImportError:  # run from a checkout: the project root is two folders up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import streaming.cli

sys.exit(streaming.cli.main(["run", *sys.argv[1:]]))
