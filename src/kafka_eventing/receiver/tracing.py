"""The receiver's spans: a SERVER span per request (joined to the sender's ``traceparent``) with the Kafka produce
as its PRODUCER child, whose context the records carry as their ``traceparent`` header.

These subclasses replace the untraced resource and ingress when tracing is on (``receiver.app.create_app``), so
with tracing off the request path is the untraced code itself.
"""

from __future__ import annotations

from contextvars import ContextVar

import falcon.asgi
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from kafka_eventing.core import tracing as t
from kafka_eventing.core.binding import TRACE_HEADERS, KafkaRecord
from kafka_eventing.core.channels import Channel
from kafka_eventing.receiver.ingress import Answer, Ingress
from kafka_eventing.receiver.resource import ChannelResource, Request
from kafka_eventing.receiver.sender import Result

#: The request's produce span, from ``decode`` (records built) to ``finish`` (delivery reports in). Each ASGI
#: request runs in its own task, hence its own context.
_PRODUCE: ContextVar[Span | None] = ContextVar("kafka_eventing_produce_span", default=None)


class TracedIngress(Ingress):
    """``Ingress`` that opens a PRODUCER span around the Kafka write and stamps the records with it."""

    tracer: Tracer

    def decode(self, channel: Channel, req: falcon.asgi.Request, body: bytes) -> list[KafkaRecord] | Answer:
        records = super().decode(channel, req, body)
        if isinstance(records, Answer):
            return records
        span = self.tracer.start_span(f"send {channel.topic}", kind=SpanKind.PRODUCER)
        if span.is_recording():  # attributes only for spans that are kept
            attributes: dict[str, str | int] = {
                t.MESSAGING_SYSTEM: "kafka", t.MESSAGING_OPERATION: "send", t.MESSAGING_DESTINATION: channel.topic,
                t.BROKER if self._is_broker(channel) else t.CHANNEL: f"{channel.namespace}/{channel.name}",
            }
            if len(records) == 1:
                attributes.update(t.event_attributes(records[0].headers))
            else:
                attributes[t.MESSAGING_BATCH] = len(records)
            trace.get_current_span().set_attributes(attributes)
            span.set_attributes(attributes)
        carrier = t.inject(span)
        for record in records:
            t.replace_trace(record.headers, carrier)
        _PRODUCE.set(span)
        return records

    def _is_broker(self, channel: Channel) -> bool:
        # A Broker and a KafkaChannel may share a namespace and name, never a topic.
        broker = self.brokers.get(channel.key) if self.brokers is not None else None
        return broker is not None and broker.topic == channel.topic

    def finish(self, result: Result, channel: Channel, count: int, started: float) -> Answer:
        answer = super().finish(result, channel, count, started)
        span = _PRODUCE.get()
        if span is not None:
            _PRODUCE.set(None)
            if not span.is_recording():
                return answer
            span.set_attribute(t.OUTCOME, result.outcome.value)
            if not result.ok:
                span.set_status(StatusCode.ERROR, result.detail)
                span.set_attribute(t.ERROR_TYPE, result.outcome.value)
            span.end()
        return answer


class TracedChannelResource(ChannelResource):
    """``ChannelResource`` with a SERVER span per POST, continuing the sender's trace."""

    def __init__(self, ingress: TracedIngress, tracer: Tracer) -> None:
        super().__init__(ingress)
        ingress.tracer = self.tracer = tracer

    async def on_post(self, req: Request, resp: falcon.asgi.Response,
                      namespace: str | None = None, name: str | None = None) -> None:
        carrier = {name: value for name in TRACE_HEADERS if (value := req.get_header(name))}
        route = req.uri_template or req.path
        with self.tracer.start_as_current_span(
            f"POST {route}", context=t.extract(carrier) if carrier else None, kind=SpanKind.SERVER,
        ) as span:
            await super().on_post(req, resp, namespace, name)
            if not span.is_recording():
                return
            span.set_attributes({t.HTTP_METHOD: "POST", t.URL_PATH: req.path, "http.route": route})
            status = int(str(resp.status)[:3])
            span.set_attribute(t.HTTP_STATUS, status)
            if status >= 500:
                span.set_status(StatusCode.ERROR)
                span.set_attribute(t.ERROR_TYPE, str(status))
