"""The receiver as it runs: a real gunicorn subprocess in front of the real broker.

Events are read back from the topic and compared attribute by attribute; the broker is stopped and started
under the receiver; channels come and go through the channels file and through the real kube-apiserver; SIGTERM
loses no accepted event; fuzzed requests never get a 500 nor crash a worker.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st
from support.receiver import (
    Receiver,
    binary_headers,
    channels_yaml,
    read_all,
    read_topic,
    wait_until,
    worker_pids,
)

from fuzzing import ALLOWED, random_requests, structured_requests
from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.channel_source import VERSION
from kafka_eventing.core.channels import ANNOTATION_EXTERNAL_TOPIC, GROUP, KIND, PLURAL
from kafka_eventing.localstack.kafka import KafkaNode
from promtool import assert_promtool_passes
from waiting import NotYet, wait_for

pytestmark = pytest.mark.kafka

















def test_binary_structured_and_batch_round_trip(kafka_running: KafkaNode, topic: str,
                                                start_receiver: Callable[..., Receiver]) -> None:
    structured_topic = topic  # same topic, two channels writing it in the two content modes
    receiver = start_receiver(channels_yaml(("ns", "bin", topic, "binary"), ("ns", "str", structured_topic,
                                                                                  "structured")),
                              bootstrap=kafka_running.bootstrap_servers)
    data = bytes(range(256)) * 4  # not UTF-8, not JSON: must arrive byte for byte
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    res = receiver.post("/", data, {**binary_headers("b-1", **{"ce-partitionkey": "k1", "ce-ext": "v"}),
                                    "Host": "bin-kn-channel.ns.svc.cluster.local", "traceparent": trace})
    assert res.status_code == 202, res.text
    structured = {"specversion": "1.0", "id": "s-1", "source": "/itest", "type": "itest.event",
                  "subject": "subj", "datacontenttype": "application/json", "data": {"a": [1, 2]}}
    res = receiver.post("/ns/str", json.dumps(structured).encode(),
                        {"content-type": "application/cloudevents+json"})
    assert res.status_code == 202, res.text
    batch = [{"specversion": "1.0", "id": f"batch-{i}", "source": "/itest", "type": "itest.batch",
              "data": f"item {i}"} for i in range(3)]
    res = receiver.post("/ns/bin", json.dumps(batch).encode(),
                        {"content-type": "application/cloudevents-batch+json"})
    assert res.status_code == 202, res.text

    messages = {event_from_kafka(m.headers(), m.value()).get_id(): m for m in read_topic(kafka_running, topic, 5)}
    assert set(messages) == {"b-1", "s-1", "batch-0", "batch-1", "batch-2"}

    msg = messages["b-1"]
    event = event_from_kafka(msg.headers(), msg.value())
    assert msg.key() == b"k1"
    assert msg.value() == data
    attrs = event.get_attributes()
    assert attrs["source"] == "/itest"
    assert attrs["type"] == "itest.event"
    assert attrs["ext"] == "v"
    assert attrs["datacontenttype"] == "application/octet-stream"
    assert event.get_data() == data
    assert dict(msg.headers())["traceparent"] == trace.encode()

    msg = messages["s-1"]
    assert dict(msg.headers())["content-type"].startswith(b"application/cloudevents+json")
    assert msg.key() == b"subj"
    event = event_from_kafka(msg.headers(), msg.value())
    for name in ("specversion", "source", "type", "subject", "datacontenttype"):
        assert event.get_attributes()[name] == structured[name]
    data = event.get_data()  # structured JSON data comes back as the JSON value
    assert (json.loads(data) if isinstance(data, bytes) else data) == structured["data"]

    for i in range(3):
        event = event_from_kafka(messages[f"batch-{i}"].headers(), messages[f"batch-{i}"].value())
        assert event.get_type() == "itest.batch"
        # No datacontenttype: the data is the member's JSON text as sent, and none is invented in binary mode.
        assert messages[f"batch-{i}"].value() == json.dumps(f"item {i}").encode()
        assert "content-type" not in dict(messages[f"batch-{i}"].headers())

    # Each worker buffers its counts for a few milliseconds (LoopTally), and either worker may serve the scrape.
    counted = 'kafka_receiver_events_total{channel="ns/bin",code="202"} 2.0'

    def both_counted() -> bool:
        text = httpx.get(receiver.url + "/metrics", timeout=5).text
        if counted not in text:
            raise NotYet([line for line in text.splitlines() if line.startswith("kafka_receiver_events_total")])
        return True

    wait_for(both_counted, 30, "both binary events counted")
    # What gunicorn's workers serve together (multiprocess mode), after traffic: Prometheus' naming rules hold.
    assert_promtool_passes(httpx.get(receiver.url + "/metrics", timeout=5).text, "the receiver's /metrics")


def test_sasl_ssl_listener_from_secret_files(kafka_running: KafkaNode, topic: str, tmp_path: Path,
                                             start_receiver: Callable[..., Receiver]) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    for key, value in kafka_running.connection_secret(sasl_ssl=True).items():
        (secret / key).write_text(value)
    receiver = start_receiver(channels_yaml(("ns", "tls", topic, "binary")),
                              env={"KE_KAFKA_SECRET_DIR": str(secret)})
    res = receiver.post("/ns/tls", b"over tls", binary_headers("tls-1"))
    assert res.status_code == 202, res.text
    [msg] = read_topic(kafka_running, topic, 1)
    assert msg.value() == b"over tls"
    log_text = receiver.log.read_text()
    assert kafka_running.scram_user.password not in log_text


def test_channels_added_and_removed_at_runtime(kafka_running: KafkaNode, topic: str,
                                               start_receiver: Callable[..., Receiver]) -> None:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers)
    assert receiver.post("/ns/b", b"x", binary_headers("1")).status_code == 404
    receiver.write_channels(channels_yaml(("ns", "a", topic, "binary"), ("ns", "b", topic, "binary")))
    wait_until(lambda: receiver.post("/ns/b", b"x", binary_headers("2")).status_code == 202, 10, "channel b")
    receiver.write_channels(channels_yaml(("ns", "b", topic, "binary")))
    wait_until(lambda: receiver.post("/ns/a", b"x", binary_headers("3")).status_code == 404, 10, "a removed")
    assert receiver.post("/ns/b", b"x", binary_headers("4")).status_code == 202


@pytest.mark.parametrize(("batch_above_rate", "waits_out_the_linger"), [("4000", False), ("0", True)])
def test_a_lone_event_waits_out_the_linger_only_without_the_immediate_producer(
        kafka_running: KafkaNode, topic: str, start_receiver: Callable[..., Receiver], batch_above_rate: str,
        waits_out_the_linger: bool) -> None:
    """With ``linger.ms`` at 1.5 s, a lightly loaded receiver still answers a lone event in one broker round trip
    (its immediate producer took it); with the immediate producer off, the event waits out the linger."""
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers,
                              env={"KE_LINGER_MS": "1500", "KE_BATCH_ABOVE_RATE": batch_above_rate})
    assert receiver.post("/ns/a", b"warm", binary_headers("w")).status_code == 202  # connections and metadata
    for i in range(3):
        began = time.monotonic()
        assert receiver.post("/ns/a", b"x", binary_headers(f"lone-{i}")).status_code == 202
        took = time.monotonic() - began
        assert (took >= 1.5) is waits_out_the_linger, f"lone event answered in {took:.3f} s"
        time.sleep(0.3)  # a quiet gap: the next one is alone again
    assert {m.value() for m in read_topic(kafka_running, topic, 4)} == {b"warm", b"x"}


def test_sigterm_loses_no_accepted_event(kafka_running: KafkaNode, topic: str,
                                         start_receiver: Callable[..., Receiver]) -> None:
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers)
    accepted: list[str] = []
    stop = threading.Event()

    def load(n: int) -> None:
        with httpx.Client(timeout=20) as client:
            i = 0
            while not stop.is_set():
                event_id = f"{n}-{i}"
                try:
                    res = client.post(receiver.url + "/ns/a", content=b"e", headers=binary_headers(event_id))
                except httpx.HTTPError:
                    continue
                if res.status_code == 202:
                    accepted.append(event_id)
                i += 1

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(accepted) >= 50, 20, "some accepted events")
    receiver.proc.send_signal(signal.SIGTERM)
    assert receiver.proc.wait(30) == 0
    stop.set()
    for t in threads:
        t.join(25)
    in_topic = {event_from_kafka(m.headers(), m.value()).get_id()
                for m in read_topic(kafka_running, topic, len(accepted), timeout=20)}
    assert set(accepted) <= in_topic


def test_broker_down_pod_stays_ready_and_answers_503(kafka_running: KafkaNode, topic: str,
                                                     start_receiver: Callable[..., Receiver]) -> None:
    """A Kafka outage is answered per request (503 + Retry-After, never 202) while /readyz stays 200, so the
    pods stay in the Service; once the broker is back (same data) events are accepted again."""
    receiver = start_receiver(channels_yaml(("ns", "a", topic, "binary")), bootstrap=kafka_running.bootstrap_servers,
                              env={"KE_PRODUCE_TIMEOUT_SECONDS": "2"})
    assert receiver.post("/ns/a", b"before", binary_headers("before")).status_code == 202
    kafka_running.stop()
    down_answers: list[int] = []
    try:
        started = time.monotonic()
        # Several requests over more than any probe cache's lifetime: each is answered, none is accepted.
        while time.monotonic() - started < 8 or len(down_answers) < 3:
            res = receiver.post("/ns/a", b"down", binary_headers(f"down-{len(down_answers)}"))
            down_answers.append(res.status_code)
            assert res.status_code == 503, res.text
            assert int(res.headers["Retry-After"]) > 0
            ready = httpx.get(receiver.url + "/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
    finally:
        kafka_running.start()
    wait_until(lambda: receiver.post("/ns/a", b"after", binary_headers("after")).status_code == 202, 60,
               "202 after the broker came back")
    assert httpx.get(receiver.url + "/readyz", timeout=10).status_code == 200
    ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, topic)}
    assert {"before", "after"} <= ids


def test_broker_rejecting_a_record_as_too_large_is_413(kafka_running: KafkaNode,
                                                        start_receiver: Callable[..., Receiver]) -> None:
    """The topic accepts less (max.message.bytes) than the receiver's own body limit: the broker's
    MSG_SIZE_TOO_LARGE is the sender's to fix (413), not a reason to retry (503)."""
    name = f"test.small.{uuid.uuid4().hex[:12]}"
    admin = AdminClient(kafka_running.client_config())
    new = NewTopic(name, num_partitions=1, replication_factor=1, config={"max.message.bytes": "4096"})
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=30)
    receiver = start_receiver(channels_yaml(("ns", "small", name, "binary")),
                              bootstrap=kafka_running.bootstrap_servers)
    res = receiver.post("/ns/small", b"x" * 20_000, binary_headers("big"))
    assert res.status_code == 413, res.text
    assert "Retry-After" not in res.headers
    assert "larger" in res.json()["error"]
    res = receiver.post("/ns/small", b"x" * 100, binary_headers("small"))
    assert res.status_code == 202, res.text
    ids = [event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, name)]
    assert ids == ["small"]






