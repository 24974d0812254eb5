"""A real single-node Apache Kafka (KRaft) on loopback, with PLAINTEXT and SASL_SSL listeners.

The broker runs from the Maven Central jars that ``make setup`` puts under the tool cache. The node can be
stopped and started again on the same data and the same ports, which reliability tests need.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.tls import CertificateAuthority
from kafka_eventing.localstack.tools import cache_dir

log = logging.getLogger(__name__)

KAFKA_VERSION = "3.9.1"


def kafka_libs() -> Path:
    libs = cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"
    if not libs.is_dir() or not any(libs.glob("kafka_2.13-*.jar")):
        raise FileNotFoundError(f"Kafka {KAFKA_VERSION} jars not found in {libs}: run `make setup` first")
    return libs


@dataclass(frozen=True)
class ScramUser:
    name: str
    password: str


#: What Kafka logs when its start-up dies of its own race (see ``KafkaNode.start``).
STARTUP_FAULT = "Encountered fatal fault"


class _StartupFault(RuntimeError):
    """Kafka exited during start-up with ``STARTUP_FAULT``."""


@dataclass
class KafkaNode:
    """One combined broker+controller node. Use as a context manager or call start()/stop()."""

    workdir: Path
    heap: str = "512m"
    #: Address of the PLAINTEXT listener (and what it advertises). cluster.py uses its bridge address, which pods
    #: in their own network namespaces reach.
    host: str = "127.0.0.1"
    scram_user: ScramUser = field(
        default_factory=lambda: ScramUser("alice", "alice-" + secrets.token_hex(8))
    )
    plaintext_port: int = field(default_factory=_proc.free_port)
    sasl_ssl_port: int = field(default_factory=_proc.free_port)
    controller_port: int = field(default_factory=_proc.free_port)
    #: How long a start may take before it fails. Ready is polled, so this only bounds a start that never comes:
    #: a JVM start on a 2-core machine under load takes 60–120 s (the API server's is bounded at 180 s too).
    start_timeout: float = 240.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _formatted: bool = field(default=False, init=False)

    # -- paths --------------------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def ca_path(self) -> Path:
        return self.workdir / "tls" / "ca.crt"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.plaintext_port}"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        return f"localhost:{self.sasl_ssl_port}"

    def client_config(self, *, sasl_ssl: bool = False) -> dict[str, str]:
        """A confluent-kafka config for one of the two listeners."""
        if not sasl_ssl:
            return {"bootstrap.servers": self.bootstrap_servers}
        return {
            "bootstrap.servers": self.sasl_ssl_bootstrap_servers,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.scram_user.name,
            "sasl.password": self.scram_user.password,
            "ssl.ca.location": str(self.ca_path),
        }

    def connection_secret(self, *, sasl_ssl: bool = False) -> dict[str, str]:
        """The same connection as a Knative-style connection Secret's string data (newest key format)."""
        if not sasl_ssl:
            return {"protocol": "PLAINTEXT", "bootstrap.servers": self.bootstrap_servers}
        return {
            "protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "user": self.scram_user.name,
            "password": self.scram_user.password,
            "ca.crt": self.ca_path.read_text(),
            "bootstrap.servers": self.sasl_ssl_bootstrap_servers,
        }

    # -- lifecycle ----------------------------------------------------------------------------------
    def _write_config(self) -> Path:
        tls = self.workdir / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        keystore = tls / "server.pem"
        if not keystore.exists():
            ca = CertificateAuthority()
            server = ca.issue("kafka-broker", ("localhost", "127.0.0.1"))
            self.ca_path.write_bytes(ca.cert_pem)
            # Kafka's PEM keystore wants the PKCS#8 key followed by the certificate chain in one file.
            keystore.write_bytes(server.key_pem + server.cert_pem + ca.cert_pem)
            keystore.chmod(0o600)
        jaas_plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{self.scram_user.name}="{self.scram_user.password}";'
        )
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.plaintext_port},"
                f"SASL_SSL://127.0.0.1:{self.sasl_ssl_port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://{self.host}:{self.plaintext_port},SASL_SSL://localhost:{self.sasl_ssl_port}"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas_plain,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.flush.interval.messages": "9223372036854775807",
            # Small segments keep the tests' disk use small; retention is set per topic anyway.
            "log.segment.bytes": str(64 * 1024 * 1024),
            "message.max.bytes": str(2 * 1024 * 1024),
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.workdir / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, stdout\n"
            "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            "log4j.logger.kafka=INFO\nlog4j.logger.org.apache.kafka=INFO\n"
            "log4j.logger.state.change.logger=WARN\nlog4j.logger.kafka.request.logger=WARN\n"
        )
        return path

    def _java(self, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            # Kafka's own defaults (kafka-run-class.sh): G1 aiming at 20 ms pauses instead of G1's 200 ms.
            java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp", f"{kafka_libs()}/*", *args,
        ]

    def _format(self, props: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = subprocess.run(
            self._java("kafka.tools.StorageTool", "random-uuid"),
            check=True, capture_output=True, text=True, timeout=120,
        ).stdout.strip().splitlines()[-1]
        scram = f"name={self.scram_user.name},password={self.scram_user.password}"
        subprocess.run(
            self._java(
                "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                "--ignore-formatted",
                "--add-scram", f"SCRAM-SHA-512=[{scram}]",
                "--add-scram", f"SCRAM-SHA-256=[{scram}]",
            ),
            check=True, capture_output=True, timeout=120,
        )

    @property
    def pid(self) -> int:
        """The broker JVM's process id (benchmarks record its CPU); the node must be started."""
        if self._proc is None:
            raise RuntimeError("the Kafka node is not started")
        return self._proc.pid

    def start(self) -> KafkaNode:
        self.workdir.mkdir(parents=True, exist_ok=True)
        props = self._write_config()
        self._format(props)
        deadline = time.monotonic() + self.start_timeout
        self._launch(props)
        try:
            self._wait_ready(deadline)
        except _StartupFault:
            # Kafka 3.9's combined node can die of its own start-up race when it starts slowly (the controller's
            # RaftManager not yet set: "Encountered fatal fault", a NullPointerException); what a supervisor would
            # do, once: start it again on the same data.
            log.warning("Kafka died of a start-up fault; starting it once more", extra={"log": str(self.log_path)})
            self._launch(props)
            self._wait_ready(time.monotonic() + self.start_timeout)
        return self

    def _launch(self, props: Path) -> None:
        out = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            # GC pauses next to the broker's log: the first suspect when a benchmark's tail latency jumps.
            self._java(f"-Xlog:gc:file={self.workdir / 'gc.log'}:uptime,level:filecount=2,filesize=10m",
                       "kafka.Kafka", str(props)),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        out.close()

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                tail = _proc.tail(self.log_path)
                fault = _StartupFault if STARTUP_FAULT in tail else RuntimeError
                raise fault(f"Kafka exited with {self._proc.returncode}:\n{tail}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers and _proc.port_open(self.sasl_ssl_port):
                    return
            except Exception:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"Kafka not ready in {self.start_timeout}s:\n{_proc.tail(self.log_path)}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Controlled shutdown; the data stays so start() brings the same node back."""
        _proc.terminate(self._proc, timeout=30)
        self._proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        _proc.kill(self._proc)
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> KafkaNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
