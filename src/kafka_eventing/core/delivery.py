"""DeliverySpec: retries, backoff, per-attempt timeout, dead-letter sink, content mode — parsed once, used
everywhere.

Durations are ISO-8601 (``PT0.2S``, ``PT1M``) as in Knative's DeliverySpec (``core.durations``). ``format`` is
Knative's per-destination content mode: ``json`` (structured, ``application/cloudevents+json``) or ``binary``
(``ce-*`` headers); unset is binary.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kafka_eventing.core.binding import ContentMode
from kafka_eventing.core.durations import DurationError, parse_duration

#: HTTP status codes worth another attempt (Knative's rule); other 4xx are final.
RETRYABLE_STATUS = frozenset({404, 408, 409, 429})


#: What makes a ``delivery`` count in upstream's merge (eventing-kafka-broker ``EgressConfigFromDelivery``): one of
#: these set; a delivery with none of them (only a backoff, say) is as if absent.
_EGRESS_FIELDS = ("deadLetterSink", "retry", "timeout")


def trigger_delivery(trigger: Mapping[str, Any] | None, broker: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A Trigger's effective ``delivery``: upstream's Kafka Broker rule (``MergeEgressConfig`` of the Trigger's over
    the Broker's, eventing-kafka-broker control-plane/pkg/core/config), field by field:

    - either side counts only if it sets ``deadLetterSink``, ``retry`` or ``timeout``; if one does not, the other
      is taken whole;
    - ``deadLetterSink``, ``retry`` and ``timeout``: the Trigger's if set (a ``retry`` of 0 counts as unset), else
      the Broker's;
    - ``backoffPolicy`` and ``backoffDelay``: the Trigger's when it sets ``retry`` (their defaults if it does not
      name them); otherwise the policy is the default (exponential) and the delay the Broker's when the Broker sets
      ``retry``;
    - ``retryAfterMax`` and ``format`` (outside upstream's merge): the Trigger's if set, else the Broker's, whether
      or not either side counts.
    """
    t = trigger if trigger and any(trigger.get(k) is not None for k in _EGRESS_FIELDS) else None
    b = broker if broker and any(broker.get(k) is not None for k in _EGRESS_FIELDS) else None
    merged: dict[str, Any] = {}
    if t is None or b is None:
        merged.update((t if b is None else b) or {})
    else:
        for key in ("deadLetterSink", "retry", "timeout"):
            value = t.get(key) or b.get(key)
            if value:
                merged[key] = value
        if t.get("retry") is not None:
            merged.update({k: t[k] for k in ("backoffPolicy", "backoffDelay") if t.get(k) is not None})
        elif b.get("retry") is not None and b.get("backoffDelay") is not None:
            merged["backoffDelay"] = b["backoffDelay"]
    for key in ("retryAfterMax", "format"):  # each side's whether or not it counts
        value = next((d[key] for d in (trigger, broker) if d and d.get(key) is not None), None)
        merged.pop(key, None)
        if value is not None:
            merged[key] = value
    return merged or None


#: Events per second delivered to one subscriber (each consumer group), as an annotation: on a KafkaChannel for
#: every Subscription to it (Knative's Subscription controller writes ``spec.subscribers`` and has no field for
#: it), on a Trigger, on a KafkaSource. A burst of one second's worth is allowed; unset or 0: unlimited.
ANNOTATION_RATE_LIMIT = "kafka.eventing.knative.dev/rate.limit"


class DeliverySpecError(ValueError):
    """A DeliverySpec field is invalid; the message names the field and the value."""


def parse_rate_limit(raw: object, where: str) -> float | None:
    """A rate limit (events per second) from an annotation or field value; None (unlimited) when unset, empty
    or 0. :class:`DeliverySpecError` names ``where`` and the value when it is not a finite number ≥ 0."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        rate = float(str(raw).strip())
    except ValueError:
        rate = math.nan
    if not math.isfinite(rate) or rate < 0:
        raise DeliverySpecError(f"{where} {raw!r} is not a number of events per second (> 0; 0: unlimited)")
    return rate or None


def rate_limit_annotation(annotations: Mapping[str, Any] | None) -> float | None:
    """The ``ANNOTATION_RATE_LIMIT`` of a resource's annotations (see ``parse_rate_limit``)."""
    return parse_rate_limit((annotations or {}).get(ANNOTATION_RATE_LIMIT), f"annotation {ANNOTATION_RATE_LIMIT}")


def service_url(name: str, namespace: str) -> str:
    """The cluster-local address of a Service, as Knative's resolver builds it."""
    return f"http://{name}.{namespace}.svc.cluster.local"


def resolve_destination(dest: Mapping[str, Any] | None, namespace: str) -> tuple[str | None, str]:
    """A Knative Destination (``uri`` and/or ``ref``) → (URI, problem); problem is "" when resolved or unset.

    Like Knative's resolver: a ``v1 Service`` ref is its cluster-local address, with ``uri`` (if any) joined as
    the path. Other kinds are Addressables whose ``status.address.url`` only the API server knows: the controller
    resolves the channel's own sink into ``status.deadLetterSinkUri``; here they are reported, not ignored.
    """
    if not dest:
        return None, ""
    uri, ref = dest.get("uri"), dest.get("ref")
    if not ref:
        return (str(uri) if uri else None), ""
    kind, name = ref.get("kind"), ref.get("name")
    api_version = str(ref.get("apiVersion") or "v1")
    ns = ref.get("namespace") or namespace
    if kind == "Service" and api_version == "v1" and name:
        base = service_url(str(name), str(ns))
        return (f"{base}/{str(uri).lstrip('/')}" if uri else base), ""
    return None, (f"deadLetterSink.ref {kind} {ns}/{name} ({api_version}) cannot be resolved by the data plane: "
                  "use a v1 Service ref or a uri")


