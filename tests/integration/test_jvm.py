"""The Spark JVM runs with the collector settings streaming/session.py gives it."""
from __future__ import annotations


def _vm_option(spark, name: str) -> str:
    jvm = spark._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    return bean.getVMOption(name).getValue()


def test_a_wheel_state_is_no_humongous_object_for_g1(spark):
    """G1 allocates an object of half a region or more as humongous (straight into the old
    generation, a young collection and a concurrent cycle started by it). A wheel group's state
    is about 8 MB at 10,000 msg/s, and Spark's pickle buffer for it grows to twice that."""
    assert _vm_option(spark, "UseG1GC") == "true"
    assert int(_vm_option(spark, "G1HeapRegionSize")) == 32 * 1024 * 1024
