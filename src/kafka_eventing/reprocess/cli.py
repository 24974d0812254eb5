"""``kafka-eventing reprocess <archive|replay|redrive|stats> ...`` — the offline jobs' command line.

The Kafka connection comes from the same settings and connection Secret as every other role
(``KE_BOOTSTRAP_SERVERS``, ``KE_KAFKA_SECRET_DIR``, ``KE_KAFKA_PROVIDER``; flags override them).
Exit codes: 0 done, 2 bad arguments or configuration, 3 some deliveries failed (see the manifest), 4 nothing to
read (the topic does not exist, or the window holds no record): one line says which, and nothing is written — no
archive, checkpoint, manifest or stats a later run could take for a finished one; 5 no executor started on a
cluster master within ``--executor-timeout`` (image, pull secret, RBAC or resources: one line says so, nothing is
written, and stopping the session removes the executors Spark asked for), or the Kubernetes API refused the driver
or could not be reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_eventing.cesql import CesqlParseError
from kafka_eventing.core import logging as ke_logging
from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError
from kafka_eventing.core.kafka_config import (
    KafkaConfigError,
    KafkaConnection,
    KafkaConnectionError,
    check_connection,
    connection_from_settings,
)
from kafka_eventing.core.settings import Settings, SettingsError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from kafka_eventing.reprocess.kafka_options import SparkKafkaOptions
    from kafka_eventing.reprocess.replay import Filters
    from kafka_eventing.reprocess.sources import Window

log = logging.getLogger("kafka_eventing.reprocess")
EXIT_USAGE, EXIT_FAILED_DELIVERIES, EXIT_NO_INPUT, EXIT_NO_EXECUTOR = 2, 3, 4, 5


class NoInputError(Exception):
    """Nothing to read: the job stops before it writes anything."""


class NoExecutorError(Exception):
    """A cluster master started no executor in time: the job stops before it writes anything."""


def _await_executor(spark: SparkSession, master: str, timeout: float, started: float) -> None:
    """On a cluster master, wait until ``timeout`` s after ``started`` (the session's start, which itself waits up
    to ``spark.scheduler.maxRegisteredResourcesWaitingTime`` for executors) for the first executor to register.
    Spark alone waits for ever when none can start (a missing image, a Role without pods/create, more memory than
    any worker offers), logging a WARN line now and then; a Job or CronJob would hang until its deadline, its
    executor pods pending."""
    if master.startswith("local"):
        return
    # The driver counts itself among the block managers; any other entry is a registered executor.
    # (PySpark's StatusTracker has no executor list: the JVM context's is read.)
    deadline = started + timeout
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 2:
        if time.monotonic() > deadline:
            raise NoExecutorError(
                f"no executor started within {timeout:g} s on {master} (check the executor image and its pull "
                "secret, the driver's RBAC for pods, and that a node or worker offers the executor's cores and "
                "memory)")
        time.sleep(0.5)


def _session_problem(exc: Exception, master: str) -> NoExecutorError | None:
    """The Kubernetes API's refusal (403 for a Role without pods/list, 401 for a bad token) or absence that made
    the driver's SparkContext fail to start, as one line; None for anything else (a bug, shown whole)."""
    from py4j.protocol import Py4JJavaError

    if not master.startswith("k8s://") or not isinstance(exc, Py4JJavaError):
        return None
    server = master.removeprefix("k8s://")
    causes: list[Any] = []
    cause = exc.java_exception
    while cause is not None and len(causes) < 20:
        causes.append(cause)
        cause = cause.getCause()
    for item in causes:
        if item.getClass().getName() == "io.fabric8.kubernetes.client.KubernetesClientException" and \
                item.getCode() > 0:  # -1: no HTTP answer at all
            # The client's message names the request (verb, URL) and the API's Status message; one line of it.
            status = item.getStatus()
            reason = " ".join(str(item.getMessage() or (status.getMessage() if status else "")).split())[:600]
            return NoExecutorError(f"the Kubernetes API at {server} refused the driver: HTTP {item.getCode()}: "
                                   f"{reason} (check the driver's ServiceAccount and Role: pods and configmaps in "
                                   "its namespace)")
    names = [c.getClass().getName() for c in causes]
    unreachable = ("ConnectException", "UnknownHostException", "SSLException", "SSLHandshakeException")
    # The first cause below the Kubernetes client's own "An error has occurred." names the address.
    below = [c for n, c in zip(names, causes, strict=True) if not n.startswith("io.fabric8.")] or causes
    what = f"{below[0].getClass().getSimpleName()}: {below[0].getMessage()}"
    if any(n.endswith(unreachable) for n in names):
        return NoExecutorError(f"the Kubernetes API at {server} could not be reached: {what}")
    if any(n.startswith("io.fabric8.") for n in names):
        return NoExecutorError(f"the Kubernetes client of the driver failed ({server}): {what}")
    return None


