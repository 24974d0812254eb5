"""One event's way out: POST to the subscriber with retries, the reply to ``replyUri``, else the dead-letter sink.

``Deliverer.handle`` returns only when the event is delivered, dead-lettered, or dropped by policy (final
failure with no sink); only then may its offset be committed. A failing dead-letter sink is retried forever.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from kafka_eventing.core.binding import (
    TRACE_HEADERS,
    BindingError,
    CloudEvent,
    ContentMode,
    error_data,
    event_from_http,
    event_from_kafka,
    event_to_http,
    with_extensions,
)
from kafka_eventing.core.channels import Subscriber
from kafka_eventing.core.delivery import is_retryable
from kafka_eventing.core.http_delivery import (
    MAX_REPLY_BYTES,
    Attempt,
    HttpSender,
    delivery_policy,
    retry_delay,
    sink_policy,
)
from kafka_eventing.core.kafkasources import PlainEvent, http_value
from kafka_eventing.core.tokens import TokenError, TokenSource
from kafka_eventing.core.transcode import kafka_to_http
from kafka_eventing.dispatcher.http_client import FORBIDDEN_IN_HEADERS
from kafka_eventing.dispatcher.metrics import Labels, Metrics

log = logging.getLogger(__name__)


#: The hop counter a Broker's events carry (upstream brokers' name and default).
TTL_EXTENSION = "knativebrokerttl"
DEFAULT_TTL = 255


def hop_ttl(http_headers: Mapping[str, str]) -> int:
    """The event's remaining hops; absent or unreadable counts as a fresh event."""
    raw = http_headers.get(f"ce-{TTL_EXTENSION}")
    try:
        return int(raw) if raw is not None else DEFAULT_TTL
    except ValueError:
        return DEFAULT_TTL


def _trace(http_headers: Mapping[str, str]) -> dict[str, str]:
    """The trace context the request carried, for the reply and the dead letter (taken only when they are sent)."""
    return {name: http_headers[name] for name in TRACE_HEADERS if name in http_headers}


class Outcome(enum.StrEnum):
    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    DROPPED = "dropped"


@dataclass(slots=True)
class AttemptCount:
    """Attempts at the subscriber started so far for one event.

    Kept by the consumer per offset and carried across a revoke in the commit's metadata (rebalance.py), so
    an event that always fails reaches the dead-letter sink after exactly its retries however often its
    partition moves.
    """

    made: int = 0


Sleep = Callable[[float], Awaitable[None]]
#: A record's HTTP head and body (``kafka_to_http``), decoded once and shared; raises ``BindingError``.
Decoded = Callable[[], tuple[dict[str, str], bytes]]


