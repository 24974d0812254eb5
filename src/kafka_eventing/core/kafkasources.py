"""KafkaSource (``sources.knative.dev/v1``, v1beta1 served with the same schema) facts every role shares: API
coordinates, names and defaults, the spec parsed into typed objects, and how a record that is not a CloudEvent
becomes one (exactly as upstream's dispatcher converts it, ``InvalidCloudEventInterceptor`` and ``KeyDeserializer``
in knative-extensions/eventing-kafka-broker).
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol
from urllib.parse import quote

from kafka_eventing.core.binding import CloudEvent
from kafka_eventing.core.delivery import DeliverySpec, DeliverySpecError, rate_limit_annotation

GROUP = "sources.knative.dev"
VERSION = "v1"
VERSIONS = ("v1", "v1beta1")
KIND = "KafkaSource"
PLURAL = "kafkasources"
#: How the record key is read (upstream's label): string (default), int, float or byte-array.
LABEL_KEY_TYPE = "kafkasources.sources.knative.dev/key-type"
KEY_TYPES = ("string", "int", "float", "byte-array")
INITIAL_OFFSETS = ("latest", "earliest")
ORDERINGS = ("ordered", "unordered")
#: Upstream's default ordering for a KafkaSource (a Trigger's is unordered).
DEFAULT_ORDERING = "ordered"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Conditions, as upstream's KafkaSource (OIDCIdentityCreated aside: this data plane has no OIDC identity).
SINK_PROVIDED = "SinkProvided"
DEPLOYED = "Deployed"
CONNECTION_ESTABLISHED = "ConnectionEstablished"
INITIAL_OFFSETS_COMMITTED = "InitialOffsetsCommitted"
KEY_TYPE_CORRECT = "KeyTypeCorrect"
DEPENDENTS = (SINK_PROVIDED, DEPLOYED, CONNECTION_ESTABLISHED, INITIAL_OFFSETS_COMMITTED, KEY_TYPE_CORRECT)
#: The dispatcher consumes only once these are True (the sink URI known, the group's start committed).
DISPATCH_GATES = (SINK_PROVIDED, INITIAL_OFFSETS_COMMITTED)

#: The CloudEvent type of a converted record.
EVENT_TYPE = "dev.knative.kafka.event"
_EXTENSION_BAD_CHARS = re.compile(r"[^a-z0-9]")
_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")
# The CloudEvents SDK's HTTP header-value rule: printable ASCII but space, '"' and '%' as is, the rest encoded.
#: KEDA autoscaling, asked for by annotations in either dialect users' manifests carry: Knative's
#: eventing-autoscaler-keda (``autoscaling.knative.dev/*`` with ``keda.autoscaling.knative.dev/*``) and
#: eventing-kafka-broker's own (``autoscaling.eventing.knative.dev/*``).
ANNOTATIONS_AUTOSCALING_CLASS = ("autoscaling.knative.dev/class", "autoscaling.eventing.knative.dev/class")
AUTOSCALING_CLASS_KEDA = "keda.autoscaling.knative.dev"
AUTOSCALING_CLASS_DISABLED = "disabled"
#: field → (its annotations, least value, default). min 1, not upstream's 0: scale to zero is opted into by
#: writing min-scale "0" (a source at zero delivers a record only after KEDA's next poll sees the lag).
AUTOSCALING_FIELDS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "min_replicas": (("autoscaling.knative.dev/minScale", "autoscaling.knative.dev/min-scale",
                      "autoscaling.eventing.knative.dev/min-scale"), 0, 1),
    "max_replicas": (("autoscaling.knative.dev/maxScale", "autoscaling.knative.dev/max-scale",
                      "autoscaling.eventing.knative.dev/max-scale"), 1, 50),
    "polling_interval": (("keda.autoscaling.knative.dev/pollingInterval",
                          "autoscaling.eventing.knative.dev/polling-interval"), 1, 10),
    "cooldown_period": (("keda.autoscaling.knative.dev/cooldownPeriod",
                         "autoscaling.eventing.knative.dev/cooldown-period"), 0, 30),
    "lag_threshold": (("keda.autoscaling.knative.dev/kafkaLagThreshold",
                       "autoscaling.eventing.knative.dev/lag-threshold"), 1, 100),
    "activation_lag_threshold": (("keda.autoscaling.knative.dev/kafkaActivationLagThreshold",
                                  "autoscaling.eventing.knative.dev/activation-lag-threshold"), 0, 0),
}

_HTTP_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ('"', "%"))


class SourceSpecError(ValueError):
    """A KafkaSource field cannot be used; ``reason`` is the condition reason, the message names the field."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class Sasl:
    user: SecretKeyRef | None
    password: SecretKeyRef | None
    mechanism: SecretKeyRef | None


