"""Broker and Trigger (``eventing.knative.dev/v1``) facts every role shares: API coordinates, the class this
project implements, and the names derived from a Broker or Trigger (topic, consumer group, ingress path)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka_eventing.core.channels import Channel, knative_audience, labels_of
from kafka_eventing.core.kafka_config import connection_ref

GROUP = "eventing.knative.dev"
VERSION = "v1"
BROKERS = "brokers"
TRIGGERS = "triggers"
ANNOTATION_BROKER_CLASS = "eventing.knative.dev/broker.class"
#: The broker class this project implements (upstream's Kafka broker uses the same value).
BROKER_CLASS = "Kafka"
#: The class whose data plane (receiver, dispatchers, their Service and ServiceAccounts) runs in the Broker's own
#: namespace, shared with no other namespace (upstream's value).
NAMESPACED_BROKER_CLASS = "KafkaNamespaced"
#: The namespaced data plane's ingress Service, in each namespace with KafkaNamespaced Brokers (upstream's name).
NAMESPACED_INGRESS_SERVICE = "kafka-broker-ingress"
ANNOTATION_EXTERNAL_TOPIC = "kafka.eventing.knative.dev/external.topic"
ANNOTATION_DELIVERY_ORDER = "kafka.eventing.knative.dev/delivery.order"
#: A Trigger waits for this object (a JSON ObjectReference) to be Ready, as upstream's dependency annotation.
ANNOTATION_DEPENDENCY = "knative.dev/dependency"
#: The cluster-wide default Broker config, in the system namespace, used when ``spec.config`` is absent.
DEFAULT_BROKER_CONFIG = "kafka-broker-config"
KEY_PARTITIONS = "default.topic.partitions"
KEY_REPLICATION = "default.topic.replication.factor"

# Trigger conditions. The controller writes these four (and Ready, from all of them)...
BROKER_READY = "BrokerReady"
SUBSCRIBER_RESOLVED = "SubscriberResolved"
SUBSCRIPTION_READY = "SubscriptionReady"
DEPENDENCY_READY = "DependencyReady"
#: ... the Broker's dispatcher writes only this one: whether the Trigger's consumer group joined and consumes.
CONSUMER_GROUP_READY = "ConsumerGroupReady"
#: The controller's conditions that must all be True before the dispatcher consumes for a Trigger (its own filter
#: and delivery checks stand for SubscriptionReady). Not Ready: Ready waits for ConsumerGroupReady.
DISPATCH_GATES = (BROKER_READY, SUBSCRIBER_RESOLVED, DEPENDENCY_READY)


def broker_class(broker: Mapping[str, Any] | None) -> str:
    """The Broker's class annotation, lower-cased ("" without one)."""
    annotations = ((broker or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ANNOTATION_BROKER_CLASS) or "").lower()


def is_kafka_broker(broker: Mapping[str, Any] | None) -> bool:
    """A Broker this project serves: of the ``Kafka`` or the ``KafkaNamespaced`` class."""
    return broker_class(broker) in (BROKER_CLASS.lower(), NAMESPACED_BROKER_CLASS.lower())


def is_namespaced_broker(broker: Mapping[str, Any] | None) -> bool:
    """A ``KafkaNamespaced`` Broker: its data plane runs in its own namespace."""
    return broker_class(broker) == NAMESPACED_BROKER_CLASS.lower()


def served_by(broker: Mapping[str, Any] | None, receiver_namespace: str) -> bool:
    """Whether the receiver scoped to ``receiver_namespace`` serves ``broker``: the shared receiver ("") every
    Kafka-class Broker and no KafkaNamespaced one; a namespaced receiver only the KafkaNamespaced Brokers of its
    own namespace."""
    if not is_kafka_broker(broker):
        return False
    if not receiver_namespace:
        return not is_namespaced_broker(broker)
    namespace = ((broker or {}).get("metadata") or {}).get("namespace")
    return is_namespaced_broker(broker) and namespace == receiver_namespace


def namespaced_ingress_host(namespace: str) -> str:
    """The host of a KafkaNamespaced Broker's ingress: its namespace's ``kafka-broker-ingress`` Service."""
    return f"{NAMESPACED_INGRESS_SERVICE}.{namespace}.svc.cluster.local"