class Deliverer:
    """Decode a Kafka record, deliver it per the subscriber's DeliverySpec, reply, dead-letter."""

    def __init__(
        self,
        sender: HttpSender,
        metrics: Metrics,
        retry_after_max: float,
        *,
        sleep: Sleep | None = None,
        tokens: TokenSource | None = None,
    ) -> None:
        self.sender = sender
        #: Audience-scoped tokens for destinations that declare an audience (None: no token is ever sent).
        self.tokens = tokens
        self.metrics = metrics
        self.retry_after_max = retry_after_max
        self._sleep = sleep
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, labels: Labels, *extra: str) -> Any:
        """A metric's labelled child, looked up once (``labels()`` costs more than the increment)."""
        key = (id(metric), labels, *extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels, *extra)
        return child

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
        """``count``: attempts already made (another member's, before a revoke); counted on as they are made.
        ``record``, the consumed message itself, is for the traced deliverer's span attributes. ``decoded``: the
        record's request head and body, decoded once for every Trigger it goes to (a Broker's fan-out)."""
        started = time.monotonic()
        plain: PlainEvent | None = None
        try:
            # Straight from the record's headers to the request's: the CloudEvent object is built only when
            # it is needed (a dead letter), which saves most of the per-event decoding cost.
            if decoded is None:
                out_headers, body = kafka_to_http(headers, value, trace=True)
            else:
                shared, body = decoded()
                out_headers = dict(shared)  # completed per delivery below (Prefer, the TTL)
        except BindingError as exc:
            if subscriber.convert is None or record is None:
                # Nothing can be delivered or dead-lettered without an event; counted so that it is visible.
                log.error("record is not a CloudEvent, skipped", extra={**labels.as_dict(), "error": str(exc)})
                self.metrics.dropped.labels(*labels, "not_a_cloudevent").inc()
                return Outcome.DROPPED
            # A KafkaSource's record: made a CloudEvent as upstream does (core/kafkasources.py).
            plain = subscriber.convert(record)
            out_headers, body = plain.http()
        if subscriber.convert is not None and (FORBIDDEN_IN_HEADERS.search("\t".join(out_headers))
                                               or FORBIDDEN_IN_HEADERS.search("\t".join(out_headers.values()))):
            # A KafkaSource reads topics anyone writes: a header (a plain record's content-type, a CloudEvent
            # record's attribute) that would inject a header is refused on every attempt and every dead letter,
            # so retrying would hold the partition forever. Skipped, counted, logged.
            where = {} if record is None else {"topic": record.topic(), "partition": record.partition(),
                                               "offset": record.offset()}
            log.error("record's headers cannot be sent over HTTP (control characters), skipped",
                      extra={**labels.as_dict(), **where})
            self.metrics.dropped.labels(*labels, "invalid_header").inc()
            return Outcome.DROPPED
        if subscriber.extensions:
            out_headers.update((f"ce-{k}", http_value(v)) for k, v in subscriber.extensions)
        ttl: int | None = None
        if subscriber.hop_ttl:
            ttl = hop_ttl(out_headers)
            if ttl <= 0:
                # A reply loop through the Broker: stop it here, visibly.
                self.metrics.dropped.labels(*labels, "ttl_expired").inc()
                return Outcome.DROPPED
        if subscriber.delivery.format is ContentMode.STRUCTURED:
            # delivery.format: json — the event as one application/cloudevents+json body (a structured record's
            # own document), the trace context beside it as headers.
            trace = _trace(out_headers)
            out_headers, body = event_to_http(event_from_kafka(headers, value), ContentMode.STRUCTURED)
            out_headers.update(trace)
        out_headers["Prefer"] = "reply"

        attempt = await self._with_retries(subscriber.subscriber_uri,
                                           await self._authorized(out_headers, subscriber.subscriber_audience,
                                                                  subscriber),
                                           body, subscriber, labels, count=count,
                                           ca_certs=subscriber.subscriber_ca_certs)
        self._child(self.metrics.latency, labels).observe(time.monotonic() - started)
        if attempt.ok:
            if not subscriber.reply_uri:
                return Outcome.DELIVERED  # Knative drops replies when no replyUri is set
            reply_failed = await self._reply(attempt, subscriber, labels, _trace(out_headers), ttl)
            if reply_failed is None:
                return Outcome.DELIVERED
            dest, attempt = subscriber.reply_uri, reply_failed
        else:
            dest = subscriber.subscriber_uri
        # valid: kafka_to_http accepted the same record
        event = plain.cloudevent() if plain is not None else event_from_kafka(headers, value)
        if subscriber.extensions:
            event = with_extensions(event, **dict(subscriber.extensions))
        return await self._dead_letter(event, dest, attempt, subscriber, labels=labels, trace=_trace(out_headers))

    async def _authorized(self, headers: dict[str, str], audience: str | None,
                          subscriber: Subscriber) -> dict[str, str]:
        """``headers`` with a bearer token of the subscriber's identity for ``audience`` (the same dict when none
        applies). Without a token the request still goes: the destination's 401 is then the visible failure (dead
        letter, metric)."""
        if audience is None or self.tokens is None:
            return headers
        if subscriber.identity is None:
            log.warning("the destination declares an audience but the sender has no OIDC identity: sent without a "
                        "token", extra={"audience": audience, "subscriber": subscriber.uid})
            return headers
        try:
            return {**headers, "Authorization": await self.tokens.header(subscriber.identity, audience)}
        except TokenError as exc:
            log.error("no token for the destination's audience", extra={"audience": audience, "error": str(exc)})
            return headers

    async def _with_retries(
        self, url: str, headers: Mapping[str, str], body: bytes, subscriber: Subscriber, labels: Labels, *,
        count: AttemptCount | None = None, ca_certs: str | None = None,
    ) -> Attempt:
        spec = subscriber.delivery
        timeout = spec.timeout_seconds
        done = count.made if count is not None else 0
        if done:
            if done > spec.retry:
                # Every attempt was made before the partition moved; the dead letter was not yet sent.
                return Attempt(None, error=f"all {done} attempts failed before a rebalance")
            await (self._sleep or asyncio.sleep)(retry_delay(spec, done, None, self.retry_after_max))
        # The first attempt inline (no closure, no extra coroutine): it is the only one for almost every event.
        if count is not None:
            count.made += 1
        first = await self.sender.post(url, headers, body, timeout, ca_certs=ca_certs)
        self._child(self.metrics.deliveries, labels, first.code).inc()
        if first.ok or not is_retryable(first.status) or spec.retry <= done:
            return first

        async def once() -> Attempt:
            if count is not None:
                count.made += 1
            result = await self.sender.post(url, headers, body, timeout, ca_certs=ca_certs)
            self._child(self.metrics.deliveries, labels, result.code).inc()
            return result

        def on_retry(_attempt: int, _delay: float) -> None:
            self.metrics.retries.labels(*labels).inc()

        on_retry(done + 1, 0.0)
        await (self._sleep or asyncio.sleep)(retry_delay(spec, done + 1, first.retry_after, self.retry_after_max))
        policy = delivery_policy(spec, self.retry_after_max, sleep=self._sleep, before_retry=on_retry, done=done + 1)
        result: Attempt = await policy(once)
        return result

    async def _reply(
        self, attempt: Attempt, subscriber: Subscriber, labels: Labels, trace: Mapping[str, str],
        ttl: int | None = None,
    ) -> Attempt | None:
        """Forward a reply event; return the failed attempt if it could not be delivered."""
        if not subscriber.reply_uri:
            return None  # Knative drops replies when no replyUri is set
        if attempt.oversized:
            # Forwarding the first part would deliver a different event; failing makes the loss visible.
            self.metrics.dropped.labels(*labels, "reply_too_large").inc()
            log.error("reply larger than the limit, not forwarded",
                      extra={**labels.as_dict(), "limit": MAX_REPLY_BYTES, "reply_uri": subscriber.reply_uri})
            return Attempt(None, error=f"reply larger than {MAX_REPLY_BYTES} bytes")
        if not attempt.body and not any(k.lower().startswith("ce-") for k in attempt.headers):
            return None
        try:
            reply = event_from_http(attempt.headers, attempt.body)
        except BindingError:
            return None  # a plain response body is not a reply
        if ttl is not None:
            reply = with_extensions(reply, **{TTL_EXTENSION: str(ttl - 1)})
        headers, body = event_to_http(reply)
        headers.update(trace)
        result = await self._with_retries(subscriber.reply_uri,
                                          await self._authorized(headers, subscriber.reply_audience, subscriber),
                                          body, subscriber, labels, ca_certs=subscriber.reply_ca_certs)
        if result.ok:
            self.metrics.replies.labels(*labels).inc()
            return None
        return result

    async def _dead_letter(
        self, event: CloudEvent, dest: str, failed: Attempt, subscriber: Subscriber, *, labels: Labels,
        trace: Mapping[str, str],
    ) -> Outcome:
        sink = subscriber.delivery.dead_letter_uri
        context = {**labels.as_dict(), "event_id": event.get_id(), "code": failed.code, "error": failed.error}
        if not sink:
            log.warning("delivery failed, no dead-letter sink: event dropped", extra=context)
            self.metrics.dropped.labels(*labels, "failed_no_sink").inc()
            return Outcome.DROPPED
        dead = with_extensions(
            event,
            knativeerrordest=dest,
            knativeerrorcode=failed.code if failed.status is not None else None,
            knativeerrordata=error_data(failed.body) if failed.body else None,
        )
        headers, body = event_to_http(dead, subscriber.delivery.format)
        headers.update(trace)
        headers = await self._authorized(headers, subscriber.delivery.dead_letter_audience, subscriber)

        def on_retry(attempt: int, delay: float) -> None:
            self.metrics.sink_retries.labels(*labels).inc()
            log.warning("dead-letter sink failed, retrying (offset not committed)",
                        extra={**context, "attempt": attempt, "delay": round(delay, 3)})

        policy = sink_policy(subscriber.delivery, self.retry_after_max, sleep=self._sleep, before_retry=on_retry)
        timeout = subscriber.delivery.timeout_seconds

        async def once() -> Attempt:
            return await self.sender.post(sink, headers, body, timeout,
                                          ca_certs=subscriber.delivery.dead_letter_ca_certs)

        await policy(once)
        self.metrics.dead_lettered.labels(*labels).inc()
        log.info("event dead-lettered", extra=context)
        return Outcome.DEAD_LETTERED
