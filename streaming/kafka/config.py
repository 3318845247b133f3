"""Kafka client settings, one source for every client: kafka-python, librdkafka and Spark's
Kafka source and sink."""
from __future__ import annotations

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


def librdkafka_config(settings: Settings) -> dict[str, object]:
    config: dict[str, object] = {"security.protocol": settings.security_protocol}
    if settings.security_protocol.startswith("SASL"):
        config.update({"sasl.mechanism": settings.sasl_mechanism,
                       "sasl.username": settings.sasl_username,
                       "sasl.password": settings.sasl_password.get_secret_value()})
    if settings.ssl_cafile:
        config["ssl.ca.location"] = settings.ssl_cafile
    return config


def dispatch_producer_config(settings: Settings, max_request_bytes: int) -> dict[str, object]:
    """Keyed rows without REAL_QID are placed as Kafka's Java client does (murmur2); an unknown
    REAL_TOPIC is awaited `dispatch_topic_wait_ms` before the row is dead-lettered."""
    return {"bootstrap.servers": settings.bootstrap, "linger.ms": 1, "acks": "all",
            "message.max.bytes": max_request_bytes, "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_097_151,
            "topic.metadata.propagation.max.ms": settings.dispatch_topic_wait_ms,
            **librdkafka_config(settings)}
