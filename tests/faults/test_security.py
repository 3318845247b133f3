"""Kafka security end to end: a local broker that takes only SASL clients (PLAIN and
SCRAM-SHA-256), or only TLS clients, on its public listener; the whole path (admin, producer,
Spark source and sink, heartbeat, cold tier) works with the right credentials or CA, is refused
with the wrong ones, and the password is never written to the job's output."""
from __future__ import annotations

import subprocess
import uuid

import pytest

from streaming.tools import broker
from streaming.kafka.admin import create_topic
from streaming.producer import DelayProducer
from tests.conftest import PROJECT
from tests.integration.conftest import Sent
from tests.support import check_deliveries, consume_all, free_ports

PASSWORD = "pw-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def sasl_broker(work_dir):
    """PLAINTEXT for the broker's own traffic (and the test's reader), SASL_PLAINTEXT for
    everyone else, with user delayq for PLAIN (in the JAAS config) and for SCRAM-SHA-256
    (a credential stored in the cluster metadata)."""
    sasl_port, port, controller_port = free_ports(3)
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="admin" password="admin-pw" user_admin="admin-pw" '
            f'user_delayq="{PASSWORD}";')
    spec = broker.BrokerSpec(
        home=work_dir / f"kafka-sasl-{uuid.uuid4().hex[:6]}", jars=PROJECT / ".lib" / "kafka",
        port=port, controller_port=controller_port, heap="512m",
        listeners={"SASL": ("SASL_PLAINTEXT", sasl_port)},
        # An authorizer that allows what no ACL names: a test denies one thing at a time.
        extra={"authorizer.class.name":
                   "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
               "allow.everyone.if.no.acl.found": "true", "super.users": "User:ANONYMOUS",
               "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
               "listener.name.sasl.plain.sasl.jaas.config": jaas,
               "listener.name.sasl.scram-sha-256.sasl.jaas.config":
                   "org.apache.kafka.common.security.scram.ScramLoginModule required;"})
    broker.start(spec)
    from kafka import KafkaAdminClient
    from kafka.admin import UserScramCredentialUpsertion

    admin = KafkaAdminClient(bootstrap_servers=spec.bootstrap)
    errors = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("delayq", "SCRAM-SHA-256", PASSWORD)])
    admin.close()
    assert not any(errors.values()), errors
    yield spec, f"127.0.0.1:{sasl_port}"
    broker.stop(spec)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_broker_works_only_with_the_right_credentials(sasl_broker, job_process, capsys,
                                                            mechanism):
    spec, sasl_bootstrap = sasl_broker
    secure = dict(bootstrap_servers=sasl_bootstrap, security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism=mechanism, sasl_username="delayq")

    wrong, _ = job_process(**secure, sasl_password="not-" + PASSWORD, connect_timeout="5s")
    with pytest.raises(AssertionError, match="exited"):
        wrong.start(timeout_s=120)
    refused = wrong.log.read_text(errors="replace")
    assert "could not log in" in refused and "authentication failed" in refused, refused[-2000:]

    job, settings = job_process(**secure, sasl_password=PASSWORD)
    records, sent = deliver_three(spec, job, settings)

    output = job.log.read_text(errors="replace") + refused
    assert PASSWORD not in output, "the SASL password appeared in the job's output"
    with capsys.disabled():
        print(f"\nSASL/{mechanism}: wrong password refused at start; right one delivered "
              f"{len(records)} of {len(sent)}; password absent from {len(output)} bytes of output")


