"""A work-around for a defect of the pinned PySpark, patched once in every Python worker: each
imports state/wheel.py (the parse as it is unpickled, the wheel's processor at its first call),
which imports this module.

PySpark's worker invalidates the import caches every task (worker_util.setup_spark_files), so on
Python 3.10+ every zip on sys.path re-reads its directory; Spark's own archives never change under
a worker, so they skip it (the re-reads were most of an idle worker's time and 27-30% of the
workers' CPU under load); addPyFile's zips are still re-read. Remove when PySpark stops doing so.
"""
from __future__ import annotations

import os
import zipimport

_original = zipimport.zipimporter.invalidate_caches


def _invalidate_caches(self):
    name = os.path.basename(getattr(self, "archive", ""))
    if name.endswith(".jar") or name == "pyspark.zip" or (
            name.startswith("py4j-") and name.endswith(".zip")):
        return
    _original(self)


zipimport.zipimporter.invalidate_caches = _invalidate_caches
