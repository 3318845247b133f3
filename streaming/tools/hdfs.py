"""A local HDFS: one NameNode and one DataNode on loopback, for trials and tests of a
checkpoint on a distributed store.

    delayq hdfs start             # hdfs://127.0.0.1:9820, NameNode UI :9870
    DELAYQ_STORE=hdfs://127.0.0.1:9820/delayq delayq run
    delayq hdfs stop

Runs Apache Hadoop's own NameNode and DataNode from the jars `deploy/setup.sh` resolved into
`.lib/hdfs`; nothing is downloaded. Their configuration, metadata, blocks, logs and pid files
live in `<data_dir>/hdfs`. Start is idempotent (the NameNode is formatted once), stop is clean.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from conf.settings import Settings
from state.errors import DelayqError
from streaming.tools import process

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
ROLES = {"namenode": "org.apache.hadoop.hdfs.server.namenode.NameNode",
         "datanode": "org.apache.hadoop.hdfs.server.datanode.DataNode"}
LOG4J = """log4j.rootLogger=WARN,file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${hdfs.log.file}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.hdfs.server=INFO
"""


class HdfsError(DelayqError):
    """The local HDFS could not be started or reached."""


@dataclass(frozen=True)
class HdfsSpec:
    home: Path
    jars: Path
    host: str = "127.0.0.1"
    port: int = 9820          # the NameNode's RPC port: hdfs://host:port
    http_port: int = 9870     # the NameNode's web UI and JMX
    datanode_ports: tuple[int, int, int] = (9866, 9864, 9867)   # data, http, ipc
    heap: str = "384m"

    @property
    def uri(self) -> str:
        return f"hdfs://{self.host}:{self.port}"

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf"

    def pid_file(self, role: str) -> Path:
        return self.home / f"{role}.pid"


def spec_from_settings(settings: Settings) -> HdfsSpec:
    return HdfsSpec(home=settings.data_path / "hdfs", jars=settings.jars_path / "hdfs")


def _site(properties: dict[str, str]) -> str:
    rows = "".join(f"  <property><name>{k}</name><value>{v}</value></property>\n"
                   for k, v in properties.items())
    return f"<?xml version=\"1.0\"?>\n<configuration>\n{rows}</configuration>\n"


def write_conf(spec: HdfsSpec) -> None:
    """core-site.xml, hdfs-site.xml and log4j.properties; the empty web app folders the
    daemons' web servers look up on the class path (Maven's jars leave them out)."""
    data, http, ipc = spec.datanode_ports
    spec.conf_dir.mkdir(parents=True, exist_ok=True)
    (spec.conf_dir / "core-site.xml").write_text(_site({"fs.defaultFS": spec.uri}))
    (spec.conf_dir / "hdfs-site.xml").write_text(_site({
        "dfs.namenode.name.dir": str(spec.home / "name"),
        "dfs.datanode.data.dir": str(spec.home / "data"),
        "dfs.namenode.rpc-address": f"{spec.host}:{spec.port}",
        "dfs.namenode.http-address": f"{spec.host}:{spec.http_port}",
        "dfs.datanode.address": f"{spec.host}:{data}",
        "dfs.datanode.http.address": f"{spec.host}:{http}",
        "dfs.datanode.ipc.address": f"{spec.host}:{ipc}",
        "dfs.replication": "1",
        "dfs.permissions.enabled": "false",
        "dfs.namenode.safemode.extension": "0",
        "dfs.datanode.hostname": spec.host,
        "dfs.client.use.datanode.hostname": "true",
    }))
    (spec.conf_dir / "log4j.properties").write_text(LOG4J)
    for app in ("hdfs", "datanode", "static"):
        (spec.conf_dir / "webapps" / app / "WEB-INF").mkdir(parents=True, exist_ok=True)


def _java(spec: HdfsSpec, role: str, *args: str) -> list[str]:
    if not any(spec.jars.glob("hadoop-hdfs-*.jar")):
        raise HdfsError(f"no HDFS jars in {spec.jars}; run deploy/setup.sh once to resolve them")
    return ["java", f"-Xmx{spec.heap}", f"-Dhdfs.log.file={spec.home / 'logs' / role}.log",
            "-cp", f"{spec.conf_dir}:{spec.jars}/*", ROLES[role], *args]


def start(spec: HdfsSpec, timeout_s: float = READY_TIMEOUT_S) -> dict[str, int]:
    """Start the NameNode and the DataNode unless they run; return their pids once the
    DataNode has registered and the NameNode has left safe mode."""
    write_conf(spec)
    (spec.home / "logs").mkdir(parents=True, exist_ok=True)
    if not (spec.home / "name" / "current" / "VERSION").exists():
        done = subprocess.run(_java(spec, "namenode", "-format", "-force", "-nonInteractive"),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise HdfsError(f"formatting the NameNode in {spec.home / 'name'} failed: "
                            f"{(done.stderr or done.stdout).strip()[-2000:]}")
    pids = {}
    for role in ROLES:
        pid = process.read_pid(spec.pid_file(role))
        if pid is None:
            with open(spec.home / "logs" / f"{role}.out", "ab") as out:
                pid = subprocess.Popen(_java(spec, role), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True).pid
            spec.pid_file(role).write_text(str(pid))
        pids[role] = pid
    wait_ready(spec, pids, timeout_s)
    return pids


def namenode_state(spec: HdfsSpec) -> dict:
    """The NameNode's own report (its JMX bean FSNamesystemState), or {} before it answers."""
    url = (f"http://{spec.host}:{spec.http_port}/jmx"
           "?qry=Hadoop:service=NameNode,name=FSNamesystemState")
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            beans = json.load(answer).get("beans", [])
    except (OSError, ValueError):
        return {}
    return beans[0] if beans else {}


def wait_ready(spec: HdfsSpec, pids: dict[str, int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for role, pid in pids.items():
            if not process.pid_alive(pid):
                spec.pid_file(role).unlink(missing_ok=True)
                raise HdfsError(f"the {role} (pid {pid}) exited while starting; see "
                                f"{spec.home / 'logs' / role}.log")
        state = namenode_state(spec)
        if state.get("NumLiveDataNodes", 0) >= 1 and state.get("FSState") == "Operational":
            return
        time.sleep(0.5)
    raise HdfsError(f"HDFS on {spec.uri} was not ready within {timeout_s:.0f} s; see "
                    f"{spec.home / 'logs'}")


def stop(spec: HdfsSpec, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
    """Stop the DataNode, then the NameNode; the roles that were running."""
    return [role for role in reversed(ROLES)
            if process.terminate(spec.pid_file(role), timeout_s)]


def status(spec: HdfsSpec) -> dict[str, object]:
    state = namenode_state(spec)
    return {"uri": spec.uri, "home": str(spec.home),
            **{role: process.read_pid(spec.pid_file(role)) for role in ROLES},
            "live_datanodes": state.get("NumLiveDataNodes"), "state": state.get("FSState")}
