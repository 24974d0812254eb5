"""Reprocessing jobs on a real local Spark (``local[2]``) against the real broker.

One Spark session serves the whole module (a start costs ~10 s); N stays small so the file fits a busy box.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from support.reprocess import Sink, _event, _one_line, _produce, _produce_raw

from kafka_eventing.core.binding import CloudEvent
from kafka_eventing.core.delivery import DeliverySpec
from kafka_eventing.core.kafka_config import connection_from_secret
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tools import cache_dir
from kafka_eventing.reprocess.archive import run_archive
from kafka_eventing.reprocess.http_sink import HttpSinkPolicy
from kafka_eventing.reprocess.kafka_options import spark_kafka_options
from kafka_eventing.reprocess.replay import Filters, HttpTarget, TopicTarget, run_redrive, run_replay
from kafka_eventing.reprocess.session import SPARK_KAFKA_VERSION
from kafka_eventing.reprocess.sources import Window, read_archive, read_topic
from kafka_eventing.reprocess.stats import run_stats

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.timeout(300)]









@pytest.fixture
def plain_options(kafka_running: KafkaNode) -> dict[str, str]:
    return dict(spark_kafka_options(connection_from_secret(kafka_running.connection_secret())))






def test_archive_round_trip_incremental_and_malformed(
    spark: Any, kafka_running: KafkaNode, topic: str, plain_options: dict[str, str], tmp_path: Path,
) -> None:
    first = [_event(i) for i in range(12)]
    _produce(kafka_running, topic, first)
    _produce_raw(kafka_running, topic, b"this is not a cloudevent")
    out, ckpt = str(tmp_path / "archive"), str(tmp_path / "checkpoint")

    result = run_archive(spark, topic=topic, output=out, checkpoint=ckpt, kafka_options=plain_options, timeout=240)
    assert (result.records, result.archived, result.malformed) == (13, 12, 1)

    rows = {r["id"]: r.asDict() for r in spark.read.parquet(out).where("error IS NULL").collect()}
    assert set(rows) == {ev.get_id() for ev in first}
    for ev in first:
        row = rows[ev.get_id()]
        attrs = ev.get_attributes()
        for name in ("source", "type", "specversion", "subject", "datacontenttype"):
            assert row[name] == attrs.get(name), name
        assert row["time"].replace(tzinfo=UTC) == attrs["time"]
        assert row["event_date"] == attrs["time"].date()
        assert dict(row["extensions"]) == {"traceid": attrs["traceid"]}
        data = ev.get_data()
        if isinstance(data, bytes):
            assert bytes(row["data"]) == data  # byte for byte
        else:
            assert json.loads(bytes(row["data"])) == data
        assert row["topic"] == topic and row["offset"] >= 0
    bad = spark.read.parquet(out).where("error IS NOT NULL").collect()
    assert len(bad) == 1 and bytes(bad[0]["data"]) == b"this is not a cloudevent" and bad[0]["type"] is None
    assert "not a CloudEvent" in bad[0]["error"]
    # Partitioned by event date and type.
    assert {p.name for p in Path(out).glob("event_date=2024-*")} == {
        "event_date=2024-05-01", "event_date=2024-05-02", "event_date=2024-05-03"}
    assert list(Path(out).glob("event_date=2024-05-01/type=com.example.t1/*.parquet"))

    more = [_event(i) for i in range(100, 105)]
    _produce(kafka_running, topic, more)
    again = run_archive(spark, topic=topic, output=out, checkpoint=ckpt, kafka_options=plain_options, timeout=240)
    assert (again.records, again.malformed) == (5, 0)
    ids = [r["id"] for r in spark.read.parquet(out).where("error IS NULL").select("id").collect()]
    assert sorted(ids) == sorted(ev.get_id() for ev in first + more)  # every offset exactly once


def test_replay_time_window_to_http_with_retries(
    spark: Any, kafka_running: KafkaNode, topic: str, plain_options: dict[str, str], sink: Sink,
    tmp_path: Path,
) -> None:
    t0 = int(time.time() * 1000) - 3_600_000
    before, inside, after = ([_event(i) for i in range(k, k + 4)] for k in (0, 10, 20))
    _produce(kafka_running, topic, before, timestamp_ms=t0)
    _produce(kafka_running, topic, inside, timestamp_ms=t0 + 60_000)
    _produce(kafka_running, topic, after, timestamp_ms=t0 + 120_000)
    sink.script = {"ev-10": [503, 202], "ev-11": [400]}  # one retried then accepted, one refused for good
    window = Window(start=datetime.fromtimestamp((t0 + 30_000) / 1000, UTC),
                    end=datetime.fromtimestamp((t0 + 90_000) / 1000, UTC))
    policy = HttpSinkPolicy(delivery=DeliverySpec(retry=2, backoff_delay=timedelta(milliseconds=20)),
                            concurrency=4, rate=200)

    manifest = run_replay(
        spark, read_topic(spark, topic, plain_options, window), HttpTarget(url=sink.url + "/in", policy=policy),
        run_dir=tmp_path / "run", source={"topic": topic, **window.describe()},
    )
    assert sorted(set(sink.ids("/in"))) == sorted(ev.get_id() for ev in inside)
    assert sink.ids().count("ev-10") == 2 and sink.ids().count("ev-11") == 1  # 400 is not retried
    assert manifest.counts["selected"] == 4
    assert (manifest.counts["sent"], manifest.counts["succeeded"], manifest.counts["failed"]) == (4, 3, 1)
    assert [f["id"] for f in manifest.failed] == ["ev-11"] and manifest.failed[0]["code"] == 400
    written = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert written["counts"] == manifest.counts

    # The filters: attribute equality, a CloudEvents SQL expression as a Trigger has it, and a Spark SQL predicate
    # over the columns, with --dry-run sending nothing. CESQL's errors exclude an event as in a Trigger: reading the
    # absent `subject` is an error, even where the right operand of OR would be true.
    sent_before = len(sink.requests)
    cesql, sql = "subject = 'subject-1' OR traceid != 'trace-21'", "extensions['traceid'] <> 'trace-13'"
    dry = run_replay(
        spark, read_topic(spark, topic, plain_options), HttpTarget(url=sink.url, policy=policy),
        run_dir=tmp_path / "dry", source={"topic": topic}, dry_run=True,
        filters=Filters(equals={"type": "com.example.t1"}, where=cesql),
    )
    assert sorted(r["id"] for r in dry.would_send) == ["ev-1", "ev-13"]  # of t1: 1, 3, 11, 13, 21, 23
    both = run_replay(
        spark, read_topic(spark, topic, plain_options), HttpTarget(url=sink.url, policy=policy),
        run_dir=tmp_path / "dry-sql", source={"topic": topic}, dry_run=True,
        filters=Filters(equals={"type": "com.example.t1"}, where=cesql, where_sql=sql),
    )
    assert [r["id"] for r in both.would_send] == ["ev-1"]
    assert both.filters == {"equals": {"type": "com.example.t1"}, "where": cesql, "where_sql": sql}
    assert len(sink.requests) == sent_before


def test_replay_to_topic_over_sasl_ssl_preserves_headers(
    spark: Any, kafka_running: KafkaNode, topic: str, tmp_path: Path,
) -> None:
    options = dict(spark_kafka_options(connection_from_secret(kafka_running.connection_secret(sasl_ssl=True))))
    assert options["kafka.security.protocol"] == "SASL_SSL"
    events = [_event(i, partitionkey=f"k{i % 2}") for i in range(6)]
    _produce(kafka_running, topic, events, extra_headers=[("traceparent", b"00-abc-def-01")])
    dest = f"replayed.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka_running.client_config())
    for fut in admin.create_topics([NewTopic(dest, 1, 1)]).values():
        fut.result(timeout=30)

    manifest = run_replay(
        spark, read_topic(spark, topic, options, keep_raw=True), TopicTarget(dest, options),
        run_dir=tmp_path / "run", source={"topic": topic},
    )
    assert manifest.counts["succeeded"] == 6

    def records(name: str, n: int) -> dict[str, tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
        consumer = Consumer({**kafka_running.client_config(), "group.id": uuid.uuid4().hex,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([name])
        got: dict[str, tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = {}
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got[f"{msg.key()!r}{msg.value()!r}"] = (msg.key(), msg.value(), list(msg.headers() or []))
        consumer.close()
        return got

    original, replayed = records(topic, 6), records(dest, 6)
    assert replayed == original
    assert all(("traceparent", b"00-abc-def-01") in h for _, _, h in replayed.values())


def test_redrive_strips_dead_letter_extensions_once_per_run(
    spark: Any, kafka_running: KafkaNode, topic: str, plain_options: dict[str, str], sink: Sink,
    tmp_path: Path,
) -> None:
    dead = [_event(i, knativeerrordest=f"{sink.url}/orig", knativeerrorcode="500", knativeerrordata="b29wcw==")
            for i in range(5)]
    _produce(kafka_running, topic, [*dead, dead[0]])  # ev-0 was dead-lettered twice
    _produce_raw(kafka_running, topic, b"\x00garbage")
    sink.script = {"ev-3": [400]}
    policy = HttpSinkPolicy(delivery=DeliverySpec(retry=1, backoff_delay=timedelta(milliseconds=10)))
    run_dir = tmp_path / "redrive"

    def redrive(dry_run: bool = False) -> Any:
        return run_redrive(spark, read_topic(spark, topic, plain_options), url=None, policy=policy,
                           run_dir=run_dir, source={"topic": topic}, dry_run=dry_run)

    dry = redrive(dry_run=True)
    assert sink.requests == []
    assert {r["target"] for r in dry.would_send} == {f"{sink.url}/orig"} and len(dry.would_send) == 5

    first = redrive()
    assert sorted(sink.ids("/orig")) == ["ev-0", "ev-1", "ev-2", "ev-3", "ev-4"]
    for _, headers, _ in sink.requests:
        assert not [h for h in headers if h.startswith("ce-knativeerror")]
        assert headers["ce-traceid"].startswith("trace-")
    assert (first.counts["malformed"], first.counts["succeeded"], first.counts["failed"]) == (1, 4, 1)
    assert first.malformed[0]["error"].startswith("record is not a CloudEvent")

    sink.script = {}
    second = redrive()  # same run directory: only the failed one goes again
    assert second.counts["already_succeeded"] == 4 and second.counts["succeeded"] == 1
    assert sorted(sink.ids("/orig")) == ["ev-0", "ev-1", "ev-2", "ev-3", "ev-3", "ev-4"]

    stats = run_stats(read_topic(spark, topic, plain_options), tmp_path / "stats", title=topic)
    assert (stats["events"], stats["malformed"], stats["dead_letters"]) == (6, 1, 6)
    errors = (tmp_path / "stats" / "errors.csv").read_text()
    assert "500" in errors and "oops" in errors  # knativeerrordata decoded
    assert (tmp_path / "stats" / "chart.png").stat().st_size > 1000


@pytest.mark.timeout(1800)
def test_replay_redrive_and_archive_send_time_as_written(
    spark: Any, kafka_running: KafkaNode, topic: str, plain_options: dict[str, str], sink: Sink, tmp_path: Path,
) -> None:
    # The sender's spelling of `time`, not a re-rendering of the instant (`.789Z` must not become `.789000Z`).
    texts = ["2024-05-01T12:34:56.789Z", "2024-05-01T14:34:56.5+02:00", "2024-05-01T12:34:56Z",
             "2024-05-01T12:34:56.123456789Z"]
    events = [CloudEvent({"id": f"t-{i}", "source": "/tests/time", "type": "com.example.time", "specversion": "1.0",
                          "time": text, "knativeerrordest": f"{sink.url}/orig", "knativeerrorcode": "500"}, b"x")
              for i, text in enumerate(texts)]
    _produce(kafka_running, topic, events, structured_every=2)  # binary and structured records both
    want = {f"t-{i}": text for i, text in enumerate(texts)}
    policy = HttpSinkPolicy(delivery=DeliverySpec(retry=0))

    run_replay(spark, read_topic(spark, topic, plain_options), HttpTarget(url=sink.url + "/replay", policy=policy),
               run_dir=tmp_path / "replay", source={"topic": topic})
    run_redrive(spark, read_topic(spark, topic, plain_options), url=None, policy=policy,
                run_dir=tmp_path / "redrive", source={"topic": topic})
    out = str(tmp_path / "archive")
    run_archive(spark, topic=topic, output=out, checkpoint=f"{out}/_checkpoint", kafka_options=plain_options,
                timeout=240)
    run_replay(spark, read_archive(spark, out), HttpTarget(url=sink.url + "/archive", policy=policy),
               run_dir=tmp_path / "from-archive", source={"archive": out})
    for path in ("/replay", "/orig", "/archive"):
        got = {h["ce-id"]: h["ce-time"] for p, h, _ in sink.requests if p == path}
        assert got == want, path


def _cli(kafka: KafkaNode, *args: str) -> subprocess.CompletedProcess[str]:
    jars = cache_dir() / f"spark-kafka-{SPARK_KAFKA_VERSION}" / "jars"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_KAFKA_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return subprocess.run([sys.executable, "-m", "kafka_eventing.reprocess", *args, "--master", "local[1]",
                           "--jars", str(jars), "--driver-memory", "512m",
                           "--bootstrap-servers", kafka.bootstrap_servers],
                          capture_output=True, text=True, env=env, timeout=600, check=False)




@pytest.mark.timeout(900)
def test_missing_topic_and_empty_window_fail_with_one_line_and_write_nothing(
    kafka_running: KafkaNode, topic: str, tmp_path: Path,
) -> None:
    missing = f"missing.{uuid.uuid4().hex[:8]}"
    out = tmp_path / "archive"
    done = _cli(kafka_running, "archive", "--topic", missing, "--output", str(out))
    assert done.returncode == 4, done.stderr[-3000:]
    assert _one_line(done.stderr) == (
        f"kafka-eventing reprocess archive: topic {missing!r} does not exist on {kafka_running.bootstrap_servers}")
    assert not out.exists()  # no checkpoint a later run would resume from as if the topic had been archived
    admin = AdminClient(kafka_running.client_config())
    assert missing not in admin.list_topics(timeout=30).topics  # and the check did not create it

    _produce(kafka_running, topic, [_event(i) for i in range(3)])
    window = ("--from", "2001-01-01T00:00:00Z", "--to", "2001-01-02T00:00:00Z")
    run_dir, stats = tmp_path / "run", tmp_path / "stats"
    done = _cli(kafka_running, "replay", "--topic", topic, *window, "--to-url", "http://127.0.0.1:9/",
                "--run-dir", str(run_dir))
    assert done.returncode == 4, done.stderr[-3000:]
    line = _one_line(done.stderr)
    assert line.startswith(f"kafka-eventing reprocess replay: no record in topic {topic!r} within ") and "2001" in line
    assert not run_dir.exists()  # no manifest claiming a finished run
    done = _cli(kafka_running, "stats", "--topic", topic, *window, "--out", str(stats))
    assert done.returncode == 4 and _one_line(done.stderr).startswith("kafka-eventing reprocess stats: no record")
    assert not stats.exists()
