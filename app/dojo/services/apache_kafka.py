"""Real Apache Kafka (KRaft, one combined broker+controller node) from Maven-resolved jars.

The jars are resolved once into the cache dir with `mvn dependency:copy-dependencies` from the
pom.xml shipped next to this module, then reused. Needs Java >= 17 on PATH (or JAVA_HOME) and,
for the first run only, Maven.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from importlib import resources
from pathlib import Path

from dojo.services.errors import ServiceError
from dojo.services.kafka_common import wait_until_ready
from dojo.services.paths import cache_dir, state_dir
from dojo.services.ports import HOST, choose_port, free_port, is_free
from dojo.services.spawn import spawn_detached
from dojo.services.state import ServiceRecord, process_create_time

KAFKA_VERSION = "4.1.1"
MIN_JAVA = 17
READY_LINE = "Kafka Server started"


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise ServiceError(
            f"The Apache Kafka backend needs Java {MIN_JAVA} or newer, and no `java` was found "
            "(PATH, JAVA_HOME). Fix: install a JDK (Debian/Ubuntu: `apt-get install "
            "openjdk-17-jre-headless`; macOS: `brew install openjdk@17`), or use the default "
            "embedded broker: `dojo services up --kafka tansu`."
        )
    return candidate


def java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise ServiceError(f"Could not read the Java version from `{java} -version`:\n{out.stderr}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> str:
    java = java_binary()
    major = java_major(java)
    if major < MIN_JAVA:
        raise ServiceError(
            f"{java} is Java {major}; Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+. "
            "Fix: install a newer JDK and put it first on PATH or set JAVA_HOME."
        )
    return java


def jar_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "lib"


def maven_command(mvn: str, pom: Path, output: Path) -> list[str]:
    """`mvn dependency:copy-dependencies` into `output`, with Maven's own download cache in
    dojo's cache dir (DOJO_CACHE_DIR), never the user's ~/.m2."""
    from dojo.services.paths import cache_dir

    return [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
            f"-Dmaven.repo.local={cache_dir() / 'maven-repository'}",
            f"-DoutputDirectory={output}", "-DincludeScope=runtime"]


def ensure_jars() -> Path:
    """The broker's classpath directory, resolving it with Maven the first time."""
    lib = jar_dir()
    if lib.is_dir() and any(lib.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ServiceError(
            f"Apache Kafka's jars are not cached yet ({lib}) and Maven is not installed to fetch "
            "them. Fix: install Maven (Debian/Ubuntu: `apt-get install maven`; macOS: `brew "
            "install maven`), then run `dojo services up --kafka apache` again."
        )
    staging = lib.with_name("lib.partial")
    shutil.rmtree(staging, ignore_errors=True)
    with resources.as_file(resources.files("dojo.services") / "apache" / "pom.xml") as pom:
        result = subprocess.run(
            maven_command(mvn, pom, staging),
            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        )
    if result.returncode != 0:
        raise ServiceError(
            "Maven could not resolve the Apache Kafka jars:\n"
            + (result.stdout + result.stderr).strip()[-2000:]
        )
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    return lib


def _home() -> Path:
    path = state_dir() / "kafka-apache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _log4j_config() -> Path:
    target = _home() / "log4j2.properties"
    source = resources.files("dojo.services") / "apache" / "log4j2.properties"
    target.write_text(source.read_text())
    return target


def _properties(port: int, controller_port: int, data: Path) -> str:
    # Single node: replication factor 1 everywhere, one partition for internal topics, and no
    # initial rebalance delay so a new consumer group gets its first record at once.
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers={HOST}:{controller_port}",
        f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=1",
        "auto.create.topics.enable=true",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "num.network.threads=2",
        "num.io.threads=2",
        "log.flush.interval.messages=9223372036854775807",
        "",
    ])


def _java_cmd(java: str, lib: Path, log4j: Path, *args: str) -> list[str]:
    return [
        java, "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={log4j}",
        "-cp", f"{lib}/*", *args,
    ]


def _format(java: str, lib: Path, log4j: Path, props: Path, data: Path) -> None:
    shutil.rmtree(data, ignore_errors=True)
    cluster = subprocess.run(_java_cmd(java, lib, log4j, "kafka.tools.StorageTool", "random-uuid"),
                             capture_output=True, text=True, timeout=120)
    cluster_id = cluster.stdout.strip().splitlines()[-1] if cluster.stdout.strip() else ""
    if cluster.returncode != 0 or not cluster_id:
        raise ServiceError(f"kafka-storage random-uuid failed:\n{cluster.stderr[-2000:]}")
    fmt = subprocess.run(
        _java_cmd(java, lib, log4j, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                  "-c", str(props), "--standalone"),
        capture_output=True, text=True, timeout=120,
    )
    if fmt.returncode != 0:
        raise ServiceError(f"kafka-storage format failed:\n{(fmt.stdout + fmt.stderr)[-2000:]}")


def start_apache(recorded_port: int | None = None) -> ServiceRecord:
    java = require_java()
    lib = ensure_jars()
    home = _home()
    layout_file = home / "layout.json"
    layout = json.loads(layout_file.read_text()) if layout_file.exists() else {}
    port = choose_port(os.environ.get("DOJO_KAFKA_PORT"), recorded_port or layout.get("port"),
                       "Kafka (Apache)", "DOJO_KAFKA_PORT")
    controller_port = layout.get("controller_port")
    if not controller_port or not is_free(controller_port) or controller_port == port:
        controller_port = free_port()
    data = home / "data"
    props = home / "server.properties"
    log4j = _log4j_config()
    props.write_text(_properties(port, controller_port, data))
    # --standalone records the controller endpoint in the log dir: a new controller port (or
    # a dir never formatted) needs a fresh format. Test data is disposable.
    if layout.get("controller_port") != controller_port or not (data / "meta.properties").exists():
        _format(java, lib, log4j, props, data)
    layout_file.write_text(json.dumps({"port": port, "controller_port": controller_port}))
    log = state_dir() / "kafka-apache.log"
    log.write_text("")
    pid = spawn_detached(_java_cmd(java, lib, log4j, "kafka.Kafka", str(props)), log)
    record = ServiceRecord(
        name="kafka", backend="apache", pid=pid, port=port, url=f"{HOST}:{port}",
        started_at=time.time(), create_time=process_create_time(pid), log=str(log),
        extra={"controller_port": controller_port, "kafka_version": KAFKA_VERSION},
    )
    deadline = time.monotonic() + 90
    while READY_LINE not in log.read_text(errors="replace"):
        if not record.is_alive():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise ServiceError(f"Apache Kafka exited while starting. Last lines of {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise ServiceError(f"Apache Kafka did not log '{READY_LINE}' within 90 s; see {log}.")
        time.sleep(0.1)
    wait_until_ready(record.url, timeout=30, is_alive=record.is_alive)
    return record
