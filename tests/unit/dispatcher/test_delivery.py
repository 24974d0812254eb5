"""delivery.Deliverer with a fake sender: retries, dead letters, replies."""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from kafka_eventing.core.binding import CloudEvent, ContentMode, event_from_http, event_to_kafka
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.delivery import BackoffPolicy, DeliverySpec, DeliverySpecError
from kafka_eventing.core.http_delivery import Attempt
from kafka_eventing.core.tokens import TokenSource
from kafka_eventing.dispatcher.delivery import AttemptCount, Deliverer, Outcome
from kafka_eventing.dispatcher.metrics import Metrics

from .conftest import LABELS, spec
from .fakes import FakeSender


def run(sender: FakeSender, sub: Subscriber) -> tuple[Outcome, list[float]]:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600, sleep=sleep)  # type: ignore[arg-type]
    event = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0", "traceparent": "x"}, b"hi")
    record = event_to_kafka(event, trace={"traceparent": "00-abc-def-01"})
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS))
    return outcome, sleeps


def test_retryable_codes_are_retried_then_delivered() -> None:
    sender = FakeSender({"http://s": [Attempt(503), Attempt(None, error="refused"), Attempt(429), Attempt(202)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(BackoffPolicy.LINEAR)))
    assert outcome is Outcome.DELIVERED
    assert sleeps == pytest.approx([0.1, 0.2, 0.3])
    _url, headers, body = sender.calls[0]
    assert headers["ce-id"] == "1" and headers["Prefer"] == "reply" and body == b"hi"
    assert headers["traceparent"] == "00-abc-def-01"


def test_final_4xx_is_not_retried_and_goes_to_the_sink_with_extensions() -> None:
    sender = FakeSender({"http://s": [Attempt(400, b"nope")], "http://dls": [Attempt(200)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    assert len(sender.to("http://s")) == 1
    assert sleeps == []
    _, headers, _ = sender.to("http://dls")[0]
    assert headers["ce-knativeerrordest"] == "http://s"
    assert headers["ce-knativeerrorcode"] == "400"
    assert base64.b64decode(headers["ce-knativeerrordata"]) == b"nope"


def test_exhausted_without_sink_is_dropped() -> None:
    sender = FakeSender({"http://s": [Attempt(500)]})
    outcome, sleeps = run(sender, Subscriber("u", "http://s", delivery=spec(retry=2)))
    assert outcome is Outcome.DROPPED
    assert len(sender.calls) == 3 and len(sleeps) == 2


def test_failing_sink_is_retried_until_it_accepts() -> None:
    sink = [Attempt(503)] * 7 + [Attempt(400)] * 3 + [Attempt(201)]
    sender = FakeSender({"http://s": [Attempt(500)], "http://dls": sink})
    outcome, _ = run(sender, Subscriber("u", "http://s", delivery=spec(retry=0, sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    assert len(sender.to("http://dls")) == 11


def test_reply_goes_to_reply_uri_and_a_failed_reply_dead_letters_the_original() -> None:
    reply = Attempt(200, b"pong", {"ce-id": "r", "ce-source": "/r", "ce-type": "reply", "ce-specversion": "1.0"})
    ok = FakeSender({"http://s": [reply], "http://reply": [Attempt(202)]})
    outcome, _ = run(ok, Subscriber("u", "http://s", reply_uri="http://reply"))
    assert outcome is Outcome.DELIVERED
    assert ok.to("http://reply")[0][1]["ce-id"] == "r"

    bad = FakeSender({"http://s": [reply], "http://reply": [Attempt(500)], "http://dls": [Attempt(200)]})
    outcome, _ = run(bad, Subscriber("u", "http://s", reply_uri="http://reply",
                                     delivery=spec(retry=1, sink="http://dls")))
    assert outcome is Outcome.DEAD_LETTERED
    _, headers, body = bad.to("http://dls")[0]
    assert headers["ce-id"] == "1" and body == b"hi"
    assert headers["ce-knativeerrordest"] == "http://reply"


def test_record_that_is_not_a_cloudevent_is_dropped() -> None:
    sender = FakeSender({"http://s": [Attempt(200)]})
    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600)  # type: ignore[arg-type]
    outcome = asyncio.run(deliverer.handle([], b"not an event", Subscriber("u", "http://s"), LABELS))
    assert outcome is Outcome.DROPPED and sender.calls == []


@pytest.mark.parametrize("headers", [
    [("content-type", b"text/plain\r\nX-Evil: 1")],  # a plain record: its content-type is sent as it is
    [("ce_specversion", b"1.0"), ("ce_id", b"1"), ("ce_source", b"/s"), ("ce_type", b"t"),
     ("content-type", b"a\nb")],  # a CloudEvent record's content type
])
def test_a_source_record_whose_headers_cannot_be_sent_is_dropped_and_counted(
        headers: list[tuple[str, bytes]]) -> None:
    from kafka_eventing.dispatcher.sources import RecordConverter

    class Record:
        def topic(self) -> str:
            return "t"

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return 7

        def timestamp(self) -> tuple[int, int]:
            return (1, 1700000000000)

        def key(self) -> None:
            return None

        def value(self) -> bytes:
            return b"v"

        def headers(self) -> list[tuple[str, bytes]]:
            return headers

    sender = FakeSender({"http://s": [Attempt(200)], "http://dls": [Attempt(200)]})
    registry = CollectorRegistry()
    deliverer = Deliverer(sender, Metrics(registry), 600)  # type: ignore[arg-type]
    sub = Subscriber("u", "http://s", delivery=spec(sink="http://dls"), convert=RecordConverter("ns", "src", "string"))
    outcome = asyncio.run(deliverer.handle(headers, b"v", sub, LABELS, record=Record()))  # type: ignore[arg-type]
    assert outcome is Outcome.DROPPED and sender.calls == []  # neither the sink nor the dead-letter sink
    labels = {**LABELS.as_dict(), "reason": "invalid_header"}
    assert registry.get_sample_value("eventing_kafka_dropped_total", labels) == 1




def _resumed(made: int, retry: int) -> tuple[Outcome, FakeSender, AttemptCount]:
    sender = FakeSender({"http://s": [Attempt(500)], "http://dls": [Attempt(200)]})
    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600, sleep=_no_sleep)  # type: ignore[arg-type]
    event = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0"}, b"hi")
    record = event_to_kafka(event)
    count = AttemptCount(made)
    sub = Subscriber("u", "http://s", delivery=spec(retry=retry, sink="http://dls"))
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS, count))
    return outcome, sender, count


async def _no_sleep(_seconds: float) -> None:
    return None


@pytest.mark.parametrize(("made", "more"), [(0, 6), (1, 5), (4, 2), (5, 1), (6, 0)])
def test_attempts_made_before_a_rebalance_count(made: int, more: int) -> None:
    outcome, sender, count = _resumed(made, retry=5)
    assert outcome is Outcome.DEAD_LETTERED
    assert len(sender.to("http://s")) == more
    assert count.made == 6
    assert len(sender.to("http://dls")) == 1


@pytest.mark.parametrize("mode", list(ContentMode))
@pytest.mark.parametrize(("fmt", "structured"), [("json", True), ("JSON", True), ("binary", False), (None, False)])
def test_delivery_format_picks_the_content_mode_of_subscriber_and_dead_letter(
        fmt: str | None, structured: bool, mode: ContentMode) -> None:
    """Knative's ``delivery.format``: json → one application/cloudevents+json body, binary (or unset) → ce-*."""
    delivery = DeliverySpec.from_dict({**({"format": fmt} if fmt else {}), "deadLetterSink": {"uri": "http://dls"}})
    sender = FakeSender({"http://s": [Attempt(400)], "http://dls": [Attempt(202)]})
    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600)  # type: ignore[arg-type]
    doc = (b'{"specversion":"1.0", "id":"1","source":"/s","type":"t","time":"2024-05-01T12:34:56.5+02:00",'
           b'"flag":true,"datacontenttype":"application/json","data": {"a": 1.50}}')
    event = event_from_http({"content-type": "application/cloudevents+json"}, doc)
    record = event_to_kafka(event, mode, trace={"traceparent": "00-abc-def-01"})
    outcome = asyncio.run(deliverer.handle(record.headers, record.value, Subscriber("u", "http://s", delivery=delivery),
                                           LABELS))
    assert outcome is Outcome.DEAD_LETTERED
    (_u, headers, body), (_d, dead_headers, dead_body) = sender.calls
    assert headers["traceparent"] == dead_headers["traceparent"] == "00-abc-def-01"
    if structured:
        assert headers["content-type"] == dead_headers["content-type"] == "application/cloudevents+json"
        assert not any(k.startswith("ce-") for k in headers)
        if mode is ContentMode.STRUCTURED:
            assert body == doc  # a structured record: the sender's own document, byte for byte
        else:  # rebuilt from the record's headers (binary mode: every value a string), the data member as written
            assert json.loads(body) == {**json.loads(doc), "flag": "true"} and body.endswith(b'"data":{"a": 1.50}}')
        dead = json.loads(dead_body)
        flag = True if mode is ContentMode.STRUCTURED else "true"
        assert (dead["time"], dead["flag"], dead["knativeerrorcode"]) == ("2024-05-01T12:34:56.5+02:00", flag, "400")
    else:
        assert headers["content-type"] == "application/json" and headers["ce-time"] == "2024-05-01T12:34:56.5+02:00"
        assert headers["ce-flag"] == "true" and body == dead_body == b'{"a": 1.50}'
        assert dead_headers["ce-knativeerrorcode"] == "400"


def test_an_unknown_delivery_format_is_refused() -> None:
    with pytest.raises(DeliverySpecError, match="format"):
        DeliverySpec.from_dict({"format": "xml"})


class FixedTokens(TokenSource):
    def __init__(self) -> None:
        super().__init__(lambda identity, audience: (f"token-of-{identity[1]}-for-{audience}", 3600.0))


def test_tokens_go_to_destinations_that_declare_an_audience_and_only_there() -> None:
    reply = Attempt(200, b"pong", {"ce-id": "r", "ce-source": "/r", "ce-type": "reply", "ce-specversion": "1.0"})
    sender = FakeSender({"http://s": [reply], "http://reply": [Attempt(401)], "http://dls": [Attempt(202)]})
    delivery = replace(spec(sink="http://dls"), dead_letter_audience="dls-aud")
    sub = Subscriber("u", "http://s", reply_uri="http://reply", delivery=delivery,
                     subscriber_audience="sub-aud", reply_audience="eventing.knative.dev/broker/ns/b",
                     identity=("ns", "u-oidc"))
    deliverer = Deliverer(sender, Metrics(CollectorRegistry()), 600, tokens=FixedTokens())  # type: ignore[arg-type]
    event = CloudEvent({"id": "1", "source": "/s", "type": "t", "specversion": "1.0"}, b"hi")
    record = event_to_kafka(event)
    assert asyncio.run(deliverer.handle(record.headers, record.value, sub, LABELS)) is Outcome.DEAD_LETTERED
    # Every token is the sender's own identity's, for exactly the audience of where it goes.
    assert sender.to("http://s")[0][1]["Authorization"] == "Bearer token-of-u-oidc-for-sub-aud"
    assert sender.to("http://reply")[0][1]["Authorization"] == (
        "Bearer token-of-u-oidc-for-eventing.knative.dev/broker/ns/b")
    assert sender.to("http://dls")[0][1]["Authorization"] == "Bearer token-of-u-oidc-for-dls-aud"

    plain = FakeSender({"http://s": [Attempt(202)]})
    deliverer = Deliverer(plain, Metrics(CollectorRegistry()), 600, tokens=FixedTokens())  # type: ignore[arg-type]
    asyncio.run(deliverer.handle(record.headers, record.value, Subscriber("u", "http://s"), LABELS))
    assert "Authorization" not in plain.to("http://s")[0][1]
    # An audience but no identity of the sender: no token of anyone else's.
    anonymous = FakeSender({"http://s": [Attempt(202)]})
    deliverer = Deliverer(anonymous, Metrics(CollectorRegistry()), 600, tokens=FixedTokens())  # type: ignore[arg-type]
    asyncio.run(deliverer.handle(record.headers, record.value,
                                 Subscriber("u", "http://s", subscriber_audience="sub-aud"), LABELS))
    assert "Authorization" not in anonymous.to("http://s")[0][1]


def test_each_destination_is_sent_with_its_own_ca_certs() -> None:
    sender = FakeSender({"https://s": [Attempt(200, b"", {"ce-id": "r", "ce-source": "/r", "ce-type": "reply",
                                                           "ce-specversion": "1.0"})],
                         "https://reply": [Attempt(500)], "https://dls": [Attempt(200)]})
    sub = Subscriber("u", "https://s", reply_uri="https://reply", subscriber_ca_certs="SUB-CA",
                     reply_ca_certs="REPLY-CA",
                     delivery=replace(spec(retry=0, sink="https://dls"), dead_letter_ca_certs="DLS-CA"))
    outcome, _ = run(sender, sub)
    assert outcome is Outcome.DEAD_LETTERED
    assert sender.ca_certs == {"https://s": "SUB-CA", "https://reply": "REPLY-CA", "https://dls": "DLS-CA"}
