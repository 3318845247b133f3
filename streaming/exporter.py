"""The Prometheus endpoint of the driver: delayq's metrics on settings.metrics_host:port."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pyspark
from prometheus_client import CollectorRegistry, start_http_server

from conf.settings import Settings
from sinks.metrics import Metrics


def build_metrics() -> Metrics:
    try:
        own = version("delayq")
    except PackageNotFoundError:
        own = "0+unknown"
    return Metrics(CollectorRegistry(), version=own, spark_version=pyspark.__version__)


def serve(settings: Settings, metrics: Metrics):
    """Start the HTTP endpoint; returns (server, thread)."""
    return start_http_server(settings.metrics_port, addr=settings.metrics_host,
                             registry=metrics.registry)