def _check_topic(connection: KafkaConnection, topic: str, timeout: float = 30.0) -> None:
    """The topic exists: Spark's Kafka source would read a missing one as empty (or a broker with topic
    auto-creation would create it), and an archive run would commit a checkpoint for a topic that is not there."""
    from confluent_kafka.admin import AdminClient

    check_connection(connection, timeout)
    metadata = AdminClient(connection.admin_config(log_level=0)).list_topics(timeout=timeout)
    if topic not in metadata.topics or metadata.topics[topic].error is not None:
        servers = connection.config.get("bootstrap.servers")
        raise NoInputError(f"topic {topic!r} does not exist on {servers}")


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spark and kafka")
    g.add_argument("--master", default="local[*]",
                   help="Spark master: local[N] (default local[*]), spark://host:port (standalone), "
                        "k8s://https://kubernetes.default.svc (executor pods; see docs/reprocessing.md)")
    g.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="Spark configuration, repeatable (e.g. spark.executor.instances=4), as spark-submit's")
    g.add_argument("--executor-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="on a cluster master, fail (exit 5) when no executor has started this long after the "
                        "session's start (default 300)")
    g.add_argument("--jars", action="append", help="extra jar files or folders (default: the setup cache)")
    g.add_argument("--driver-memory", default="1g")
    g.add_argument("--bootstrap-servers", help="overrides KE_BOOTSTRAP_SERVERS")
    g.add_argument("--kafka-secret-dir", type=Path, help="mounted connection Secret (overrides KE_KAFKA_SECRET_DIR)")
    g.add_argument("--kafka-provider", help="provider preset (overrides KE_KAFKA_PROVIDER)")


def _topic_args(p: argparse.ArgumentParser, *, archive: bool) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--topic", help="Kafka topic")
    src.add_argument("--channel", help="KafkaChannel as <namespace>/<name> (topic from KE_TOPIC_TEMPLATE)")
    if archive:
        src.add_argument("--archive", help="read an archive written by `reprocess archive` instead of a topic")
    w = p.add_argument_group("window (record timestamps, [from, to)) or Spark offsets JSON")
    w.add_argument("--from", dest="start", help="RFC 3339 start, inclusive")
    w.add_argument("--to", dest="end", help="RFC 3339 end, exclusive")
    w.add_argument("--from-offsets", help='e.g. {"topic":{"0":100,"1":-2}} (-2 earliest)')
    w.add_argument("--to-offsets", help='e.g. {"topic":{"0":200,"1":-1}} (-1 latest)')


def _delivery_args(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("HTTP delivery (the dispatcher's retry policy)")
    d.add_argument("--retry", type=int, default=3)
    d.add_argument("--backoff-policy", default="exponential", choices=("exponential", "linear"))
    d.add_argument("--backoff-delay", default="PT0.2S", help="ISO-8601 duration")
    d.add_argument("--timeout", default="PT30S", help="per-attempt, ISO-8601 duration")
    d.add_argument("--concurrency", type=int, default=16, help="requests in flight, whole job")
    d.add_argument("--rate", type=float, help="events per second, whole job (default unlimited)")
    d.add_argument("--retry-after-max", type=float, default=60.0, help="cap on a honoured Retry-After, seconds")
    d.add_argument("--parallelism", type=int, help="Spark tasks sending (default: Spark's default parallelism)")
    p.add_argument("--run-dir", type=Path, help="manifest + results; reuse it to resume (default ./reprocess-runs/...)")
    p.add_argument("--dry-run", action="store_true", help="select and report, send nothing")


def _where_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--where", metavar="CESQL",
                   help="CloudEvents SQL expression, as in a Trigger's filters (e.g. \"type LIKE 'com.example.%%' AND "
                        "region = 'eu'\"); an event is taken when it is true without error (docs/cesql.md)")
    p.add_argument("--where-sql", metavar="PREDICATE",
                   help="Spark SQL predicate over the decoded row's columns (id, source, type, time, subject, "
                        "extensions['name'], data, topic, partition, offset, timestamp, ...)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-eventing reprocess", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="job", required=True)

    a = sub.add_parser("archive", help="topic → Parquet by event date and type, incremental (exactly once)")
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--topic")
    src.add_argument("--channel", help="<namespace>/<name>")
    a.add_argument("--output", required=True, help="archive folder or URI (file:, s3a:, gs:, abfss: ...)")
    a.add_argument("--checkpoint", help="default <output>/_checkpoint (keep it with the archive)")
    a.add_argument("--max-offsets-per-trigger", type=int, help="split a large catch-up into batches")
    a.add_argument("--allow-data-loss", action="store_true",
                   help="continue when offsets were deleted by retention before being archived")
    _common(a)

    r = sub.add_parser("replay", help="topic window or archive → filter → HTTP target or topic")
    _topic_args(r, archive=True)
    r.add_argument("--where-attr", action="append", default=[], metavar="NAME=VALUE",
                   help="attribute (or extension) equality; repeatable, all must match")
    _where_args(r)
    sink = r.add_mutually_exclusive_group(required=True)
    sink.add_argument("--to-url", help="HTTP target: a subscriber, a channel's or a broker's ingress")
    sink.add_argument("--to-topic", help="Kafka topic (same connection); headers are preserved")
    _delivery_args(r)
    _common(r)

    d = sub.add_parser("redrive", help="dead-letter topic → original destination without knativeerror* extensions")
    _topic_args(d, archive=False)
    d.add_argument("--to-url", help="send everything here instead of each event's knativeerrordest")
    d.add_argument("--where-attr", action="append", default=[], metavar="NAME=VALUE",
                   help="attribute (or extension) equality; repeatable, all must match")
    _where_args(d)
    _delivery_args(d)
    _common(d)

    s = sub.add_parser("stats", help="counts per type/source/hour and dead-letter reasons → Parquet, CSV, PNG")
    _topic_args(s, archive=True)
    s.add_argument("--out", required=True, type=Path)
    _common(s)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env()
    changes: dict[str, Any] = {}
    if args.bootstrap_servers:
        changes["bootstrap_servers"] = args.bootstrap_servers
    if args.kafka_secret_dir:
        changes["kafka_secret_dir"] = args.kafka_secret_dir
    if args.kafka_provider:
        changes["kafka_provider"] = args.kafka_provider
    return dataclasses.replace(settings, **changes)


