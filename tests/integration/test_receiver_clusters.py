"""The real receiver (gunicorn, targets from a YAML file) writing to two real Kafka clusters on loopback: each
target's events go to the cluster its status names, and only there; a KafkaSink's Host is its own address."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from support.receiver import Receiver, read_topic

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.kafka_config import ConnectionRef
from kafka_eventing.localstack.kafka import KafkaNode

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    workdir = tmp_path_factory.mktemp("kafka-second")
    node = KafkaNode(workdir)
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def make_topic(kafka: KafkaNode, name: str) -> None:
    admin = AdminClient({**kafka.client_config(), "log_level": 2})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result(timeout=30)


def annotations(ref: ConnectionRef) -> str:
    return "".join(f"\n    {k}: '{v}'" for k, v in ref.annotations().items())


def event(event_id: str) -> dict[str, str]:
    return {"ce-specversion": "1.0", "ce-id": event_id, "ce-type": "t", "ce-source": "/s",
            "content-type": "application/json"}


def test_each_target_writes_to_its_own_cluster(kafka_running: KafkaNode, second: KafkaNode,
                                               start_receiver: Callable[..., Receiver]) -> None:
    suffix = uuid.uuid4().hex[:8]
    near, far_sink = f"near-{suffix}", f"far-sink-{suffix}"
    far_broker = kb.broker_topic("shop", f"far{suffix}")
    make_topic(kafka_running, near)
    make_topic(second, far_sink)
    make_topic(second, far_broker)
    ref = ConnectionRef(second.bootstrap_servers, checksum="c1")
    yaml = (
        "apiVersion: messaging.knative.dev/v1\nkind: KafkaChannel\nmetadata:\n  name: near\n  namespace: shop\n"
        f"  annotations: {{kafka.eventing.knative.dev/external.topic: {near}}}\n"
        "---\napiVersion: eventing.knative.dev/v1\nkind: Broker\n"
        f"metadata: {{name: far{suffix}, namespace: shop, annotations: {{eventing.knative.dev/broker.class: Kafka}}}}\n"
        f"status:\n  annotations:{annotations(ref)}\n"
        "---\napiVersion: eventing.knative.dev/v1alpha1\nkind: KafkaSink\n"
        f"metadata: {{name: far{suffix}, namespace: shop}}\nspec: {{topic: {far_sink}, contentMode: structured}}\n"
        f"status:\n  annotations:{annotations(ref)}\n")
    receiver = start_receiver(yaml, bootstrap=kafka_running.bootstrap_servers)
    for i in range(4):
        assert receiver.post("/shop/near", b"{}", event(f"c-{i}")).status_code == 202
        assert receiver.post(f"/shop/far{suffix}", b"{}", event(f"b-{i}")).status_code == 202
        answer = receiver.post(f"/shop/far{suffix}", b"{}", {**event(f"s-{i}"), "Host": "kafka-sink-ingress:80"})
        assert answer.status_code == 202, answer.text
    ids = {t: {dict(m.headers()).get("ce_id", b"").decode() for m in read_topic(k, t, 4)}
           for k, t in ((kafka_running, near), (second, far_broker))}
    assert ids == {near: {f"c-{i}" for i in range(4)}, far_broker: {f"b-{i}" for i in range(4)}}
    structured = read_topic(second, far_sink, 4)
    assert {json.loads(m.value())["id"] for m in structured} == {f"s-{i}" for i in range(4)}
    # Nothing on the wrong cluster: the receiver's own has neither of the second's topics.
    own = set(AdminClient(kafka_running.client_config()).list_topics(timeout=10).topics)
    assert far_sink not in own and far_broker not in own
