"""A local S3-compatible server (s3proxy) on loopback, for trials and tests of a store on S3.

    delayq s3 start               # http://127.0.0.1:9000, bucket `delayq`
    DELAYQ_STORE=s3a://delayq/run DELAYQ_S3_ENDPOINT=http://127.0.0.1:9000 \\
        DELAYQ_S3_PATH_STYLE=true DELAYQ_S3_ACCESS_KEY=delayq DELAYQ_S3_SECRET_KEY=... delayq run
    delayq s3 stop

Runs s3proxy (org.gaul:s3proxy, the S3 API over a jclouds blob store) from the jars
`deploy/setup.sh` resolved into `.lib/s3proxy`; nothing is downloaded. Its objects live in its
memory (jclouds' `transient` store): its folder store keeps no empty folder markers, which S3A
writes for every folder of a checkpoint, so a stop of the server ends its data; a stop of the job
does not. It is strongly consistent, as AWS S3 is. Its configuration, log and pid file live in
`<data_dir>/s3`. The access key and secret are the settings' s3_access_key and s3_secret_key
(`delayq` and one drawn at the first start, kept in that folder, when they are empty).
"""
from __future__ import annotations

import secrets
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conf.settings import Settings
from state.errors import DelayqError
from streaming.tools import process

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
MAIN = "org.gaul.s3proxy.Main"
LOGBACK = """<configuration>
  <appender name="file" class="ch.qos.logback.core.FileAppender">
    <file>${s3proxy.log.file}</file>
    <encoder><pattern>%d{ISO8601} %level %logger{20}: %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="file"/></root>
</configuration>
"""


class S3Error(DelayqError):
    """The local S3 server could not be started or reached."""


@dataclass(frozen=True)
class S3Spec:
    home: Path
    jars: Path
    host: str = "127.0.0.1"
    port: int = 9000
    access_key: str = ""
    secret_key: str = ""
    heap: str = "512m"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "s3proxy.pid"

    def credentials(self) -> tuple[str, str]:
        """The access key and secret: the settings', else `delayq` and a secret drawn once."""
        if self.access_key and self.secret_key:
            return self.access_key, self.secret_key
        kept = self.home / "secret"
        if not kept.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            kept.write_text(secrets.token_hex(16))
            kept.chmod(0o600)
        return self.access_key or "delayq", kept.read_text().strip()


def spec_from_settings(settings: Settings) -> S3Spec:
    return S3Spec(home=settings.data_path / "s3", jars=settings.jars_path / "s3proxy",
                  host=settings.kafka_host, port=settings.s3_port,
                  access_key=settings.s3_access_key,
                  secret_key=settings.s3_secret_key.get_secret_value())


def bucket_of(store: str) -> str:
    """The bucket of an s3a:// store URI (`delayq` when the store is elsewhere)."""
    return store.removeprefix("s3a://").split("/", 1)[0] if store.startswith("s3a://") \
        else "delayq"


def write_conf(spec: S3Spec) -> Path:
    key, secret = spec.credentials()
    (spec.home / "logs").mkdir(parents=True, exist_ok=True)
    (spec.home / "logback.xml").write_text(LOGBACK)
    conf = spec.home / "s3proxy.conf"
    conf.write_text("\n".join((
        f"s3proxy.endpoint={spec.endpoint}", "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={key}", f"s3proxy.credential={secret}",
        "jclouds.provider=transient", f"jclouds.identity={key}", f"jclouds.credential={secret}",
        "")))
    conf.chmod(0o600)
    return conf


def start(spec: S3Spec, buckets: tuple[str, ...] = ("delayq",),
          timeout_s: float = READY_TIMEOUT_S) -> int:
    """Start s3proxy unless it runs and create `buckets` (kept if there); return its pid."""
    if not any(spec.jars.glob("s3proxy-*.jar")):
        raise S3Error(f"no s3proxy jar in {spec.jars}; run deploy/setup.sh once to resolve it")
    conf = write_conf(spec)
    pid = process.read_pid(spec.pid_file)
    if pid is None:
        log = spec.home / "logs" / "s3proxy.log"
        with open(spec.home / "logs" / "s3proxy.out", "ab") as out:
            pid = subprocess.Popen(
                ["java", f"-Xmx{spec.heap}", f"-Dlogback.configurationFile={spec.home}/logback.xml",
                 f"-Ds3proxy.log.file={log}", "-cp", f"{spec.jars}/*", MAIN, "--properties",
                 str(conf)], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True).pid
        spec.pid_file.write_text(str(pid))
    _wait_ready(spec, pid, timeout_s)
    for bucket in buckets:
        make_bucket(spec, bucket)
    return pid


def answers(spec: S3Spec) -> bool:
    """Whether the server answers HTTP (an unsigned request is refused, which is an answer)."""
    try:
        urllib.request.urlopen(spec.endpoint, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _wait_ready(spec: S3Spec, pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.pid_alive(pid):
            spec.pid_file.unlink(missing_ok=True)
            raise S3Error(f"s3proxy (pid {pid}) exited while starting; see "
                          f"{spec.home / 'logs'}")
        if answers(spec):
            return
        time.sleep(0.3)
    raise S3Error(f"s3proxy on {spec.endpoint} did not answer within {timeout_s:.0f} s; see "
                  f"{spec.home / 'logs'}")


def client(spec: S3Spec):
    """pyarrow's S3 file system on the server, signed with its credentials."""
    import os

    from pyarrow import fs

    # The AWS C++ SDK checks a checksum s3proxy's answers carry in another form, and fails every
    # read; set before its first client in the process.
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")

    key, secret = spec.credentials()
    return fs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=spec.endpoint,
                           scheme="http", region="us-east-1", allow_bucket_creation=True)


def make_bucket(spec: S3Spec, bucket: str) -> None:
    client(spec).create_dir(bucket)


def stop(spec: S3Spec, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop s3proxy (its objects with it); whether it was running."""
    return process.terminate(spec.pid_file, timeout_s)


def status(spec: S3Spec) -> dict[str, object]:
    return {"endpoint": spec.endpoint, "home": str(spec.home),
            "pid": process.read_pid(spec.pid_file), "answers": answers(spec)}