#: Knative's ``delivery.format`` values (duck/v1 DeliverySpec's FormatType) and the content mode each names.
DELIVERY_FORMATS = {"json": ContentMode.STRUCTURED, "binary": ContentMode.BINARY}


class BackoffPolicy(enum.StrEnum):
    LINEAR = "linear"
    EXPONENTIAL = "exponential"


def is_retryable(status: int | None) -> bool:
    """No response (``None``), 5xx, and 404/408/409/429 are retried."""
    return status is None or status >= 500 or status in RETRYABLE_STATUS


@dataclass(frozen=True)
class DeliverySpec:
    retry: int = 0
    backoff_policy: BackoffPolicy = BackoffPolicy.EXPONENTIAL
    backoff_delay: timedelta = timedelta(milliseconds=200)
    timeout: timedelta | None = None
    dead_letter_uri: str | None = None
    #: Why the configured dead-letter sink has no URI (a ref that cannot be resolved here); "" if none.
    dead_letter_problem: str = ""
    #: Knative's ``retryAfterMax``: caps a Retry-After wait (zero: Retry-After ignored); None: the dispatcher's cap.
    retry_after_max: timedelta | None = None
    #: How events go to the subscriber and the dead-letter sink (``format``); replies keep binary mode.
    format: ContentMode = ContentMode.BINARY
    #: The dead-letter sink's ``audience``: a token for it is sent with every dead letter (None: no token).
    dead_letter_audience: str | None = None
    #: The dead-letter sink's ``CACerts`` (PEM), trusted for an ``https://`` sink besides the system's.
    dead_letter_ca_certs: str | None = None

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | None, dead_letter_uri: str | None = None,
                  namespace: str = "default", dead_letter_audience: str | None = None,
                  dead_letter_ca_certs: str | None = None) -> DeliverySpec:
        """Parse a Knative ``delivery`` object; ``dead_letter_uri`` is the resolved sink if given, else the
        ``deadLetterSink`` destination is resolved with ``resolve_destination`` (refs default to ``namespace``)."""
        spec = spec or {}
        retry = spec.get("retry", 0)
        if not isinstance(retry, int) or isinstance(retry, bool) or retry < 0:
            raise DeliverySpecError(f"retry: {retry!r} must be a whole number ≥ 0")
        policy_raw = spec.get("backoffPolicy", BackoffPolicy.EXPONENTIAL.value)
        try:
            policy = BackoffPolicy(str(policy_raw).lower())
        except ValueError:
            raise DeliverySpecError(f"backoffPolicy: {policy_raw!r} must be linear or exponential") from None
        try:
            delay = (parse_duration(spec["backoffDelay"], "backoffDelay") if spec.get("backoffDelay")
                     else cls.backoff_delay)
            timeout = parse_duration(spec["timeout"], "timeout") if spec.get("timeout") else None
            retry_after_max = (parse_duration(spec["retryAfterMax"], "retryAfterMax") if spec.get("retryAfterMax")
                               else None)
        except DurationError as exc:
            raise DeliverySpecError(str(exc)) from None
        fmt = spec.get("format")
        if fmt is None or fmt == "":
            content_mode = ContentMode.BINARY
        elif isinstance(fmt, str) and fmt.lower() in DELIVERY_FORMATS:
            content_mode = DELIVERY_FORMATS[fmt.lower()]
        else:
            raise DeliverySpecError(f"format: {fmt!r} must be json (structured mode) or binary")
        sink, problem = dead_letter_uri, ""
        dls = spec.get("deadLetterSink")
        if sink is None:
            sink, problem = resolve_destination(dls if isinstance(dls, Mapping) else None, namespace)
        # The resolved audience (a status' ``deadLetterSinkAudience``) else the destination's own ``audience``.
        audience = dead_letter_audience or (dls.get("audience") if isinstance(dls, Mapping) else None)
        ca_certs = dead_letter_ca_certs or (dls.get("CACerts") if isinstance(dls, Mapping) else None)
        return cls(retry=retry, backoff_policy=policy, backoff_delay=delay, timeout=timeout, dead_letter_uri=sink,
                   dead_letter_problem=problem, retry_after_max=retry_after_max, format=content_mode,
                   dead_letter_audience=str(audience) if sink and audience else None,
                   dead_letter_ca_certs=str(ca_certs) if sink and ca_certs else None)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): linear d×n, exponential d×2^n."""
        base = self.backoff_delay.total_seconds()
        if self.backoff_policy is BackoffPolicy.LINEAR:
            return float(base * attempt)
        return float(base * (2**attempt))

    @property
    def timeout_seconds(self) -> float | None:
        return self.timeout.total_seconds() if self.timeout is not None else None
