"""The dispatcher's spans: per event and subscription a CONSUMER ``process`` span, child of the produce span whose
context the record carries; under it a CLIENT span per HTTP attempt — to the subscriber, to ``replyUri``, to the
dead-letter sink — whose context the request carries on to the subscriber.

``TracedDeliverer`` replaces ``Deliverer`` when tracing is on (``dispatcher.app.Dispatcher``), so with tracing off
the delivery path is the untraced code itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from confluent_kafka import Message
from opentelemetry.trace import SpanKind, StatusCode, Tracer

from kafka_eventing.core import tracing as t
from kafka_eventing.core.binding import BindingError, event_from_kafka
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.http_delivery import Attempt, HttpSender
from kafka_eventing.core.tokens import TokenSource
from kafka_eventing.dispatcher.delivery import AttemptCount, Decoded, Deliverer, Outcome, Sleep
from kafka_eventing.dispatcher.metrics import Labels

#: Span names (and ``kafka_eventing.outcome`` of each attempt's span) by where the POST goes.
DELIVER, REPLY, DEAD_LETTER = "deliver", "reply", "dead-letter"


@dataclass
class _Event:
    """One event's delivery to one subscriber, as the attempts' spans see it."""

    subscriber: Subscriber
    attempts: dict[str, int] = field(default_factory=dict)

    def role(self, url: str) -> str:
        if url == self.subscriber.subscriber_uri:
            return DELIVER
        if url == self.subscriber.reply_uri:
            return REPLY
        return DEAD_LETTER

    def next_attempt(self, role: str) -> int:
        n = self.attempts[role] = self.attempts.get(role, 0) + 1
        return n


#: The event being handled in this task (each delivery is its own asyncio task, hence its own context).
_EVENT: ContextVar[_Event | None] = ContextVar("kafka_eventing_event", default=None)


class TracedSender(HttpSender):
    """Wraps an ``HttpSender``: every POST is a CLIENT span, its ``traceparent`` sent along."""

    def __init__(self, sender: HttpSender, tracer: Tracer) -> None:
        # No HttpSender.__init__: every POST goes through the wrapped sender (and its session).
        self.inner, self.tracer = sender, tracer

    async def post(self, url: str, headers: Mapping[str, str], body: bytes, timeout: float | None, *,
                   ca_certs: str | None = None) -> Attempt:
        event = _EVENT.get()
        role = event.role(url) if event is not None else DELIVER
        number = event.next_attempt(role) if event is not None else 1
        with self.tracer.start_as_current_span(f"{role} POST", kind=SpanKind.CLIENT) as span:
            out = dict(headers)
            out.update(t.inject(span))
            attempt = await self.inner.post(url, out, body, timeout, ca_certs=ca_certs)
            if not span.is_recording():
                return attempt  # not sampled: only the context travels on
            span.set_attributes({t.HTTP_METHOD: "POST", t.URL_FULL: url, t.ATTEMPT: number})
            if attempt.status is not None:
                span.set_attribute(t.HTTP_STATUS, attempt.status)
            span.set_attribute(t.OUTCOME, "ok" if attempt.ok else "failed")
            if not attempt.ok:
                span.set_status(StatusCode.ERROR, attempt.error or attempt.code)
                span.set_attribute(t.ERROR_TYPE, attempt.code if attempt.status is not None else "no_response")
        return attempt


class TracedDeliverer(Deliverer):
    """``Deliverer`` with a CONSUMER span per event and a CLIENT span per attempt."""

    def __init__(self, sender: HttpSender, metrics: object, retry_after_max: float, *, tracer: Tracer,
                 sleep: Sleep | None = None, broker: bool = False, tokens: TokenSource | None = None) -> None:
        """``broker``: the "channel" is a Broker and each subscriber a Trigger, and the spans say so."""
        super().__init__(TracedSender(sender, tracer), metrics, retry_after_max,  # type: ignore[arg-type]
                         sleep=sleep, tokens=tokens)
        self.tracer = tracer
        self.broker = broker

    async def handle(
        self,
        headers: Sequence[tuple[str, bytes | str | None]] | None,
        value: bytes | None,
        subscriber: Subscriber,
        labels: Labels,
        count: AttemptCount | None = None,
        *,
        record: Message | None = None,
        decoded: Decoded | None = None,
    ) -> Outcome:
        carrier = t.kafka_trace(headers)
        topic = record.topic() if record is not None else None
        token = _EVENT.set(_Event(subscriber))
        try:
            with self.tracer.start_as_current_span(
                f"process {topic or labels.channel}", context=t.extract(carrier) if carrier else None,
                kind=SpanKind.CONSUMER,
            ) as span:
                recording = span.is_recording()
                if recording:  # attributes only for spans that are kept
                    span.set_attributes(_process_attributes(headers, value, labels, record, broker=self.broker))
                outcome = await super().handle(headers, value, subscriber, labels, count, record=record,
                                                decoded=decoded)
                if not recording:
                    return outcome
                span.set_attribute(t.OUTCOME, outcome.value)
                if outcome is Outcome.DROPPED:
                    span.set_status(StatusCode.ERROR, "dropped")
                return outcome
        finally:
            _EVENT.reset(token)


def _process_attributes(headers: Sequence[tuple[str, bytes | str | None]] | None, value: bytes | None,
                        labels: Labels, record: Message | None, *, broker: bool = False) -> dict[str, str | int]:
    # A Trigger's subscriber uid is the Trigger's name, in the Broker's namespace.
    source = ({t.BROKER: f"{labels.namespace}/{labels.channel}", t.TRIGGER: f"{labels.namespace}/{labels.subscriber}"}
              if broker else {t.CHANNEL: f"{labels.namespace}/{labels.channel}", t.SUBSCRIPTION: labels.subscriber})
    attributes: dict[str, str | int] = {
        t.MESSAGING_SYSTEM: "kafka", t.MESSAGING_OPERATION: "process", **source, **_event_attributes(headers, value),
    }
    if record is not None:
        attributes[t.MESSAGING_DESTINATION] = record.topic() or ""
        attributes[t.MESSAGING_PARTITION] = str(record.partition())
        attributes[t.MESSAGING_OFFSET] = record.offset() or 0
    return attributes


def _event_attributes(headers: Sequence[tuple[str, bytes | str | None]] | None,
                      value: bytes | None) -> dict[str, str]:
    """The CloudEvents attributes of a record: from its ``ce_*`` headers, else from the structured event."""
    found = t.event_attributes(headers)
    if t.CE_ID in found:
        return found
    try:
        event = event_from_kafka(headers, value)
    except BindingError:
        return found  # not a CloudEvent: the span still shows the record, the outcome says dropped
    return {t.CE_ID: event.get_id(), t.CE_TYPE: event.get_type(), t.CE_SOURCE: event.get_source(),
            t.CE_SPECVERSION: event.get_specversion()}
