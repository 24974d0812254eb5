"""The spark image (issue #7), built by hack/images.sh and run the way the chart's reprocess pods run it.

Each container runs with ``--network none --read-only --tmpfs /tmp:exec --user 185``: no network, a read-only root
filesystem with /tmp (Spark's scratch space, the chart's emptyDir) the only writable path, and the UID of the
official Spark images. The entrypoint's ``driver`` mode (spark-submit, as in a SparkApplication's driver pod) runs
the example's main file with ``--master local[1]``: ``reprocess stats`` over a Parquet archive written here. A
local PySpark session resolves the ``kafka`` data source and the MSK IAM login module through the JVM. Together:
Java, PySpark, the jars and this package are in the image and work together.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from e2e._engine import ROOT, Engine, build_role_images, docker_engine, git_sha

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

UID = "185"
# exec: like the chart's emptyDir (docker's --tmpfs defaults to noexec): the JVM extracts native libraries
# (snappy-java for Parquet, zstd-jni, netty) to /tmp and loads them from there.
RUN_FLAGS = ("--network", "none", "--read-only", "--tmpfs", "/tmp:exec", "--user", UID)
SITE = "/opt/venv/lib/python3.11/site-packages"
EXAMPLE = ROOT / "charts" / "kafka-eventing" / "examples" / "sparkapplication-archive.yaml"
ENTRYPOINT = ROOT / "images" / "spark" / "entrypoint.sh"

PROBE = """
import json, os, subprocess, sys
import kafka_eventing
from kafka_eventing.reprocess.session import build_session
spark = build_session(master="local[1]", app_name="image-probe")
jvm = spark.sparkContext._jvm
loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
def loads(name):
    try:
        loader.loadClass(name)
        return True
    except Exception:
        return False
kafka = (spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
         .option("subscribe", "probe").load())  # lazy: resolves the data source, connects to nothing
try:
    open("/opt/venv/written-at-runtime", "w")
    root_writable = True
except OSError:
    root_writable = False
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"),
    "java": jvm.java.lang.System.getProperty("java.specification.version"),
    "spark": spark.version, "package": kafka_eventing.__file__,
    "kafka_columns": kafka.columns,
    "kafka_provider": loads("org.apache.spark.sql.kafka010.KafkaSourceProvider"),
    "msk_iam": loads("software.amazon.msk.auth.iam.IAMLoginModule"),
    "root_writable": root_writable,
    "arrow": spark.createDataFrame([(1, "a")], "n int, s string").toPandas().to_dict("records"),
}))
spark.stop()
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with docker_engine() as eng:
        yield eng


@pytest.fixture(scope="module")
def image(engine: Engine) -> str:
    return build_role_images(engine, f"e2e-{git_sha()}", ("spark",))["spark"]


def test_entrypoint_knows_every_reprocess_job() -> None:
    """entrypoint.sh hands a job's command line to the CLI; its list must be the CLI's jobs."""
    from kafka_eventing.reprocess.cli import build_parser

    match = re.search(r'^JOBS=" (.*) "$', ENTRYPOINT.read_text(), re.MULTILINE)
    assert match is not None
    subparsers = next(a for a in build_parser()._actions if a.dest == "job")
    assert sorted(match.group(1).split()) == sorted(subparsers.choices)  # type: ignore[arg-type]