@dataclass(frozen=True)
class Tls:
    cert: SecretKeyRef | None
    key: SecretKeyRef | None
    ca_cert: SecretKeyRef | None


@dataclass(frozen=True)
class Autoscaling:
    """KEDA's bounds and thresholds for the source's dispatcher (see ``AUTOSCALING_FIELDS``)."""

    min_replicas: int = 1
    max_replicas: int = 50
    polling_interval: int = 10
    cooldown_period: int = 30
    lag_threshold: int = 100
    activation_lag_threshold: int = 0


@dataclass(frozen=True)
class SourceSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    bootstrap_servers: tuple[str, ...]
    topics: tuple[str, ...]
    consumer_group: str
    initial_offset: str
    consumers: int
    sasl: Sasl | None
    tls: Tls | None
    ordered: bool
    key_type: str
    sink: Mapping[str, Any]
    delivery: Mapping[str, Any] | None
    #: ``ceOverrides.extensions``, set on every event delivered (as upstream's CloudEventOverridesMutator).
    extensions: tuple[tuple[str, str], ...]
    #: Events per second to the sink for each of its topics (``ANNOTATION_RATE_LIMIT``); None: unlimited.
    rate_limit: float | None = None
    #: KEDA scales the dispatcher (``spec.consumers`` is then not used); None: the controller sets replicas.
    autoscaling: Autoscaling | None = None

    @property
    def protocol(self) -> str:
        if self.sasl is not None:
            return "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"
        return "SSL" if self.tls is not None else "PLAINTEXT"


def default_group(uid: str) -> str:
    """The group of a source whose ``spec.consumerGroup`` is unset, for its lifetime (the uid never changes).

    Upstream's webhook writes ``knative-kafka-source-<random UUID>`` into the spec; a CRD default cannot make one, so
    here the field stays unset and the controller and the dispatcher both derive this name. The CRD refuses adding,
    changing or removing ``consumerGroup`` after creation (docs/api.md), so the group never moves under a source."""
    return f"knative-kafka-source-{uid}"


def event_source(namespace: str, name: str, topic: str) -> str:
    return f"/apis/v1/namespaces/{namespace}/{PLURAL}/{name}#{topic}"


def _ref(obj: Any, where: str) -> SecretKeyRef | None:
    if not obj:
        return None
    ref = obj.get("secretKeyRef") if isinstance(obj, Mapping) else None
    if not isinstance(ref, Mapping) or not ref.get("name") or not ref.get("key"):
        raise SourceSpecError("InvalidSecretReference", f"{where}.secretKeyRef needs name and key")
    return SecretKeyRef(str(ref["name"]), str(ref["key"]))


def secret_names(obj: Mapping[str, Any]) -> set[str]:
    """The Secrets a KafkaSource's ``net`` names (whatever else its spec says)."""
    net = (obj.get("spec") or {}).get("net") or {}
    names = set()
    for part in (net.get("sasl") or {}, net.get("tls") or {}):
        for value in part.values() if isinstance(part, Mapping) else ():
            ref = value.get("secretKeyRef") if isinstance(value, Mapping) else None
            if isinstance(ref, Mapping) and ref.get("name"):
                names.add(str(ref["name"]))
    return names