def test_fuzzed_requests_never_a_server_error(kafka_running: KafkaNode, topic: str,
                                              start_receiver: Callable[..., Receiver]) -> None:
    """The unit tier's request strategies, sent over real HTTP to gunicorn with the real broker behind it."""
    receiver = start_receiver(channels_yaml(("shop", "orders", topic, "binary")),
                              bootstrap=kafka_running.bootstrap_servers)
    workers = worker_pids(receiver.proc.pid)
    statuses: dict[int, int] = {}
    unsendable = [0]
    single_accepted = [0]

    with httpx.Client(base_url=receiver.url, timeout=20) as client:

        @settings(max_examples=150, deadline=None, database=None)
        @given(request=st.one_of(random_requests, structured_requests))
        def check(request: tuple[dict[str, str], str, bytes, str, str]) -> None:
            headers, content_type, body, method, path = request
            # Bytes on the wire as a client would send them (header values are latin-1 text).
            raw = [(b"Host", b"orders-kn-channel.shop.svc"),
                   *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())]
            if content_type:
                raw.append((b"content-type", content_type.encode()))
            try:
                res = client.request(method, path, headers=raw, content=body)
            except (httpx.LocalProtocolError, UnicodeError):
                unsendable[0] += 1  # the client itself refuses, e.g. a non-ASCII header name: nothing reached us
                return
            assert res.status_code in ALLOWED, (res.status_code, res.text)
            statuses[res.status_code] = statuses.get(res.status_code, 0) + 1
            if res.status_code >= 400:
                assert "error" in res.json(), res.text
            if res.status_code == 202 and "batch" not in content_type:
                single_accepted[0] += 1

        check()

    # The generator reached both the produce path and the parse errors; most requests went out.
    assert statuses.get(202, 0) > 0 and statuses.get(400, 0) > 0, statuses
    assert unsendable[0] < sum(statuses.values()), (unsendable, statuses)
    # No worker crashed or was replaced, and nothing was logged as an unhandled error.
    assert receiver.proc.poll() is None
    assert worker_pids(receiver.proc.pid) == workers
    assert "Traceback" not in receiver.log.read_text()
    # Every 202 stands for records Kafka holds, and each reads back as a CloudEvent.
    records = read_all(kafka_running, topic)
    assert len(records) >= single_accepted[0], (len(records), single_accepted[0], statuses)
    for msg in records:
        event_from_kafka(msg.headers(), msg.value())


