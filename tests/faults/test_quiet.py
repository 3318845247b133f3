"""A healthy run says only what delayq says: `delayq run` on the embedded broker, started on
a fresh data folder, delivering, and stopped by SIGTERM, prints its own lines and nothing from
Spark, the JVM, PySpark's workers or the Kafka clients (expected notices are silenced at their
source: conf/log4j2.properties, client options, streaming/spark/session.py quiet_jvm_output)."""
from __future__ import annotations

import re

from streaming.kafka.admin import admin_client, create_topic
from streaming.producer import DelayProducer
from tests.support import consume_all, free_ports

# delayq's own lines: its loggers (streaming/cli/arguments.py log_to_stderr) and its prints.
OURS = re.compile(
    r"^(\d\d:\d\d:\d\d (DEBUG|INFO|WARNING) (conf|state|sinks|streaming)\.|delayq[ :])")


def test_a_clean_start_run_and_stop_print_only_delayq_lines(job_process, kafka_bootstrap):
    ui, metrics = free_ports(2)
    job, settings = job_process(spark_ui_port=ui, metrics_port=metrics)
    admin = admin_client(settings)
    real = f"real-{settings.intake_topic}"
    create_topic(admin, real, 1)
    admin.close()
    job.start()
    with DelayProducer(settings) as producer:
        for i in range(5):
            producer.send(real, f"m{i}".encode(), level=1 + i % 3)
        producer.send(real, b"now", level=0)
    assert len(consume_all(kafka_bootstrap, real, expected=6, timeout_s=60)) == 6
    job.stop()
    assert job.proc.returncode == 0, job.log.read_text(errors="replace")[-3000:]
    lines = [line for line in job.log.read_text(errors="replace").splitlines()
             if line.strip() and not line.startswith("==== start")]
    assert any(line.startswith("delayq stopped") for line in lines), lines[-20:]
    foreign = [line for line in lines if not OURS.match(line)]
    assert not foreign, ("lines a healthy run should not print:\n" + "\n".join(foreign[:40])
                         + "\n\nin:\n" + "\n".join(lines[-30:]))
    [running] = [line for line in lines if line.startswith("delayq running")]
    assert re.search(rf"Spark UI http://[\w.]+:{ui}\.", running), running
