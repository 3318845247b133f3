"""Kafka client settings, one source for every client: kafka-python, librdkafka and Spark's
Kafka source and sink."""
from __future__ import annotations

import logging

from conf.settings import Settings

_JAAS_MODULE = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def python_client_config(settings: Settings) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap_servers": settings.bootstrap.split(","),
                                 "security_protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL"):
        config.update(sasl_mechanism=settings.sasl_mechanism,
                      sasl_plain_username=settings.sasl_username,
                      sasl_plain_password=settings.sasl_password.get_secret_value())
    if settings.ssl_cafile:
        config["ssl_cafile"] = settings.ssl_cafile
    return config


def spark_options(settings: Settings) -> dict[str, str]:
    options = {"kafka.bootstrap.servers": settings.bootstrap,
               "kafka.security.protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL"):
        user = settings.sasl_username.replace('"', '\\"')
        password = settings.sasl_password.get_secret_value().replace('"', '\\"')
        options["kafka.sasl.mechanism"] = settings.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (f'{_JAAS_MODULE[settings.sasl_mechanism]} required '
                                             f'username="{user}" password="{password}";')
    if settings.ssl_cafile:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = settings.ssl_cafile
    return options


class ClientLog:
    """librdkafka's own log lines (confluent-kafka's `logger`, delivered while a client polls)
    into delayq's log, not onto stderr: those of a condition the client retries by itself (a
    coordinator not ready, a connection refused while a broker restarts) at DEBUG. Pickled by
    class into the dispatch tasks' workers."""

    _log = logging.getLogger("streaming.kafka.client")

    def log(self, level: int, fmt: str, *args) -> None:
        facility, text = (args[0], args[-1]) if len(args) == 3 else ("", "")
        if facility in {"FAIL", "GETPID"} or "retrying" in text:
            level = logging.DEBUG
        self._log.log(level, fmt, *args)


def librdkafka_config(settings: Settings) -> dict[str, object]:
    config: dict[str, object] = {"security.protocol": settings.security_protocol,
                                 "logger": ClientLog()}
    if settings.security_protocol.startswith("SASL"):
        config.update({"sasl.mechanism": settings.sasl_mechanism,
                       "sasl.username": settings.sasl_username,
                       "sasl.password": settings.sasl_password.get_secret_value()})
    if settings.ssl_cafile:
        config["ssl.ca.location"] = settings.ssl_cafile
    return config