def test_a_fresh_start_that_cannot_read_the_groups_offsets_is_refused(sasl_broker, job_process):
    """A missing checkpoint is only started over when the consumer group shows no earlier run:
    a group this user may not describe refuses the start with the ACL to grant and the
    override, and once it is granted, the job starts."""
    from kafka import KafkaAdminClient
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType,
                             ACLResourcePatternType, ResourcePattern, ResourcePatternFilter,
                             ResourceType)

    from streaming.wheel.checkpoint import group_id

    spec, sasl_bootstrap = sasl_broker
    job, settings = job_process(bootstrap_servers=sasl_bootstrap,
                                security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                sasl_username="delayq", sasl_password=PASSWORD)
    group = group_id(settings)
    deny = ACL("User:delayq", "*", ACLOperation.DESCRIBE, ACLPermissionType.DENY,
               ResourcePattern(ResourceType.GROUP, group))
    admin = KafkaAdminClient(bootstrap_servers=spec.bootstrap)   # ANONYMOUS: a super user
    try:
        admin.create_acls([deny])
        with pytest.raises(AssertionError, match="exited"):
            job.start(timeout_s=180)
        said = job.log.read_text(errors="replace")
        assert f"consumer group {group}" in said and "could not be read" in said, said[-3000:]
        assert f"--operation Describe --group {group}" in said and \
            "--allow-fresh-checkpoint" in said, said[-3000:]
    finally:
        admin.delete_acls([ACLFilter("User:delayq", "*", ACLOperation.DESCRIBE,
                                     ACLPermissionType.DENY,
                                     ResourcePatternFilter(ResourceType.GROUP, group,
                                                           ACLResourcePatternType.LITERAL))])
        admin.close()
    job.start()
    job.stop()
    assert job.proc.returncode == 0, job.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def tls_broker(work_dir):
    """An SSL listener with a self-signed certificate for 127.0.0.1 (the job must be given it
    as its CA), PLAINTEXT for the broker's own traffic and the test's reader."""
    home = work_dir / f"kafka-tls-{uuid.uuid4().hex[:6]}"
    home.mkdir(parents=True)
    keystore, ca = home / "broker.p12", home / "ca.pem"
    store_pw = "store-" + uuid.uuid4().hex[:8]
    subprocess.run(["keytool", "-genkeypair", "-alias", "broker", "-keyalg", "RSA",
                    "-keysize", "2048", "-validity", "2", "-dname", "CN=127.0.0.1",
                    "-ext", "SAN=IP:127.0.0.1,DNS:localhost", "-keystore", str(keystore),
                    "-storetype", "PKCS12", "-storepass", store_pw, "-keypass", store_pw],
                   check=True, capture_output=True)
    subprocess.run(["keytool", "-exportcert", "-alias", "broker", "-rfc", "-keystore",
                    str(keystore), "-storepass", store_pw, "-file", str(ca)],
                   check=True, capture_output=True)
    tls_port, port, controller_port = free_ports(3)
    spec = broker.BrokerSpec(
        home=home / "broker", jars=PROJECT / ".lib" / "kafka",
        port=port, controller_port=controller_port, heap="512m",
        listeners={"TLS": ("SSL", tls_port)},
        extra={"listener.name.tls.ssl.keystore.location": str(keystore),
               "listener.name.tls.ssl.keystore.type": "PKCS12",
               "listener.name.tls.ssl.keystore.password": store_pw,
               "listener.name.tls.ssl.key.password": store_pw})
    broker.start(spec)
    yield spec, f"127.0.0.1:{tls_port}", ca
    broker.stop(spec)


def test_tls_broker_works_only_when_its_certificate_is_trusted(tls_broker, job_process, capsys):
    spec, tls_bootstrap, ca = tls_broker

    untrusting, _ = job_process(bootstrap_servers=tls_bootstrap, security_protocol="SSL",
                                connect_timeout="5s")
    with pytest.raises(AssertionError, match="exited"):
        untrusting.start(timeout_s=120)
    refused = untrusting.log.read_text(errors="replace")
    assert "certificate is not trusted" in refused and "ssl_cafile=(system CAs)" in refused, \
        refused[-2000:]

    job, settings = job_process(bootstrap_servers=tls_bootstrap, security_protocol="SSL",
                                ssl_cafile=str(ca))
    records, sent = deliver_three(spec, job, settings)
    with capsys.disabled():
        print(f"\nTLS: without the broker's CA refused at start; with it delivered "
              f"{len(records)} of {len(sent)}")


def deliver_three(spec, job, settings):
    """Start `job` and send one message at levels 0, 1 and 2 through the secure listener (the
    producer has only the job's secure settings); read them back on the broker's own listener
    and check them. Returns (records, sent)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=spec.bootstrap)
    real = f"real-{uuid.uuid4().hex[:6]}"
    create_topic(admin, real, 1, {"message.timestamp.type": "LogAppendTime"})
    admin.close()
    job.start()
    sent: dict[str, Sent] = {}
    with DelayProducer(settings) as producer:
        for level in (0, 1, 2):
            value = f"secure {level}".encode()
            handle = producer.send(real, value, key=b"k", level=level)
            sent[handle.uniq_key] = Sent(b"k", value, [], handle.due_ms)
    records = consume_all(spec.bootstrap, real, expected=len(sent), timeout_s=90, idle_s=2)
    check_deliveries(records, sent)
    job.stop()
    return records, sent
