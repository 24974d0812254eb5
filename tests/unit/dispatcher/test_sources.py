"""A KafkaSource as the dispatcher's channel: one subscriber per topic in the source's group, held until the
controller reports the sink and the initial offsets; an unusable spec is a channel that is not ready."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_eventing.core import kafkasources as ks
from kafka_eventing.dispatcher.sources import RecordConverter, dispatch_hold, source_channel


def source(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "src", "uid": "u1", "generation": 4},
            "spec": {"bootstrapServers": ["k:9092"], "topics": ["a", "b"], "sink": {"uri": "http://sink"},
                     **(spec or {})},
            "status": status or {}}


def ready_status(**extra: Any) -> dict[str, Any]:
    return {"sinkUri": "http://resolved", "conditions": [
        {"type": kind, "status": "True"} for kind in ks.DISPATCH_GATES], **extra}


def test_one_subscriber_per_topic_in_the_sources_group() -> None:
    channel = source_channel(source({"ordering": "unordered", "consumerGroup": "g",
                                     "ceOverrides": {"extensions": {"x": "1"}}}, ready_status()))
    assert channel.key == ("ns", "src") and channel.ready
    assert [(s.uid, s.topic, s.group) for s in channel.subscribers] == [("a", "a", "g"), ("b", "b", "g")]
    for sub in channel.subscribers:
        assert sub.subscriber_uri == "http://resolved"  # status.sinkUri, not spec.sink.uri
        assert not sub.ordered and not sub.held and sub.reply_uri is None
        assert sub.extensions == (("x", "1"),)
        assert sub.convert == RecordConverter("ns", "src", "string")
        assert sub.generation == 4


def test_held_until_the_controller_reports_the_gates() -> None:
    assert dispatch_hold(source()) == "waiting for the controller to report SinkProvided"
    status = ready_status()
    status["conditions"][1] = {"type": ks.INITIAL_OFFSETS_COMMITTED, "status": "False",
                               "reason": "OffsetsNotCommitted", "message": "no"}
    channel = source_channel(source(status=status))
    assert {s.held for s in channel.subscribers} == {"InitialOffsetsCommitted is False (OffsetsNotCommitted: no)"}
    no_uri = ready_status()
    del no_uri["sinkUri"]
    assert {s.held for s in source_channel(source(status=no_uri)).subscribers} == {"no sink URI resolved yet"}


def test_standalone_uses_the_sink_uri_and_waits_for_nothing() -> None:
    channel = source_channel(source(), standalone=True)
    assert {(s.subscriber_uri, s.held) for s in channel.subscribers} == {("http://sink", "")}
    assert all(s.ordered for s in channel.subscribers)  # upstream's default ordering


def test_dead_letter_sink_from_status() -> None:
    spec = {"delivery": {"retry": 3, "deadLetterSink": {"ref": {"apiVersion": "serving.knative.dev/v1",
                                                                "kind": "Service", "name": "dls"}}}}
    channel = source_channel(source(spec, ready_status(deadLetterSinkUri="http://dls.resolved")))
    delivery = channel.subscribers[0].delivery
    assert (delivery.retry, delivery.dead_letter_uri, delivery.dead_letter_problem) == (3, "http://dls.resolved", "")


def test_an_unusable_spec_is_a_channel_that_is_not_ready() -> None:
    channel = source_channel(source({"ordering": "sideways"}, ready_status()))
    assert not channel.ready and "spec.ordering" in channel.reason and channel.subscribers == ()


def test_the_rate_limit_annotation_limits_each_topics_deliveries_and_an_invalid_one_is_refused() -> None:
    from kafka_eventing.core.delivery import ANNOTATION_RATE_LIMIT

    limited = source(status=ready_status())
    limited["metadata"]["annotations"] = {ANNOTATION_RATE_LIMIT: "2.5"}
    assert [s.rate_limit for s in source_channel(limited).subscribers] == [2.5, 2.5]
    assert [s.rate_limit for s in source_channel(source(status=ready_status())).subscribers] == [None, None]
    invalid = source(status=ready_status())
    invalid["metadata"]["annotations"] = {ANNOTATION_RATE_LIMIT: "fast"}
    channel = source_channel(invalid)
    assert not channel.ready and ANNOTATION_RATE_LIMIT in channel.reason and "'fast'" in channel.reason
    with pytest.raises(ks.SourceSpecError) as refused:
        ks.parse_source(invalid)
    assert refused.value.reason == "InvalidRateLimit"