def parse_autoscaling(annotations: Mapping[str, Any] | None) -> Autoscaling | None:
    """The KEDA annotations; None when no KEDA class is asked for. ``SourceSpecError`` for a value that cannot
    be honoured, and for scaling annotations without the KEDA class (they would be stored and ignored)."""
    annotations = annotations or {}
    classes = {str(annotations[k]).strip() for k in ANNOTATIONS_AUTOSCALING_CLASS if k in annotations}
    given = {attr: [(k, str(annotations[k]).strip()) for k in keys if k in annotations]
             for attr, (keys, _, _) in AUTOSCALING_FIELDS.items()}
    named = [k for pairs in given.values() for k, _ in pairs]
    if len(classes) > 1:
        raise SourceSpecError("InvalidAutoscaling", "the annotations "
                              f"{' and '.join(ANNOTATIONS_AUTOSCALING_CLASS)} disagree: {', '.join(sorted(classes))}")
    klass = next(iter(classes), None)
    if klass == AUTOSCALING_CLASS_DISABLED:
        return None
    if klass is None:
        if named:
            raise SourceSpecError("InvalidAutoscaling",
                                  f"{', '.join(named)} need the annotation {ANNOTATIONS_AUTOSCALING_CLASS[0]}: "
                                  f"{AUTOSCALING_CLASS_KEDA} (KEDA scales the source only when asked)")
        return None
    if klass != AUTOSCALING_CLASS_KEDA:
        raise SourceSpecError("InvalidAutoscaling", f"autoscaling class {klass!r} is not served for KafkaSources: "
                              f"{AUTOSCALING_CLASS_KEDA} or {AUTOSCALING_CLASS_DISABLED}")
    values: dict[str, int] = {}
    for attr, pairs in given.items():
        _, least, default = AUTOSCALING_FIELDS[attr]
        if len({v for _, v in pairs}) > 1:
            raise SourceSpecError("InvalidAutoscaling", f"the annotations {' and '.join(k for k, _ in pairs)} "
                                                        "disagree")
        if not pairs:
            values[attr] = default
            continue
        key, text = pairs[0]
        try:
            values[attr] = int(text)
        except ValueError:
            raise SourceSpecError("InvalidAutoscaling", f"annotation {key} is not a whole number: {text!r}") from None
        if values[attr] < least:
            raise SourceSpecError("InvalidAutoscaling", f"annotation {key} must be at least {least}, not {text}")
    if values["min_replicas"] > values["max_replicas"]:
        raise SourceSpecError("InvalidAutoscaling", f"min-scale {values['min_replicas']} is above max-scale "
                                                    f"{values['max_replicas']}")
    return Autoscaling(**values)