def test_image_config_matches_the_sparkapplication_example(engine: Engine, image: str) -> None:
    config = json.loads(engine.docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["/opt/entrypoint.sh"] and config["Cmd"] == ["--help"]
    assert config["Labels"]["org.opencontainers.image.title"] == "kafka-eventing-spark"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["SPARK_HOME"] == f"{SITE}/pyspark" and env["JAVA_HOME"] == "/usr/lib/jvm/java-17"
    assert env["SPARK_LOCAL_DIRS"].startswith("/tmp/")

    app = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert app["image"].rsplit(":", 1)[0].endswith("/kafka-eventing-spark")
    assert app["sparkVersion"] == "4.0.0"
    main = app["mainApplicationFile"].removeprefix("local://")
    for pod in ("driver", "executor"):
        assert app[pod]["podSecurityContext"]["runAsUser"] == int(UID)
    # The main file, the entrypoint and tini exist in the image where the example and the script expect them.
    proc = engine.docker("run", "--rm", *RUN_FLAGS, "--entrypoint", "/bin/bash", image, "-c",
                         f'test -f {main} && test -x /opt/entrypoint.sh && test -x /usr/bin/tini '
                         '&& test -x "$SPARK_HOME/bin/spark-submit" && test -x "$JAVA_HOME/bin/java" && echo ok')
    assert proc.stdout.strip() == "ok", proc.stderr


def test_default_command_is_the_reprocess_help(engine: Engine, image: str) -> None:
    proc = engine.docker("run", "--rm", *RUN_FLAGS, image)
    assert "kafka-eventing reprocess" in proc.stdout
    for job in ("archive", "replay", "redrive", "stats"):
        assert job in proc.stdout


def test_local_session_has_java_the_kafka_connector_and_the_package(engine: Engine, image: str) -> None:
    proc = engine.docker("run", "--rm", *RUN_FLAGS, "--entrypoint", "python", image, "-c", PROBE, timeout=600)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["uid"] == int(UID) and facts["gid"] == int(UID) and facts["home"] == "/tmp"
    assert facts["java"] == "17"
    assert facts["spark"] == "4.0.0"
    assert facts["package"].startswith(f"{SITE}/kafka_eventing/")
    assert facts["kafka_provider"] is True
    assert facts["kafka_columns"][:2] == ["key", "value"] and "offset" in facts["kafka_columns"]
    assert facts["msk_iam"] is True
    assert facts["root_writable"] is False
    assert facts["arrow"] == [{"n": 1, "s": "a"}]  # pyarrow/pandas in the Python workers' interpreter


def _write_archive(path: Path) -> None:
    """Three events and one record that was not a CloudEvent, in the columns the archive job writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    hour = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    rows = [
        ("e1", "/orders", "com.example.order.created", {}, None),
        ("e2", "/orders", "com.example.order.created", {}, None),
        ("e3", "/orders", "com.example.order.paid",
         {"knativeerrorcode": "500", "knativeerrordest": "http://sink.default.svc"}, None),
        (None, None, None, {}, "not a CloudEvent: no ce_specversion header"),
    ]
    table = pa.table({
        "id": [r[0] for r in rows], "source": [r[1] for r in rows], "type": [r[2] for r in rows],
        "specversion": ["1.0", "1.0", "1.0", None],
        "time": pa.array([hour, hour, hour, None], pa.timestamp("us", tz="UTC")),
        "extensions": pa.array([list(r[3].items()) for r in rows], pa.map_(pa.string(), pa.string())),
        "data": pa.array([b"{}", b"{}", b"{}", b"\x00"], pa.binary()),
        "topic": ["default.orders"] * 4, "partition": pa.array([0] * 4, pa.int32()),
        "offset": pa.array([0, 1, 2, 3], pa.int64()),
        "timestamp": pa.array([hour] * 4, pa.timestamp("us", tz="UTC")),
        "error": [r[4] for r in rows],
    })
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-00000.parquet")


def test_driver_mode_runs_the_stats_job_over_an_archive(engine: Engine, image: str, tmp_path: Path) -> None:
    """The SparkApplication's driver command (``driver`` → spark-submit in client mode → PythonRunner → the
    example's main file), with the properties file Spark on Kubernetes mounts, on ``--master local[1]``."""
    main = yaml.safe_load(EXAMPLE.read_text())["spec"]["mainApplicationFile"]
    _write_archive(tmp_path / "archive")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark.properties").write_text("spark.app.name=kafka-eventing-stats\nspark.ui.enabled=false\n")
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # written by UID 185
    for p in (tmp_path, tmp_path / "archive", conf):
        p.chmod(0o755)
    proc = engine.docker(
        "run", "--rm", *RUN_FLAGS, "--hostname", "localhost",  # in a pod the hostname resolves to the pod IP
        "--volume", f"{tmp_path / 'archive'}:/data/archive:ro", "--volume", f"{out}:/data/out",
        "--volume", f"{conf}:/opt/spark/conf:ro",
        "--env", "SPARK_DRIVER_BIND_ADDRESS=127.0.0.1",  # set by Spark to the driver pod's IP
        "--env", "KE_BOOTSTRAP_SERVERS=127.0.0.1:9",  # the connection is configured, never used by an archive read
        image, "driver", "--properties-file", "/opt/spark/conf/spark.properties", "--master", "local[1]",
        "--class", "org.apache.spark.deploy.PythonRunner", main,
        "stats", "--archive", "/data/archive", "--out", "/data/out/stats", "--master", "local[1]",
        timeout=900, check=False)
    assert proc.returncode == 0, f"driver exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}"
    assert re.search(r"^events\s+3$", proc.stdout, re.MULTILINE), proc.stdout
    assert re.search(r"^malformed\s+1$", proc.stdout, re.MULTILINE), proc.stdout
    with (out / "stats" / "counts.csv").open() as f:
        counts = {(r["type"], int(r["count"])) for r in csv.DictReader(f)}
    assert counts == {("com.example.order.created", 2), ("com.example.order.paid", 1)}
    with (out / "stats" / "errors.csv").open() as f:
        errors = list(csv.DictReader(f))
    assert [(e["code"], e["destination"], e["count"]) for e in errors] == [("500", "http://sink.default.svc", "1")]
    assert (out / "stats" / "chart.png").stat().st_size > 0


def test_executor_mode_starts_the_kubernetes_executor_backend(engine: Engine, image: str) -> None:
    """``executor`` with the variables Spark sets on an executor pod: the backend parses them and dials the driver
    (there is none here, so it must fail on exactly that)."""
    env = {"SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:7078", "SPARK_EXECUTOR_ID": "1",
           "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-e2e", "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
           "SPARK_EXECUTOR_POD_NAME": "e2e-exec-1", "SPARK_EXECUTOR_MEMORY": "512m", "SPARK_RESOURCE_PROFILE_ID": "0",
           "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078"}
    proc = engine.docker("run", "--rm", *RUN_FLAGS, "--hostname", "localhost",
                         *(a for k, v in env.items() for a in ("--env", f"{k}={v}")), image, "executor",
                         timeout=300, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "KubernetesExecutorBackend: Started daemon" in log, log[-3000:]
    assert "Failed to connect to /127.0.0.1:7078" in log, log[-3000:]