def _topic(args: argparse.Namespace, settings: Settings) -> str:
    if args.topic:
        return str(args.topic)
    namespace, sep, name = str(args.channel).partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"--channel {args.channel!r} must be <namespace>/<name>")
    return settings.topic_for(namespace, name)


def _window(args: argparse.Namespace) -> Window:
    from kafka_eventing.reprocess.sources import Window, parse_offsets, parse_time

    return Window(
        start=parse_time(args.start) if args.start else None,
        end=parse_time(args.end) if args.end else None,
        starting_offsets=parse_offsets(args.from_offsets) if args.from_offsets else None,
        ending_offsets=parse_offsets(args.to_offsets) if args.to_offsets else None,
    )


def _spark_conf(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise ValueError(f"--conf {item!r} is not spark.KEY=VALUE")
        out[key.strip()] = value
    return out


def _equals(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--where-attr {item!r} is not NAME=VALUE")
        out[name.strip()] = value
    return out


def _filters(args: argparse.Namespace) -> Filters:
    """The run's filters, the CESQL one parsed already: a typo fails here, before Spark starts."""
    from kafka_eventing.reprocess.replay import Filters

    filters = Filters(equals=_equals(args.where_attr), where=args.where, where_sql=args.where_sql)
    try:
        filters.check()
    except CesqlParseError as exc:
        raise CesqlParseError(f"--where is not CloudEvents SQL: {exc.message}") from None
    return filters


def _policy(args: argparse.Namespace) -> Any:
    from kafka_eventing.reprocess.http_sink import HttpSinkPolicy

    spec = DeliverySpec.from_dict({"retry": args.retry, "backoffPolicy": args.backoff_policy,
                                   "backoffDelay": args.backoff_delay, "timeout": args.timeout})
    return HttpSinkPolicy(delivery=spec, concurrency=args.concurrency, rate=args.rate,
                          retry_after_max=args.retry_after_max)


def print_summary(summary: Mapping[str, Any], out: Any = None) -> None:
    """The final table: one ``name  value`` line per count, readable in a Job's log."""
    stream = out or sys.stdout
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    width = max((len(k) for k in flat), default=0)
    print("-" * (width + 24), file=stream)
    for key, value in flat.items():
        print(f"{key:<{width}}  {value}", file=stream)
    print("-" * (width + 24), file=stream)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
        ke_logging.configure(settings.log_level, "console")
        connection = connection_from_settings(settings)
        topic = _topic(args, settings) if getattr(args, "topic", None) or getattr(args, "channel", None) else None
        window = _window(args) if args.job != "archive" else None
        policy = _policy(args) if args.job in ("replay", "redrive") else None
        filters = _filters(args) if args.job in ("replay", "redrive") else None
        conf = _spark_conf(args.conf)
    except (SettingsError, KafkaConfigError, DeliverySpecError, CesqlParseError, ValueError) as exc:
        return _fail(args.job, exc, EXIT_USAGE)
    try:
        if topic is not None:
            _check_topic(connection, topic)
    except NoInputError as exc:
        return _fail(args.job, exc, EXIT_NO_INPUT)
    except KafkaConnectionError as exc:
        return _fail(args.job, exc, EXIT_USAGE)

    from kafka_eventing.reprocess.kafka_options import spark_kafka_options
    from kafka_eventing.reprocess.session import build_session

    options = spark_kafka_options(connection)
    log.info("kafka options %s", options.redacted())  # the jaas config (password) never reaches a log
    started = time.monotonic()
    try:
        spark = build_session(master=args.master, app_name=f"kafka-eventing-{args.job}", jars=args.jars,
                              driver_memory=args.driver_memory, conf=conf)
    except Exception as exc:  # py4j's error wraps the JVM's: one line from it, not a Java trace
        problem = _session_problem(exc, args.master)
        if problem is None:
            raise
        return _fail(args.job, problem, EXIT_NO_EXECUTOR)
    try:
        _await_executor(spark, args.master, args.executor_timeout, started)
        return _run(args, spark, options, topic=topic, window=window, policy=policy, filters=filters)
    except NoInputError as exc:
        return _fail(args.job, exc, EXIT_NO_INPUT)
    except NoExecutorError as exc:
        return _fail(args.job, exc, EXIT_NO_EXECUTOR)
    finally:
        spark.stop()


def _fail(job: str, exc: Exception, code: int) -> int:
    """One line on stderr naming the job, and its exit code."""
    print(f"kafka-eventing reprocess {job}: {exc}", file=sys.stderr)
    return code


def _source(
    spark: SparkSession, args: argparse.Namespace, options: SparkKafkaOptions, topic: str | None, window: Window,
    *, keep_raw: bool = False,
) -> tuple[DataFrame, dict[str, Any]]:
    from kafka_eventing.reprocess.sources import read_archive, read_topic

    if getattr(args, "archive", None):
        events, source = read_archive(spark, args.archive, window), {"archive": args.archive, **window.describe()}
    else:
        assert topic is not None
        events = read_topic(spark, topic, options, window, keep_raw=keep_raw)
        source = {"topic": topic, **window.describe()}
    if events.isEmpty():
        where = f"archive {args.archive}" if getattr(args, "archive", None) else f"topic {topic!r}"
        bounds = {k: v for k, v in window.describe().items() if v is not None}
        raise NoInputError(f"no record in {where}" + (f" within {bounds}" if bounds else ""))
    return events, source


def _run(
    args: argparse.Namespace, spark: SparkSession, options: SparkKafkaOptions, *, topic: str | None,
    window: Window | None, policy: Any, filters: Filters | None,
) -> int:
    from kafka_eventing.reprocess.replay import HttpTarget, TopicTarget, run_redrive, run_replay

    if args.job == "archive":
        from kafka_eventing.reprocess.archive import run_archive

        assert topic is not None
        output = str(args.output).rstrip("/")
        result = run_archive(spark, topic=topic, output=output, checkpoint=args.checkpoint or f"{output}/_checkpoint",
                             kafka_options=options, max_offsets_per_trigger=args.max_offsets_per_trigger,
                             fail_on_data_loss=not args.allow_data_loss)
        print_summary(result.summary())
        return 0
    assert window is not None
    if args.job == "stats":
        from kafka_eventing.reprocess.stats import run_stats

        events, source = _source(spark, args, options, topic, window)
        print_summary({**run_stats(events, args.out, title=str(topic or args.archive)), "source": source})
        return 0
    run_dir = args.run_dir or Path("reprocess-runs") / f"{args.job}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    assert filters is not None
    if args.job == "replay":
        to_topic = bool(args.to_topic)
        events, source = _source(spark, args, options, topic, window, keep_raw=to_topic)
        target: HttpTarget | TopicTarget = (
            TopicTarget(args.to_topic, options) if to_topic
            else HttpTarget(url=args.to_url, policy=policy, parallelism=args.parallelism)
        )
        manifest = run_replay(spark, events, target, run_dir=run_dir, source=source, filters=filters,
                              dry_run=args.dry_run)
    else:
        events, source = _source(spark, args, options, topic, window)
        manifest = run_redrive(spark, events, url=args.to_url, policy=policy, run_dir=run_dir, source=source,
                               filters=filters, dry_run=args.dry_run, parallelism=args.parallelism)
    print_summary({"job": manifest.job, "dry_run": manifest.dry_run, "counts": manifest.counts,
                   "seconds": manifest.seconds, "manifest": str(manifest.path)})
    for failed in manifest.failed[:20]:
        print(f"failed: id={failed['id']} source={failed['source']} code={failed['code']} {failed['error']}")
    for bad in manifest.malformed[:20]:
        print(f"malformed: {bad['topic']}/{bad['partition']}@{bad['offset']}: {bad['error']}")
    return EXIT_FAILED_DELIVERIES if manifest.counts.get("failed") else 0