def parse_source(obj: Mapping[str, Any]) -> SourceSpec:
    """The typed spec; ``SourceSpecError`` (with a condition reason) for a field that cannot be honoured."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    servers = tuple(str(s).strip() for s in spec.get("bootstrapServers") or () if str(s).strip())
    if not servers:
        raise SourceSpecError("InvalidBootstrapServers", "spec.bootstrapServers names no server")
    topics = tuple(str(t) for t in spec.get("topics") or () if str(t))
    if not topics:
        raise SourceSpecError("InvalidTopics", "spec.topics names no topic")
    if len(set(topics)) != len(topics):
        raise SourceSpecError("InvalidTopics", f"spec.topics names a topic twice: {', '.join(topics)}")
    offset = str(spec.get("initialOffset") or "latest").lower()
    if offset not in INITIAL_OFFSETS:
        raise SourceSpecError("InvalidInitialOffset",
                              f"spec.initialOffset {spec.get('initialOffset')!r} must be earliest or latest")
    raw_consumers = spec.get("consumers", 1)
    if not isinstance(raw_consumers, int) or isinstance(raw_consumers, bool) or raw_consumers < 0:
        raise SourceSpecError("InvalidConsumers", f"spec.consumers {raw_consumers!r} must be a whole number ≥ 0")
    ordering = str(spec.get("ordering") or DEFAULT_ORDERING).lower()
    if ordering not in ORDERINGS:
        raise SourceSpecError("InvalidOrdering",
                              f"spec.ordering {spec.get('ordering')!r} must be ordered or unordered")
    key_type = str((meta.get("labels") or {}).get(LABEL_KEY_TYPE) or "string")
    if key_type not in KEY_TYPES:
        raise SourceSpecError("InvalidKeyType", f"label {LABEL_KEY_TYPE}={key_type!r} must be one of "
                                                f"{', '.join(KEY_TYPES)}")
    net = spec.get("net") or {}
    sasl_spec, tls_spec = net.get("sasl") or {}, net.get("tls") or {}
    sasl = tls = None
    if sasl_spec.get("enable"):
        sasl = Sasl(_ref(sasl_spec.get("user"), "spec.net.sasl.user"),
                    _ref(sasl_spec.get("password"), "spec.net.sasl.password"),
                    _ref(sasl_spec.get("type"), "spec.net.sasl.type"))
        if sasl.user is None or sasl.password is None:
            raise SourceSpecError("InvalidSecretReference",
                                  "spec.net.sasl is enabled: user and password need a secretKeyRef")
    if tls_spec.get("enable"):
        tls = Tls(_ref(tls_spec.get("cert"), "spec.net.tls.cert"), _ref(tls_spec.get("key"), "spec.net.tls.key"),
                  _ref(tls_spec.get("caCert"), "spec.net.tls.caCert"))
        if (tls.cert is None) != (tls.key is None):
            raise SourceSpecError("InvalidSecretReference", "spec.net.tls: cert and key go together")
    delivery = spec.get("delivery")
    try:
        DeliverySpec.from_dict(delivery, "", namespace)  # checked here; the dead-letter sink resolved elsewhere
    except DeliverySpecError as exc:
        raise SourceSpecError("InvalidDelivery", f"spec.delivery: {exc}") from None
    extensions = (spec.get("ceOverrides") or {}).get("extensions") or {}
    for ext in extensions:
        if not _EXTENSION_NAME.match(str(ext)) or ext == "data":
            raise SourceSpecError("InvalidCeOverrides",
                                  f"spec.ceOverrides.extensions: {ext!r} is not a CloudEvent extension name "
                                  "(lower-case letters and digits)")
    try:
        rate_limit = rate_limit_annotation(meta.get("annotations"))
    except DeliverySpecError as exc:
        raise SourceSpecError("InvalidRateLimit", str(exc)) from None
    autoscaling = parse_autoscaling(meta.get("annotations"))
    return SourceSpec(
        namespace=namespace, name=name, uid=uid, generation=int(meta.get("generation") or 0),
        bootstrap_servers=servers, topics=topics, consumer_group=str(spec.get("consumerGroup") or default_group(uid)),
        initial_offset=offset, consumers=raw_consumers, sasl=sasl, tls=tls, ordered=ordering == "ordered",
        key_type=key_type, sink=spec.get("sink") or {}, delivery=delivery,
        extensions=tuple(sorted((str(k), str(v)) for k, v in extensions.items())), rate_limit=rate_limit,
        autoscaling=autoscaling)


# -- a record that is not a CloudEvent, as a CloudEvent -------------------------------------------------------
def http_value(text: str) -> str:
    """A CloudEvent attribute as an HTTP header value (the SDK's percent-encoding)."""
    return quote(text, safe=_HTTP_SAFE)


def _java_number(digits: str, exponent: int, negative: bool) -> str:
    """``Float.toString``/``Double.toString`` from the shortest decimal digits: plain between 10^-3 and 10^7,
    else computerized scientific notation (``1.0E7``)."""
    point = len(digits) + exponent  # the decimal point's position in the digits
    sign = "-" if negative else ""
    if -2 <= point <= 7:  # 10^-3 <= |x| < 10^7
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, frac = (digits + "0" * max(0, point - len(digits)))[:point], digits[point:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def java_float(value: float, *, single: bool) -> str:
    """How Java prints a Float (``single``) or a Double: the shortest digits that read back as the same value."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = repr(value)
    if single:
        for precision in range(1, 10):
            text = f"{value:.{precision}g}"
            if struct.unpack(">f", struct.pack(">f", float(text)))[0] == value:
                break
    sign, digit_tuple, exponent = Decimal(text).normalize().as_tuple()
    return _java_number("".join(map(str, digit_tuple)), int(exponent), bool(sign))


def record_key(key: bytes | None, key_type: str) -> str | None:
    """The key as the ``key``/``partitionkey`` extensions carry it in HTTP binary mode: no key when absent or
    empty; a string (UTF-8); int (4 bytes, big-endian) or float (4 or 8 bytes) as Java prints the number, other
    lengths read as a string; byte-array as base64 (the spec's Binary encoding)."""
    if not key:
        return None
    if key_type == "byte-array":
        return base64.b64encode(key).decode()
    if key_type == "int" and len(key) == 4:
        return str(struct.unpack(">i", key)[0])
    if key_type == "float" and len(key) in (4, 8):
        single = len(key) == 4
        return java_float(struct.unpack(">f" if single else ">d", key)[0], single=single)
    return key.decode("utf-8", errors="replace")


def record_time(timestamp_ms: int) -> str:
    """Java's ISO_OFFSET_DATE_TIME of the record timestamp in UTC: the fraction only as long as needed."""
    when = datetime.fromtimestamp(timestamp_ms // 1000, UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    millis = timestamp_ms % 1000
    if millis:
        text += f".{millis:03d}".rstrip("0")
    return text + "Z"


def header_extension(name: str) -> str:
    return "kafkaheader" + _EXTENSION_BAD_CHARS.sub("", name.lower())


@dataclass(frozen=True)
class PlainEvent:
    """A non-CloudEvent record as the CloudEvent upstream makes of it: ``attributes`` in their wire form
    (strings), ``data`` the record value (None for a tombstone)."""

    attributes: dict[str, str]
    data: bytes | None

    def http(self) -> tuple[dict[str, str], bytes]:
        """HTTP binary mode: ``ce-`` headers, Content-Type for ``datacontenttype``, the value as the body."""
        headers = {}
        for name, value in self.attributes.items():
            if name == "datacontenttype":
                headers["content-type"] = value
            else:
                headers[f"ce-{name}"] = http_value(value)
        return headers, self.data or b""

    def cloudevent(self) -> CloudEvent:
        """The SDK event (for a dead letter): the same attributes, ``time`` as a datetime."""
        attributes: dict[str, Any] = dict(self.attributes)
        attributes["time"] = datetime.fromisoformat(attributes["time"])
        return CloudEvent(attributes, self.data)


class Record(Protocol):
    """What the conversion reads of a consumed record (a confluent-kafka ``Message``)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> str | bytes | None: ...
    def value(self) -> str | bytes | None: ...
    def headers(self) -> Any: ...


def convert_record(namespace: str, name: str, record: Record, key_type: str = "string") -> PlainEvent:
    """Upstream's conversion: type ``dev.knative.kafka.event``, source ``/apis/v1/namespaces/<ns>/kafkasources/
    <name>#<topic>``, subject ``partition:<p>#<offset>``, id ``partition:<p>/offset:<offset>``, time the record
    timestamp (UTC), the key as ``partitionkey`` and ``key``, each header as ``kafkaheader<name lower-cased, only
    [a-z0-9] kept>`` (its value as UTF-8; a later header of the same extension wins), a ``content-type`` header
    (any case) as ``datacontenttype`` lower-cased, the value as data.

    Two edge cases upstream does not define (its Java code fails on them): a header without a value is an empty
    extension, an empty ``content-type`` header sets no ``datacontenttype``."""
    topic, partition, offset = str(record.topic()), int(record.partition() or 0), int(record.offset() or 0)
    raw_key, value = record.key(), record.value()
    key = raw_key.encode() if isinstance(raw_key, str) else raw_key
    attributes = {
        "specversion": "1.0",
        "id": f"partition:{partition}/offset:{offset}",
        "source": event_source(namespace, name, topic),
        "type": EVENT_TYPE,
        "subject": f"partition:{partition}#{offset}",
        "time": record_time(record.timestamp()[1]),
    }
    text_key = record_key(key, key_type)
    if text_key is not None:
        attributes["partitionkey"] = attributes["key"] = text_key
    content_type = None
    for header, raw in record.headers() or ():
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else (raw or "")
        if header.lower() == "content-type":
            content_type = text
            continue
        attributes[header_extension(header)] = text
    if content_type:
        attributes["datacontenttype"] = content_type.lower()
    return PlainEvent(attributes, value.encode() if isinstance(value, str) else value)
