"""state/compat.py's patch of the workers' per-task re-read of zip archives (no JVM)."""
import zipfile
import zipimport

import pytest

import state.compat  # noqa: F401  (the patches, as every worker has them)


def archive(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        for module in modules:
            z.writestr(f"{module}.py", "x = 1\n")


@pytest.mark.parametrize("name, reread", [
    ("pyspark.zip", False), ("py4j-0.10.9.9-src.zip", False), ("spark-core_2.13-4.1.1.jar", False),
    ("shipped.zip", True),   # a zip given to addPyFile may change: it is still read again
])
def test_only_spark_s_own_archives_skip_the_re_read_at_each_task(tmp_path, name, reread):
    path = tmp_path / name
    archive(path, ["a"])
    importer = zipimport.zipimporter(str(path))
    archive(path, ["a", "b"])
    importer.invalidate_caches()   # what PySpark's worker calls at the start of every task
    assert (importer.find_spec("b") is not None) is reread
