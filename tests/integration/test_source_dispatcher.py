"""A KafkaSource's dispatcher on the real broker with a real HTTP sink on 127.0.0.1 (standalone: the source read
from a YAML file, as ``kafka-eventing run --source`` runs it; tests/integration/test_source_controller.py covers
the controller and the kube-watched source).

Plain records become CloudEvents exactly as upstream converts them — checked attribute by attribute and byte by
byte; CloudEvent records pass through; several topics share one group; initialOffset; ordered and unordered;
retries and dead letters; ceOverrides.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import CollectorRegistry
from support.dispatcher import KAFKA_EXTRA, InProcess, Subscriber, committed, produce

from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.sources import FileSourceSource
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for

pytestmark = pytest.mark.kafka

NS = "team-a"


def write_source(path: Path, name: str, topics: list[str], sink: str, *, labels: dict[str, str] | None = None,
                 **spec: Any) -> None:
    doc = {"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource",
           "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": labels or {}},
           "spec": {"bootstrapServers": ["ignored-in-standalone:9092"], "topics": topics,
                    "sink": {"uri": sink}, **spec}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)


@pytest.fixture
def topics(kafka_running: KafkaNode) -> Iterator[Callable[[int], str]]:
    admin = AdminClient(kafka_running.client_config())
    made: list[str] = []

    def make(partitions: int = 3) -> str:
        name = f"src.{uuid.uuid4().hex[:12]}"
        for fut in admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                 replication_factor=1)]).values():
            fut.result(timeout=30)
        made.append(name)
        return name

    yield make
    if made and kafka_running.running:
        for fut in admin.delete_topics(made, operation_timeout=10).values():
            try:
                fut.result(timeout=30)
            except Exception:
                pass


@pytest.fixture
def source_dispatch(kafka_running: KafkaNode) -> Iterator[Callable[..., InProcess]]:
    started: list[InProcess] = []

    def make(name: str, path: Path, initial_offset: str = "earliest") -> InProcess:
        settings = Settings(bootstrap_servers=kafka_running.bootstrap_servers, source_namespace=NS,
                            source_name=name, log_level="WARNING", kafka_extra=KAFKA_EXTRA)
        source = FileSourceSource(path, settings, NS, name, poll_interval=0.1)
        dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                       registry=CollectorRegistry(), host="127.0.0.1", port=0,
                                       initial_offset=initial_offset)
        running = InProcess(dispatcher, source).start()  # type: ignore[arg-type]
        started.append(running)
        wait_for(running.ready, 30, "consumer groups joined")
        return running

    try:
        yield make
    finally:
        for running in started:
            running.stop()


def produce_plain(kafka: KafkaNode, topic: str, records: list[dict[str, Any]]) -> None:
    producer = Producer(kafka.client_config())
    for rec in records:
        producer.produce(topic, value=rec.get("value"), key=rec.get("key"), partition=rec.get("partition", 0),
                         headers=rec.get("headers"), timestamp=rec.get("timestamp", 0))
    assert producer.flush(30) == 0


def test_plain_records_become_cloudevents_as_upstream_converts_them(
        kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber, tmp_path: Path,
        source_dispatch: Any) -> None:
    topic = topics(1)
    path = tmp_path / "source.yaml"
    write_source(path, "conv", [topic], http.url("/sink"), labels={ks.LABEL_KEY_TYPE: "string"})
    source_dispatch("conv", path)
    raw = bytes(range(256))
    produce_plain(kafka_running, topic, [
        {"value": b"plain text", "key": b"user-1", "timestamp": 1700000000123,
         "headers": [("X-Trace_ID", b"abc"), ("Weird.Name/9!", "café".encode()), ("Content-Type", b"Text/Plain")]},
        {"value": raw, "key": None, "timestamp": 1700000001000},
        {"value": b"", "key": b"empty", "timestamp": 1700000002000},
        {"value": None, "key": b"tomb", "timestamp": 1700000003000},  # a tombstone
    ])
    wait_for(lambda: len(http.at("/sink")) >= 4, 30, "four converted events")
    got = {r.headers["ce-id"]: r for r in http.at("/sink")}
    assert sorted(got) == [f"partition:0/offset:{i}" for i in range(4)]
    source = f"/apis/v1/namespaces/{NS}/kafkasources/conv#{topic}"
    first = got["partition:0/offset:0"]
    for name, value in {"ce-specversion": "1.0", "ce-type": "dev.knative.kafka.event", "ce-source": source,
                        "ce-subject": "partition:0#0", "ce-time": "2023-11-14T22:13:20.123Z",
                        "ce-key": "user-1", "ce-partitionkey": "user-1", "ce-kafkaheaderxtraceid": "abc",
                        "ce-kafkaheaderweirdname9": "caf%C3%A9", "Content-Type": "text/plain"}.items():
        assert first.headers.get(name) == value, (name, first.headers)
    assert first.body == b"plain text"
    assert not [h for h in first.headers if h.lower().startswith("ce-") and "content" in h.lower()]
    second = got["partition:0/offset:1"]
    assert second.body == raw  # byte for byte
    assert "ce-key" not in second.headers and "ce-partitionkey" not in second.headers
    assert second.headers["ce-time"] == "2023-11-14T22:13:21Z"
    assert got["partition:0/offset:2"].body == b""
    assert got["partition:0/offset:2"].headers["ce-key"] == "empty"
    assert got["partition:0/offset:3"].body == b""
    assert got["partition:0/offset:3"].headers["ce-key"] == "tomb"


@pytest.mark.parametrize(("key_type", "key", "expected"), [
    ("int", struct.pack(">i", -42), "-42"),
    ("float", struct.pack(">d", 2.5), "2.5"),
    ("byte-array", b"\x00\xff\x10", base64.b64encode(b"\x00\xff\x10").decode()),
])
def test_key_types(kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber,
                   tmp_path: Path, source_dispatch: Any, key_type: str, key: bytes, expected: str) -> None:
    topic = topics(1)
    path = tmp_path / "source.yaml"
    write_source(path, "keys", [topic], http.url("/k"), labels={ks.LABEL_KEY_TYPE: key_type})
    source_dispatch("keys", path)
    produce_plain(kafka_running, topic, [{"value": b"v", "key": key}])
    wait_for(lambda: len(http.at("/k")) >= 1, 30, "one event")
    rec = http.at("/k")[0]
    assert rec.headers["ce-key"] == rec.headers["ce-partitionkey"] == expected


def test_cloudevents_pass_through_and_overrides_apply_to_all(
        kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber, tmp_path: Path,
        source_dispatch: Any) -> None:
    t1, t2 = topics(3), topics(2)
    path = tmp_path / "source.yaml"
    write_source(path, "multi", [t1, t2], http.url("/m"), ceOverrides={"extensions": {"team": "payments"}},
                 ordering="unordered", consumerGroup="my-group")
    d = source_dispatch("multi", path)
    assert {s["uid"] for s in d.get("/status")["status"]["subscribers"]} == {t1, t2}
    ids = produce(kafka_running, t1, 6)  # binary-mode CloudEvents
    produce_plain(kafka_running, t2, [{"value": b"p", "partition": 1}])
    wait_for(lambda: len(http.at("/m")) >= 7, 30, "seven events from two topics")
    events = {r.headers["ce-id"]: r for r in http.at("/m")}
    assert set(ids) <= set(events)
    ce = events[ids[0]]
    assert ce.headers["ce-source"] == "/test" and ce.headers["ce-type"] == "test.event"
    assert ce.headers["Content-Type"] == "application/json"
    assert ce.headers["ce-team"] == "payments"
    plain = events["partition:1/offset:0"]
    assert plain.headers["ce-source"] == f"/apis/v1/namespaces/{NS}/kafkasources/multi#{t2}"
    assert plain.headers["ce-team"] == "payments"
    # Both topics' members are in the one group, and it commits each topic's offsets.
    wait_for(lambda: committed(kafka_running, t2, "my-group", 2)[1] == 1, 15, "t2 committed in my-group")
    wait_for(lambda: sum(committed(kafka_running, t1, "my-group", 3)) == 6, 15, "t1 committed in my-group")


@pytest.mark.parametrize("ordering", ["ordered", "unordered"])
def test_ordering(kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber,
                  tmp_path: Path, source_dispatch: Any, ordering: str) -> None:
    topic = topics(1)
    # The first event is slow: ordered delivery holds the rest behind it, unordered does not.
    http.behaviours["/o"] = lambda r, _a: (200, {}, b"", 0.5 if r.body == b"0" else 0.0)
    path = tmp_path / "source.yaml"
    write_source(path, "ord", [topic], http.url("/o"), ordering=ordering)
    source_dispatch("ord", path)
    produce_plain(kafka_running, topic, [{"value": str(i).encode()} for i in range(10)])
    wait_for(lambda: len(http.at("/o")) >= 10, 30, "ten events")
    arrival = [r.body for r in http.at("/o")]
    if ordering == "ordered":
        assert arrival == [str(i).encode() for i in range(10)]
        assert http.max_active == 1
    else:
        assert arrival[0] == b"0" and http.max_active > 1  # started first, the rest overtook it


def test_retries_and_dead_letter_of_a_converted_record(
        kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber, tmp_path: Path,
        source_dispatch: Any) -> None:
    topic = topics(1)
    http.behaviours["/fail"] = lambda _r, _a: (503, {}, b"down", 0.0)
    path = tmp_path / "source.yaml"
    write_source(path, "dlq", [topic], http.url("/fail"), ceOverrides={"extensions": {"env": "test"}},
                 delivery={"retry": 2, "backoffDelay": "PT0.02S", "deadLetterSink": {"uri": http.url("/dls")}})
    source_dispatch("dlq", path)
    produce_plain(kafka_running, topic, [{"value": b"\x01payload", "key": b"k1", "timestamp": 1700000000500,
                                          "headers": [("h", b"v")]}])
    wait_for(lambda: len(http.at("/dls")) >= 1, 30, "the dead letter")
    assert len(http.at("/fail")) == 3  # 1 + 2 retries, each the same converted event
    assert {r.headers["ce-id"] for r in http.at("/fail")} == {"partition:0/offset:0"}
    dead = http.at("/dls")[0]
    assert dead.body == b"\x01payload"
    for name, value in {"ce-id": "partition:0/offset:0", "ce-type": ks.EVENT_TYPE, "ce-key": "k1",
                        "ce-partitionkey": "k1", "ce-kafkaheaderh": "v", "ce-env": "test",
                        "ce-knativeerrorcode": "503", "ce-knativeerrordest": http.url("/fail")}.items():
        assert dead.headers.get(name) == value, (name, dead.headers)
    assert datetime.fromisoformat(dead.headers["ce-time"]) == datetime(2023, 11, 14, 22, 13, 20, 500000, UTC)
    wait_for(lambda: committed(kafka_running, topic, "knative-kafka-source-uid-dlq", 1) == [1], 15, "committed")


@pytest.mark.parametrize("initial_offset", ["earliest", "latest"])
def test_initial_offset_of_a_new_group(kafka_running: KafkaNode, topics: Callable[[int], str],
                                       http: Subscriber, tmp_path: Path, source_dispatch: Any,
                                       initial_offset: str) -> None:
    topic = topics(1)
    produce_plain(kafka_running, topic, [{"value": b"before"}])
    path = tmp_path / "source.yaml"
    write_source(path, "off", [topic], http.url("/i"), initialOffset=initial_offset)
    source_dispatch("off", path, initial_offset=initial_offset)
    produce_plain(kafka_running, topic, [{"value": b"after"}])
    wait_for(lambda: any(r.body == b"after" for r in http.at("/i")), 30, "the event after the start")
    time.sleep(0.5)
    bodies = [r.body for r in http.at("/i")]
    assert bodies == ([b"before", b"after"] if initial_offset == "earliest" else [b"after"])


def test_a_record_whose_headers_cannot_be_sent_is_skipped_and_the_rest_flow(
        kafka_running: KafkaNode, topics: Callable[[int], str], http: Subscriber, tmp_path: Path,
        source_dispatch: Any) -> None:
    """A ``content-type`` header carrying CR/LF would inject a header into the request, and the HTTP client refuses
    it on every attempt and every dead letter: the record is skipped (counted as ``invalid_header``, logged), and
    the records behind it still flow, in order, and are committed. Bytes that are not UTF-8 in another header
    arrive as upstream renders them."""
    topic = topics(1)
    path = tmp_path / "source.yaml"
    write_source(path, "hdr", [topic], http.url("/ok"),
                 delivery={"retry": 1, "backoffDelay": "PT0.02S", "deadLetterSink": {"uri": http.url("/dls")}})
    source_dispatch("hdr", path)
    produce_plain(kafka_running, topic, [
        {"value": b"before"},
        {"value": b"evil", "headers": [("content-type", b"text/plain\r\nX-Evil: 1")]},
        {"value": b"odd", "headers": [("odd", b"\xff\x00z")]},
        {"value": b"after"},
    ])
    wait_for(lambda: any(r.body == b"after" for r in http.at("/ok")), 30, "the records behind the bad one")
    wait_for(lambda: committed(kafka_running, topic, "knative-kafka-source-uid-hdr", 1) == [4], 15, "all committed")
    assert [r.body for r in http.at("/ok")] == [b"before", b"odd", b"after"]
    assert not [r for r in [*http.at("/ok"), *http.at("/dls")] if "x-evil" in {h.lower() for h in r.headers}]
    assert http.at("/dls") == []  # a dead letter would carry the same header
    odd = next(r for r in http.at("/ok") if r.body == b"odd")
    assert odd.headers["ce-kafkaheaderodd"] == "%EF%BF%BD%00z"  # Java's new String(bytes, UTF_8), percent-encoded
