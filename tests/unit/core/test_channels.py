from __future__ import annotations

from pathlib import Path

import pytest

from kafka_eventing.core.binding import ContentMode
from kafka_eventing.core.channels import (
    ChannelSpecError,
    channel_from_resource,
    channel_key_from_host,
    load_channels_file,
)
from kafka_eventing.core.delivery import ANNOTATION_RATE_LIMIT
from kafka_eventing.core.settings import Settings

DOC = """
apiVersion: messaging.knative.dev/v1beta1
kind: KafkaChannel
metadata:
  name: orders
  namespace: shop
  annotations:
    kafka.eventing.knative.dev/delivery.order: unordered
spec:
  numPartitions: 3
  delivery: {retry: 2, backoffDelay: PT0.1S, deadLetterSink: {uri: "http://dls"}}
  subscribers:
    - uid: u1
      subscriberUri: http://a
      replyUri: http://r
    - uid: u2
      subscriberUri: http://b
      delivery: {retry: 5}
      deliveryOrder: ordered
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: messaging.knative.dev/v1beta1
kind: KafkaChannel
metadata: {name: audit, namespace: shop, annotations: {kafka.eventing.knative.dev/content.mode: structured}}
status:
  conditions: [{type: TopicReady, status: "False", message: "topic quota exceeded"}]
"""


def test_file_parsing(tmp_path: Path) -> None:
    path = tmp_path / "channels.yaml"
    path.write_text(DOC)
    channels = load_channels_file(path, Settings())
    assert set(channels) == {("shop", "orders"), ("shop", "audit")}
    orders = channels[("shop", "orders")]
    assert orders.topic == "shop.orders" and orders.num_partitions == 3 and not orders.ordered
    a, b = orders.subscribers
    assert a.delivery.retry == 2 and a.delivery.dead_letter_uri == "http://dls" and a.reply_uri == "http://r"
    assert not a.ordered
    assert b.delivery.retry == 5 and b.delivery.dead_letter_uri == "http://dls" and b.ordered
    audit = channels[("shop", "audit")]
    assert audit.ready is False and audit.reason == "topic quota exceeded"
    assert audit.content_mode is ContentMode.STRUCTURED


def test_readiness_from_the_api_server_needs_the_controllers_status() -> None:
    obj = {"metadata": {"name": "orders", "namespace": "shop"}, "spec": {}}
    assert channel_from_resource(obj, Settings()).ready  # standalone YAML: no controller, no status, ready
    fresh = channel_from_resource(obj, Settings(), reconciled=True)
    assert not fresh.ready and "not reconciled yet" in fresh.reason
    done = {**obj, "status": {"conditions": [{"type": "TopicReady", "status": "True"}]}}
    assert channel_from_resource(done, Settings(), reconciled=True).ready
    failed = {**obj, "status": {"conditions": [{"type": "TopicReady", "status": "False", "reason": "TopicFailed"}]}}
    got = channel_from_resource(failed, Settings(), reconciled=True)
    assert not got.ready and got.reason == "TopicFailed"


def test_invalid_channel_names_field() -> None:
    with pytest.raises(ChannelSpecError, match="shop/x.*backoffDelay"):
        channel_from_resource({"kind": "KafkaChannel", "metadata": {"name": "x", "namespace": "shop"},
                               "spec": {"delivery": {"backoffDelay": "10 seconds"}}}, Settings())


@pytest.mark.parametrize(
    ("host", "key"),
    [("orders-kn-channel.shop.svc.cluster.local", ("shop", "orders")),
     ("orders-kn-channel.shop.svc.cluster.local:8080", ("shop", "orders")),
     ("orders-kn-channel.shop.svc", ("shop", "orders")),
     ("orders-kn-channel.shop", ("shop", "orders")),
     ("orders.shop.svc.cluster.local", None), ("-kn-channel.shop.svc", None), ("localhost:8080", None),
     ("orders-kn-channel.shop.example.com", None)],
)
def test_host_routing(host: str, key: tuple[str, str] | None) -> None:
    assert channel_key_from_host(host) == key


