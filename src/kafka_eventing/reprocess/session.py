"""One way to build the SparkSession every reprocessing job runs in (local mode, tests and the image alike).

The Kafka connector jars come from ``make setup`` (``$KE_CACHE/spark-kafka-4.0.0/jars``; make exports ``KE_CACHE``)
on a developer machine; the image copies them into pyspark's own ``jars/`` folder, where Spark finds them without
``spark.jars``. Nothing here looks for a source checkout: inside an image the package lives in site-packages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_KAFKA_VERSION = "4.0.0"


def connector_jars(jars: Sequence[str] | None = None) -> list[str]:
    """Jars to pass as ``spark.jars``: the given files/folders, else ``$KE_CACHE``'s connector, else none."""
    if jars:
        out: list[str] = []
        for item in jars:
            path = Path(item)
            out.extend(sorted(str(p) for p in path.glob("*.jar")) if path.is_dir() else [str(path)])
        return out
    cache = os.environ.get("KE_CACHE")
    if not cache:
        return []
    return sorted(str(p) for p in (Path(cache) / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars").glob("*.jar"))


def build_session(
    *,
    master: str = "local[*]",
    app_name: str = "kafka-eventing-reprocess",
    jars: Sequence[str] | None = None,
    driver_memory: str = "1g",
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession on loopback with the UI off and UTC as the session time zone (event dates are UTC)."""
    from pyspark.sql import SparkSession

    local = master.startswith("local")
    if local:
        # The driver must not bind to (or advertise) anything but loopback on a shared machine.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # PySpark starts its Python workers from PYSPARK_PYTHON (default: whatever `python3` is on PATH), and the
    # workers must import this very package: use the interpreter that runs the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    if local:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    found = connector_jars(jars)
    if found:
        builder = builder.config("spark.jars", ",".join(found))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