@pytest.mark.kube
def test_channels_from_the_apiserver_at_runtime(kafka_running: KafkaNode, topic: str,
                                                start_receiver: Callable[..., Receiver],
                                                kube_control_plane: Any, kube_namespace: str) -> None:
    """KE_CHANNEL_SOURCE=kube: the receiver follows KafkaChannels on a real kube-apiserver — added (not ready until
    the controller's status says TopicReady, patched here by hand), ready, not ready, ready again, deleted — without
    a restart."""
    from kubernetes import client

    from kafka_eventing.controller.crd import install_crd

    api = kube_control_plane.api_client()
    install_crd(api)
    objects = client.CustomObjectsApi(api)
    ns = kube_namespace
    receiver = start_receiver("", bootstrap=kafka_running.bootstrap_servers,
                              env={"KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig)})
    path = f"/{ns}/orders"
    by_host = {"Host": f"orders-kn-channel.{ns}.svc.cluster.local"}

    def status(event_id: str) -> int:
        return receiver.post(path, event_id.encode(), binary_headers(event_id)).status_code

    def set_topic_ready(ready: bool) -> None:
        condition = {"type": "TopicReady", "status": str(ready), "reason": "TopicReady" if ready else "TopicFailed",
                     "message": "" if ready else "quota exceeded"}
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "orders",
                                                      {"status": {"conditions": [condition]}})

    try:
        assert status("unknown") == 404
        objects.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": "orders", "namespace": ns, "annotations": {ANNOTATION_EXTERNAL_TOPIC: topic}},
            "spec": {"numPartitions": 3}})
        # Known but not reconciled: the topic may not exist yet, so nothing is produced (no controller runs here).
        wait_until(lambda: status("unreconciled") == 503, 30, "503 before the controller reports TopicReady")
        set_topic_ready(True)
        wait_until(lambda: status("added") == 202, 30, "202 once the topic is ready")
        res = httpx.post(receiver.url + "/", content=b"by host", headers={**binary_headers("host"), **by_host},
                         timeout=20)
        assert res.status_code == 202, res.text

        set_topic_ready(False)
        wait_until(lambda: status("not-ready") == 503, 30, "503 while the topic is not ready")
        res = receiver.post(path, b"x", binary_headers("not-ready-2"))
        assert res.status_code == 503 and res.headers["Retry-After"], res.text
        assert "quota exceeded" in res.json()["error"]

        set_topic_ready(True)
        wait_until(lambda: status("ready-again") == 202, 30, "202 once the topic is ready again")

        objects.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "orders")
        wait_until(lambda: status("deleted") == 404, 30, "404 once the channel is deleted")
    finally:
        api.close()
    ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, topic)}
    assert {"added", "host", "ready-again"} <= ids
    assert not ids & {"unknown", "unreconciled", "not-ready", "not-ready-2", "deleted"}
