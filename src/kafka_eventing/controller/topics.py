"""Topic management through the Kafka Admin API: create, grow partitions, set retention, delete.

Every failure becomes a ``TopicError`` whose ``reason``/``message`` go straight into the TopicReady condition,
so a provider's refusal (an Event Hubs topic quota, a missing ACL) reads as what it is, not "TopicFailed".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported without __all__
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

log = logging.getLogger(__name__)

RETENTION_MS = "retention.ms"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    retention_ms: int


@dataclass(frozen=True)
class TopicState:
    name: str
    partitions: int
    retention_ms: int | None


class TopicError(Exception):
    """A topic operation failed; ``reason`` is a CamelCase condition reason, ``message`` reads as a sentence."""

    def __init__(self, reason: str, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retriable = retriable


class TopicNotFound(TopicError):
    def __init__(self, name: str) -> None:
        super().__init__("TopicNotFound", f"topic {name!r} does not exist")


class ShrinkRefused(TopicError):
    def __init__(self, name: str, have: int, want: int) -> None:
        super().__init__("PartitionsShrinkRefused",
                         f"topic {name!r} has {have} partitions; Kafka cannot reduce them to {want}", retriable=False)


_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
                KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
_AUTH = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
         KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
_QUOTA = {KafkaError.POLICY_VIOLATION, KafkaError.THROTTLING_QUOTA_EXCEEDED}


def explain(exc: BaseException, topic: str, action: str, servers: str = "") -> TopicError:
    """A Kafka exception → TopicError with a reason a person can act on."""
    if isinstance(exc, TopicError):
        return exc
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        if isinstance(exc, TimeoutError):
            return TopicError("KafkaUnreachable", f"cannot {action} topic {topic!r}: Kafka at {servers} did not answer")
        return TopicError("TopicFailed", f"cannot {action} topic {topic!r}: {type(exc).__name__}: {exc}")
    code, text = err.code(), err.str()
    if code in _UNREACHABLE:
        where = f" at {servers}" if servers else ""
        return TopicError("KafkaUnreachable", f"cannot {action} topic {topic!r}: Kafka{where} is unreachable ({text})")
    if code in _AUTH:
        return TopicError("TopicNotAuthorized",
                          f"cannot {action} topic {topic!r}: the Kafka user is not allowed to ({text})")
    if code in _QUOTA:
        # Event Hubs answers a topic quota (one namespace caps its event hubs) with a policy violation.
        return TopicError("TopicQuotaExceeded", f"cannot {action} topic {topic!r}: refused by the provider's "
                          f"policy or quota ({text}); delete unused topics or raise the quota")
    if code == KafkaError.INVALID_REPLICATION_FACTOR:
        return TopicError("InvalidReplicationFactor",
                          f"cannot {action} topic {topic!r}: {text} (fewer brokers than the replication factor?)",
                          retriable=False)
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return TopicNotFound(topic)
    return TopicError("TopicFailed", f"cannot {action} topic {topic!r}: {err.name()}: {text}",
                      retriable=bool(err.retriable()))


class TopicAdmin(Protocol):
    def describe(self, name: str) -> TopicState: ...
    def create(self, spec: TopicSpec) -> None: ...
    def set_partitions(self, name: str, partitions: int) -> None: ...
    def set_retention(self, name: str, retention_ms: int) -> None: ...
    def delete(self, name: str) -> None: ...


class KafkaTopicAdmin:
    """``TopicAdmin`` on a confluent-kafka AdminClient; one per connection config, safe across threads."""

    def __init__(self, config: Mapping[str, Any], timeout: float = 10.0) -> None:
        self.servers = str(config.get("bootstrap.servers", ""))
        self.timeout = timeout
        # librdkafka logs every failed reconnect; the reconciler reports them through conditions instead.
        self._admin = AdminClient({**config, "log_level": 3, "socket.timeout.ms": int(timeout * 1000)})
        self._lock = threading.Lock()

    def _wait(self, future: Any, topic: str, action: str) -> Any:
        try:
            return future.result(timeout=self.timeout + 2)
        except Exception as exc:
            raise explain(exc, topic, action, self.servers) from exc

    def describe(self, name: str) -> TopicState:
        futures = self._admin.describe_topics(TopicCollection([name]), request_timeout=self.timeout)
        desc = self._wait(futures[name], name, "describe")
        resource = ConfigResource(ResourceType.TOPIC, name)
        configs = self._admin.describe_configs([resource], request_timeout=self.timeout)
        entries = self._wait(configs[resource], name, "read the configuration of")
        entry = entries.get(RETENTION_MS)
        retention = int(entry.value) if entry is not None and entry.value is not None else None
        return TopicState(name=name, partitions=len(desc.partitions), retention_ms=retention)

    def create(self, spec: TopicSpec) -> None:
        topic = NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=spec.replication_factor,
                         config={RETENTION_MS: str(spec.retention_ms)})
        futures = self._admin.create_topics([topic], operation_timeout=self.timeout, request_timeout=self.timeout)
        try:
            futures[spec.name].result(timeout=self.timeout + 2)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return  # created by an earlier, interrupted reconcile: the caller describes it next
            raise explain(exc, spec.name, "create", self.servers) from exc
        except Exception as exc:
            raise explain(exc, spec.name, "create", self.servers) from exc

    def set_partitions(self, name: str, partitions: int) -> None:
        futures = self._admin.create_partitions([NewPartitions(name, partitions)], operation_timeout=self.timeout,
                                                request_timeout=self.timeout)
        self._wait(futures[name], name, "add partitions to")

    def set_retention(self, name: str, retention_ms: int) -> None:
        # Incremental: only retention.ms changes, other topic configs set by hand are kept.
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
            ConfigEntry(RETENTION_MS, str(retention_ms), incremental_operation=AlterConfigOpType.SET)])
        futures = self._admin.incremental_alter_configs([resource], request_timeout=self.timeout)
        self._wait(futures[resource], name, "set retention of")

    def delete(self, name: str) -> None:
        futures = self._admin.delete_topics([name], operation_timeout=self.timeout, request_timeout=self.timeout)
        try:
            self._wait(futures[name], name, "delete")
        except TopicNotFound:
            return  # already gone: deleting is done


@dataclass(frozen=True)
class TopicOutcome:
    created: bool = False
    partitions_added: int = 0
    retention_changed: bool = False


def ensure_topic(admin: TopicAdmin, spec: TopicSpec, *, manage: bool) -> TopicOutcome:
    """Make the topic match ``spec``. With ``manage=False`` (external topics) only check that it exists."""
    try:
        state = admin.describe(spec.name)
    except TopicNotFound:
        if not manage:
            raise TopicError("TopicNotFound", f"external topic {spec.name!r} does not exist; "
                             "create it with the provider's tools (topics are not created in external mode)") from None
        admin.create(spec)
        log.info("topic created", extra={"topic": spec.name, "partitions": spec.partitions})
        state = admin.describe(spec.name)
        created = True
    else:
        created = False
    if not manage:
        return TopicOutcome()
    added = 0
    if state.partitions > spec.partitions:
        raise ShrinkRefused(spec.name, state.partitions, spec.partitions)
    if state.partitions < spec.partitions:
        admin.set_partitions(spec.name, spec.partitions)
        added = spec.partitions - state.partitions
    changed = False
    if state.retention_ms != spec.retention_ms:
        admin.set_retention(spec.name, spec.retention_ms)
        changed = not created
    return TopicOutcome(created=created, partitions_added=added, retention_changed=changed)