def broker_topic(namespace: str, name: str) -> str:
    return f"knative-broker-{namespace}-{name}"


def topic_of(broker: Mapping[str, Any]) -> str:
    """The external topic when annotated, else the Broker's own."""
    meta = broker.get("metadata") or {}
    external = (meta.get("annotations") or {}).get(ANNOTATION_EXTERNAL_TOPIC)
    return str(external or broker_topic(str(meta.get("namespace")), str(meta.get("name"))))


TRIGGER_GROUP_PREFIX = "knative-trigger-"


def trigger_group(namespace: str, name: str) -> str:
    """The consumer group of one Trigger: stable across dispatcher restarts and rescheduling."""
    return f"{TRIGGER_GROUP_PREFIX}{namespace}-{name}"


def reader_group(namespace: str, name: str) -> str:
    """The group of the Broker dispatcher's shared read: it spreads the Broker's partitions over the dispatcher
    replicas and holds no offsets. It has members exactly while a dispatcher of the Broker runs, which is when the
    Triggers' groups (memberless: the dispatcher commits them) must not be moved from outside."""
    return f"knative-broker-dispatcher-{namespace}-{name}"


def trigger_broker(trigger: Mapping[str, Any]) -> str:
    """The Broker of its own namespace a Trigger names (``spec.broker``, or ``spec.brokerRef.name``); "" when its
    ``brokerRef`` names another namespace's (``foreign_broker``), so that no same-named Broker here takes it."""
    spec = trigger.get("spec") or {}
    if not spec.get("broker") and foreign_broker(trigger):
        return ""
    return str(spec.get("broker") or (spec.get("brokerRef") or {}).get("name") or "")


def foreign_broker(trigger: Mapping[str, Any]) -> str:
    """``namespace/name`` of the Broker a Trigger's ``spec.brokerRef`` names in another namespace, else "".
    Cross-namespace Triggers (Knative's ``cross-namespace-event-links``) are not served: the controller says so."""
    spec = trigger.get("spec") or {}
    ref = spec.get("brokerRef") or {}
    namespace = ref.get("namespace")
    if spec.get("broker") or not namespace or namespace == (trigger.get("metadata") or {}).get("namespace"):
        return ""
    return f"{namespace}/{ref.get('name') or ''}"


def broker_audience(namespace: str, name: str) -> str:
    """A Broker's audience (``knative_audience``): what senders ask tokens for when the Broker publishes no
    ``status.address.audience`` of its own."""
    return knative_audience(GROUP, "Broker", namespace, name)


def ingress_url(receiver_host: str, namespace: str, name: str) -> str:
    return f"http://{receiver_host}/{namespace}/{name}"


def broker_ingress(obj: Mapping[str, Any], *, reconciled: bool = True) -> Channel | None:
    """A Kafka-class Broker as the receiver sees it: where its events go, and whether they may go there yet.

    Ready once the controller reports TopicReady (not Ready: that includes the receiver's own availability).
    ``reconciled=False`` (a standalone YAML, no controller): ready unless its status says otherwise.
    Brokers of other classes are None: another implementation serves them.
    """
    if not is_kafka_broker(obj):
        return None
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    topic_ready = next((c for c in (obj.get("status") or {}).get("conditions") or ()
                        if c.get("type") == "TopicReady"), None)
    ready = topic_ready is not None and str(topic_ready.get("status")) == "True"
    if topic_ready is None and not reconciled:
        ready, reason = True, ""
    elif topic_ready is None:
        reason = "not reconciled yet: the controller has not reported TopicReady"
    else:
        reason = "" if ready else str(topic_ready.get("message") or topic_ready.get("reason") or "topic not ready")
    audience = ((obj.get("status") or {}).get("address") or {}).get("audience")
    return Channel(namespace=namespace, name=name, topic=topic_of(obj), ready=ready, reason=reason,
                   ordered=False, generation=int(meta.get("generation") or 0), uid=str(meta.get("uid") or ""),
                   audience=str(audience or broker_audience(namespace, name)),
                   connection=connection_ref(obj.get("status")), labels=labels_of(meta))