def test_delivery_format_of_the_channel_and_of_each_subscriber() -> None:
    obj = {"kind": "KafkaChannel", "metadata": {"name": "x", "namespace": "shop"},
           "spec": {"delivery": {"format": "json"},
                    "subscribers": [{"uid": "inherits", "subscriberUri": "http://a"},
                                    {"uid": "own", "subscriberUri": "http://b", "delivery": {"format": "binary"}},
                                    {"uid": "json", "subscriberUri": "http://c", "delivery": {"format": "json"}}]}}
    formats = {s.uid: s.delivery.format for s in channel_from_resource(obj, Settings()).subscribers}
    assert formats == {"inherits": ContentMode.STRUCTURED, "own": ContentMode.BINARY, "json": ContentMode.STRUCTURED}
    obj["spec"]["subscribers"][1]["delivery"] = {"format": "cloudevents"}  # type: ignore[index]
    with pytest.raises(ChannelSpecError, match="format"):
        channel_from_resource(obj, Settings())


def _with_rate(annotation: str | None, *subscribers: dict[str, object]) -> dict[str, object]:
    annotations = {} if annotation is None else {ANNOTATION_RATE_LIMIT: annotation}
    return {"kind": "KafkaChannel", "metadata": {"name": "c", "namespace": "ns", "annotations": annotations},
            "spec": {"subscribers": list(subscribers)}}


def test_the_channels_rate_limit_annotation_is_every_subscriptions_unless_its_own_field_says_otherwise() -> None:
    """Knative's Subscription controller writes spec.subscribers without rateLimit: the channel's annotation is
    how a Subscription gets one."""
    channel = channel_from_resource(_with_rate(
        "2.5", {"uid": "a", "subscriberUri": "http://a"}, {"uid": "b", "subscriberUri": "http://b", "rateLimit": 9}),
        Settings())
    assert [s.rate_limit for s in channel.subscribers] == [2.5, 9.0]
    unlimited = channel_from_resource(_with_rate(None, {"uid": "a", "subscriberUri": "http://a"}), Settings())
    assert unlimited.subscribers[0].rate_limit is None
    zero = channel_from_resource(_with_rate("0", {"uid": "a", "subscriberUri": "http://a", "rateLimit": 0}),
                                 Settings())
    assert zero.subscribers[0].rate_limit is None  # 0: unlimited, as the CRD's rateLimit has always meant


@pytest.mark.parametrize("raw", ["fast", "-1", "nan", "inf"])
def test_an_invalid_rate_limit_annotation_names_it(raw: str) -> None:
    with pytest.raises(ChannelSpecError, match=f"annotation {ANNOTATION_RATE_LIMIT} '{raw}' is not a number"):
        channel_from_resource(_with_rate(raw, {"uid": "a", "subscriberUri": "http://a"}), Settings())


def test_audiences_of_subscribers_replies_and_dead_letter_sinks_are_kept() -> None:
    obj = {"metadata": {"name": "c", "namespace": "ns"},
           "spec": {"delivery": {"deadLetterSink": {"uri": "http://dls", "audience": "dls-aud"}},
                    "subscribers": [
                        {"uid": "a", "subscriberUri": "http://a", "subscriberAudience": "a-aud",
                         "replyUri": "http://r", "replyAudience": "r-aud"},
                        {"uid": "b", "subscriberUri": "http://b",
                         "delivery": {"deadLetterSink": {"uri": "http://own", "audience": "own-aud"}}},
                        {"uid": "c", "subscriberUri": "http://c", "delivery": {"retry": 1}}]}}
    a, b, c = channel_from_resource(obj, Settings()).subscribers
    assert (a.subscriber_audience, a.reply_audience, a.delivery.dead_letter_audience) == ("a-aud", "r-aud", "dls-aud")
    assert (b.subscriber_audience, b.reply_audience, b.delivery.dead_letter_audience) == (None, None, "own-aud")
    assert (c.delivery.dead_letter_uri, c.delivery.dead_letter_audience) == ("http://dls", "dls-aud")  # the channel's
    # The controller's resolved sink audience wins over the spec's.
    resolved = {**obj, "status": {"deadLetterSinkUri": "http://resolved", "deadLetterSinkAudience": "resolved-aud"}}
    assert channel_from_resource(resolved, Settings()).subscribers[0].delivery.dead_letter_audience == "resolved-aud"
