"""KafkaSource facts: the spec parsed (each refusal's reason) and the conversion of a record that is not a
CloudEvent, attribute by attribute, against upstream's Java conversion (InvalidCloudEventInterceptor,
KeyDeserializer, the CloudEvents Java SDK's HTTP binary encoding)."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest

from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.binding import event_to_http


@dataclass
class FakeRecord:
    value_: bytes | None = b"hello"
    key_: bytes | None = None
    headers_: list[tuple[str, bytes | None]] | None = field(default_factory=list)
    topic_: str = "orders"
    partition_: int = 3
    offset_: int = 42
    timestamp_: int = 1700000000123

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def timestamp(self) -> tuple[int, int]:
        return (1, self.timestamp_)

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> Any:
        return self.headers_


def convert(record: FakeRecord, key_type: str = "string") -> ks.PlainEvent:
    return ks.convert_record("team-a", "my-source", record, key_type)


def test_attributes_as_upstream() -> None:
    event = convert(FakeRecord())
    assert event.attributes == {
        "specversion": "1.0",
        "id": "partition:3/offset:42",
        "source": "/apis/v1/namespaces/team-a/kafkasources/my-source#orders",
        "type": "dev.knative.kafka.event",
        "subject": "partition:3#42",
        "time": "2023-11-14T22:13:20.123Z",
    }
    headers, body = event.http()
    assert body == b"hello"
    assert headers == {
        "ce-specversion": "1.0", "ce-id": "partition:3/offset:42",
        "ce-source": "/apis/v1/namespaces/team-a/kafkasources/my-source#orders",
        "ce-type": "dev.knative.kafka.event", "ce-subject": "partition:3#42", "ce-time": "2023-11-14T22:13:20.123Z",
    }
    assert "content-type" not in headers


@pytest.mark.parametrize(("ms", "text"), [
    (1700000000000, "2023-11-14T22:13:20Z"),  # Java's ISO_OFFSET_DATE_TIME: no fraction when whole seconds
    (1700000000100, "2023-11-14T22:13:20.1Z"),
    (1700000000120, "2023-11-14T22:13:20.12Z"),
    (0, "1970-01-01T00:00:00Z"),
])
def test_time_as_java_prints_it(ms: int, text: str) -> None:
    assert ks.record_time(ms) == text


@pytest.mark.parametrize(("key", "key_type", "expected"), [
    (b"user-1", "string", "user-1"),
    ("ключ".encode(), "string", "ключ"),
    (b"\xff\xfe", "string", "\ufffd\ufffd"),  # not UTF-8: replaced, as Java's new String(bytes, UTF_8)
    (struct.pack(">i", -7), "int", "-7"),
    (struct.pack(">i", 2**31 - 1), "int", "2147483647"),
    (b"12345", "int", "12345"),  # not 4 bytes: read as a string (upstream's fallback)
    (struct.pack(">f", 0.1), "float", "0.1"),  # Float.toString: the shortest digits of the float
    (struct.pack(">f", 1e7), "float", "1.0E7"),
    (struct.pack(">d", 123.5), "float", "123.5"),
    (struct.pack(">d", 0.0001), "float", "1.0E-4"),
    (struct.pack(">d", -0.0), "float", "-0.0"),
    (b"abc", "float", "abc"),  # neither 4 nor 8 bytes
    (b"\x00\x01\xff", "byte-array", base64.b64encode(b"\x00\x01\xff").decode()),
])
def test_key_types(key: bytes, key_type: str, expected: str) -> None:
    event = convert(FakeRecord(key_=key), key_type)
    assert event.attributes["key"] == expected
    assert event.attributes["partitionkey"] == expected


@pytest.mark.parametrize("key", [None, b""])
def test_no_key_no_extensions(key: bytes | None) -> None:
    event = convert(FakeRecord(key_=key))
    assert "key" not in event.attributes
    assert "partitionkey" not in event.attributes


def test_headers_become_extensions() -> None:
    record = FakeRecord(headers_=[
        ("X-Request_ID", b"r-1"), ("Weird.Name/9!", b"caf\xc3\xa9"), ("", b"empty-name"), ("dup", b"one"),
        ("DUP", b"two"), ("no-value", None), ("traceparent", b"00-abc-def-01"), ("Content-Type", b"Text/Plain"),
    ])
    event = convert(record)
    assert event.attributes["kafkaheaderxrequestid"] == "r-1"
    assert event.attributes["kafkaheaderweirdname9"] == "café"
    assert event.attributes["kafkaheader"] == "empty-name"
    assert event.attributes["kafkaheaderdup"] == "two"  # the later header of the same extension wins
    assert event.attributes["kafkaheadernovalue"] == ""
    assert event.attributes["kafkaheadertraceparent"] == "00-abc-def-01"
    assert event.attributes["datacontenttype"] == "text/plain"
    assert not any("content" in k for k in event.attributes if k != "datacontenttype")
    headers, _ = event.http()
    assert headers["content-type"] == "text/plain"
    assert headers["ce-kafkaheaderweirdname9"] == "caf%C3%A9"  # the SDK's percent-encoding of a header value


def test_empty_content_type_header_sets_nothing() -> None:
    assert "datacontenttype" not in convert(FakeRecord(headers_=[("content-type", b"")])).attributes


@pytest.mark.parametrize(("value", "body"), [(None, b""), (b"", b""), (b"\x00\xffraw", b"\x00\xffraw")])
def test_value_is_data_byte_for_byte(value: bytes | None, body: bytes) -> None:
    event = convert(FakeRecord(value_=value))
    assert event.data == value
    assert event.http()[1] == body


def test_dead_letter_event_has_the_same_attributes() -> None:
    event = convert(FakeRecord(key_=b"k", headers_=[("a", b"b"), ("content-type", b"application/json")],
                               value_=b'{"x":1}'))
    sdk = event.cloudevent()
    headers, body = event_to_http(sdk)
    assert body == b'{"x":1}'
    for name in ("id", "source", "type", "subject", "key", "partitionkey", "kafkaheadera"):
        assert headers[f"ce-{name}"] == event.attributes[name]
    assert headers["content-type"] == "application/json"


def source(spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    base = {"bootstrapServers": ["k:9092"], "topics": ["t1"], "sink": {"uri": "http://sink"}}
    return {"metadata": {"namespace": "ns", "name": "s", "uid": "u-1", "labels": labels or {}},
            "spec": {**base, **spec}}


def test_defaults() -> None:
    spec = ks.parse_source(source({}))
    assert spec.consumer_group == "knative-kafka-source-u-1"
    assert spec.initial_offset == "latest"
    assert spec.ordered is True  # upstream's default for a source
    assert spec.consumers == 1
    assert spec.protocol == "PLAINTEXT"
    assert spec.key_type == "string"


def test_every_field() -> None:
    ref = {"secretKeyRef": {"name": "kafka", "key": "k"}}
    spec = ks.parse_source(source({
        "bootstrapServers": ["a:1", "b:2"], "topics": ["t1", "t2"], "consumerGroup": "g", "initialOffset": "earliest",
        "consumers": 3, "ordering": "unordered", "net": {"sasl": {"enable": True, "user": ref, "password": ref,
                                                                   "type": ref},
                                                          "tls": {"enable": True, "caCert": ref}},
        "delivery": {"retry": 2}, "ceOverrides": {"extensions": {"team": "a", "tier": "1"}},
    }, {ks.LABEL_KEY_TYPE: "int"}))
    assert spec.bootstrap_servers == ("a:1", "b:2")
    assert spec.topics == ("t1", "t2")
    assert (spec.consumer_group, spec.initial_offset, spec.consumers, spec.ordered) == ("g", "earliest", 3, False)
    assert spec.protocol == "SASL_SSL"
    assert spec.sasl is not None and spec.sasl.mechanism == ks.SecretKeyRef("kafka", "k")
    assert spec.tls is not None and spec.tls.cert is None
    assert spec.extensions == (("team", "a"), ("tier", "1"))
    assert spec.key_type == "int"


@pytest.mark.parametrize(("patch", "labels", "reason"), [
    ({"bootstrapServers": []}, None, "InvalidBootstrapServers"),
    ({"topics": []}, None, "InvalidTopics"),
    ({"topics": ["a", "a"]}, None, "InvalidTopics"),
    ({"initialOffset": "middle"}, None, "InvalidInitialOffset"),
    ({"consumers": -1}, None, "InvalidConsumers"),
    ({"ordering": "sorted"}, None, "InvalidOrdering"),
    ({}, {ks.LABEL_KEY_TYPE: "uuid"}, "InvalidKeyType"),
    ({"net": {"sasl": {"enable": True, "user": {"secretKeyRef": {"name": "x"}}}}}, None, "InvalidSecretReference"),
    ({"net": {"sasl": {"enable": True}}}, None, "InvalidSecretReference"),
    ({"net": {"tls": {"enable": True, "cert": {"secretKeyRef": {"name": "x", "key": "c"}}}}}, None,
     "InvalidSecretReference"),
    ({"delivery": {"retry": -1}}, None, "InvalidDelivery"),
    ({"ceOverrides": {"extensions": {"Bad-Name": "x"}}}, None, "InvalidCeOverrides"),
])
def test_refused_with_reason(patch: dict[str, Any], labels: dict[str, str] | None, reason: str) -> None:
    with pytest.raises(ks.SourceSpecError) as caught:
        ks.parse_source(source(patch, labels))
    assert caught.value.reason == reason


def test_secret_names() -> None:
    ref = lambda name: {"secretKeyRef": {"name": name, "key": "k"}}  # noqa: E731
    obj = source({"net": {"sasl": {"enable": True, "user": ref("a"), "password": ref("b")},
                          "tls": {"enable": False, "caCert": ref("c")}}})
    assert ks.secret_names(obj) == {"a", "b", "c"}
    assert ks.secret_names(source({})) == set()


KEDA = "keda.autoscaling.knative.dev"


def annotated(annotations: dict[str, str]) -> dict[str, Any]:
    obj = source({})
    obj["metadata"]["annotations"] = annotations
    return obj


def test_autoscaling_absent_or_disabled_is_none() -> None:
    assert ks.parse_source(source({})).autoscaling is None
    assert ks.parse_source(annotated({"autoscaling.eventing.knative.dev/class": "disabled",
                                      "autoscaling.eventing.knative.dev/max-scale": "4"})).autoscaling is None


def test_autoscaling_defaults_and_both_dialects() -> None:
    assert ks.parse_source(annotated({"autoscaling.knative.dev/class": KEDA})).autoscaling == ks.Autoscaling(
        min_replicas=1, max_replicas=50, polling_interval=10, cooldown_period=30, lag_threshold=100,
        activation_lag_threshold=0)
    # eventing-autoscaler-keda's annotations (what most KafkaSource manifests carry)
    old = ks.parse_source(annotated({
        "autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/minScale": "0",
        "autoscaling.knative.dev/maxScale": "5", "keda.autoscaling.knative.dev/pollingInterval": "3",
        "keda.autoscaling.knative.dev/cooldownPeriod": "10", "keda.autoscaling.knative.dev/kafkaLagThreshold": "2",
        "keda.autoscaling.knative.dev/kafkaActivationLagThreshold": "1"})).autoscaling
    # eventing-kafka-broker's
    new = ks.parse_source(annotated({
        "autoscaling.eventing.knative.dev/class": KEDA, "autoscaling.eventing.knative.dev/min-scale": "0",
        "autoscaling.eventing.knative.dev/max-scale": "5", "autoscaling.eventing.knative.dev/polling-interval": "3",
        "autoscaling.eventing.knative.dev/cooldown-period": "10",
        "autoscaling.eventing.knative.dev/lag-threshold": "2",
        "autoscaling.eventing.knative.dev/activation-lag-threshold": "1"})).autoscaling
    assert old == new == ks.Autoscaling(min_replicas=0, max_replicas=5, polling_interval=3, cooldown_period=10,
                                        lag_threshold=2, activation_lag_threshold=1)
    # the same value in both dialects is no conflict
    both = {"autoscaling.knative.dev/class": KEDA, "autoscaling.eventing.knative.dev/class": KEDA,
            "autoscaling.knative.dev/maxScale": "3", "autoscaling.eventing.knative.dev/max-scale": "3"}
    got = ks.parse_source(annotated(both)).autoscaling
    assert got is not None and got.max_replicas == 3


@pytest.mark.parametrize(("annotations", "match"), [
    ({"autoscaling.knative.dev/maxScale": "4"}, "need the annotation autoscaling.knative.dev/class"),
    ({"autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev"}, "not served for KafkaSources"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.eventing.knative.dev/class": "disabled"}, "disagree"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/maxScale": "4",
      "autoscaling.eventing.knative.dev/max-scale": "5"}, "disagree"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/maxScale": "lots"}, "not a whole number"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/maxScale": "0"}, "at least 1"),
    ({"autoscaling.knative.dev/class": KEDA, "keda.autoscaling.knative.dev/kafkaLagThreshold": "0"}, "at least 1"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/minScale": "-1"}, "at least 0"),
    ({"autoscaling.knative.dev/class": KEDA, "autoscaling.knative.dev/minScale": "6",
      "autoscaling.knative.dev/maxScale": "5"}, "above max-scale"),
])
def test_autoscaling_refused_with_reason(annotations: dict[str, str], match: str) -> None:
    with pytest.raises(ks.SourceSpecError, match=match) as caught:
        ks.parse_source(annotated(annotations))
    assert caught.value.reason == "InvalidAutoscaling"
