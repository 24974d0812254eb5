"""KafkaSink (``eventing.knative.dev/v1alpha1``) facts every role shares: API coordinates, the spec fields, the
sink ingress address, and the sink as the receiver sees it.

A KafkaSink is an Addressable that writes what is POSTed to it to one existing (or created) topic, on the Kafka
cluster it names; no dispatcher. Upstream gives sinks an ingress Service of their own (``kafka-sink-ingress``,
``/<namespace>/<name>`` on it), so a Broker and a KafkaSink of the same namespace and name never share an
address: here the second Service selects the same receiver pods, and the receiver tells the two apart by the
``Host`` a request names (``is_sink_host``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka_eventing.core.binding import ContentMode
from kafka_eventing.core.channels import Channel, knative_audience, labels_of
from kafka_eventing.core.kafka_config import connection_ref

GROUP = "eventing.knative.dev"
VERSION = "v1alpha1"
KIND = "KafkaSink"
PLURAL = "kafkasinks"
CONTENT_MODES = tuple(mode.value for mode in ContentMode)


def sink_audience(namespace: str, name: str) -> str:
    return knative_audience(GROUP, KIND, namespace, name)


def ingress_host(service: str, system_namespace: str) -> str:
    return f"{service}.{system_namespace}.svc.cluster.local"


def ingress_url(service: str, system_namespace: str, namespace: str, name: str) -> str:
    """``status.address.url`` of a KafkaSink: the sink ingress Service, path ``/<namespace>/<name>``."""
    return f"http://{ingress_host(service, system_namespace)}/{namespace}/{name}"


def is_sink_host(host: str, service: str) -> bool:
    """Whether a ``Host`` names the sink ingress Service (``service``, lower case): ``<service>``,
    ``<service>.<namespace>[.svc...]``, with or without a port."""
    return host.partition(".")[0].partition(":")[0].lower() == service


def content_mode(spec: Mapping[str, Any]) -> ContentMode:
    """``spec.contentMode``: binary (the default) or structured; anything else raises ValueError."""
    return ContentMode(str(spec.get("contentMode") or ContentMode.BINARY.value).lower())


def sink_ingress(obj: Mapping[str, Any], *, reconciled: bool = True) -> Channel | None:
    """A KafkaSink as the receiver sees it: its topic, content mode, cluster, and whether it may take events.

    Ready once the controller reports TopicReady. ``reconciled=False`` (a standalone YAML, no controller): ready
    unless its status says otherwise. A sink without a topic or with an unknown content mode is None (the
    CRD's schema refuses both; a YAML file may not).
    """
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    topic = str(spec.get("topic") or "")
    try:
        mode = content_mode(spec)
    except ValueError:
        return None
    if not topic or not name:
        return None
    topic_ready = next((c for c in status.get("conditions") or () if c.get("type") == "TopicReady"), None)
    ready = topic_ready is not None and str(topic_ready.get("status")) == "True"
    if topic_ready is None and not reconciled:
        ready, reason = True, ""
    elif topic_ready is None:
        reason = "not reconciled yet: the controller has not reported TopicReady"
    else:
        reason = "" if ready else str(topic_ready.get("message") or topic_ready.get("reason") or "topic not ready")
    audience = (status.get("address") or {}).get("audience")
    return Channel(namespace=namespace, name=name, topic=topic, ready=ready, reason=reason, content_mode=mode,
                   subject_key=False,
                   ordered=False, generation=int(meta.get("generation") or 0), uid=str(meta.get("uid") or ""),
                   audience=str(audience or sink_audience(namespace, name)), connection=connection_ref(status),
                   labels=labels_of(meta))
