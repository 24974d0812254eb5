"""Topic management through the Kafka Admin API: create, grow partitions, set retention, delete.

Every failure becomes a ``TopicError`` whose ``reason``/``message`` go straight into the TopicReady condition,
so a provider's refusal (an Event Hubs topic quota, a missing ACL) reads as what it is, not "TopicFailed".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
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
    #: None: the cluster's default retention, and an existing topic's is left as it is (a KafkaSink's topic)
    retention_ms: int | None


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
    def delete_group(self, group: str) -> None: ...


class _Batcher:
    """Coalesces concurrent single-item Admin calls into one request.

    A broker handles one CreateTopics request of 100 topics about six times faster than 100 requests of one,
    so when many channels are reconciled at once (a fresh install, a controller restart) the workers' calls
    are gathered for ``window`` seconds and sent together. A lone call pays only the window.
    """

    def __init__(self, send: Callable[[list[Any]], Mapping[Any, Future[Any]]], window: float) -> None:
        self._send = send
        self._window = window
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, Future[Any]]] = []

    def submit(self, item: Any) -> Future[Any]:
        mine: Future[Any] = Future()
        with self._lock:
            self._pending.append((item, mine))
            first = len(self._pending) == 1
        if first:
            # The first caller of a window sends the batch for everyone who joined meanwhile.
            time.sleep(self._window)
            with self._lock:
                batch, self._pending = self._pending, []
            self._dispatch(batch)
        return mine

    def _dispatch(self, batch: list[tuple[Any, Future[Any]]]) -> None:
        unique = list({_key(item): item for item, _ in batch}.values())  # two channels may share a topic
        try:
            sent = self._send(unique)
        except Exception as exc:
            for _, fut in batch:
                fut.set_exception(exc)
            return
        for item, fut in batch:
            upstream = sent[_key(item)]
            upstream.add_done_callback(_relay_to(fut))


def _key(item: Any) -> Any:
    return item.topic if isinstance(item, NewTopic) else item


def _relay_to(fut: Future[Any]) -> Callable[[Future[Any]], None]:
    def relay(done: Future[Any]) -> None:
        exc = done.exception()
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(done.result())

    return relay


class KafkaTopicAdmin:
    """``TopicAdmin`` on a confluent-kafka AdminClient; one per connection config, safe across threads."""

    def __init__(self, config: Mapping[str, Any], timeout: float = 10.0, batch_window: float = 0.02) -> None:
        self.servers = str(config.get("bootstrap.servers", ""))
        self.timeout = timeout
        # librdkafka logs every failed reconnect; the reconciler reports them through conditions instead.
        self._admin = AdminClient({**config, "log_level": 2, "socket.timeout.ms": int(timeout * 1000)})
        self._describe = _Batcher(self._describe_many, batch_window)
        self._create = _Batcher(self._create_many, batch_window)
        self._configs = _Batcher(self._configs_many, batch_window)

    def _describe_many(self, names: list[str]) -> Mapping[str, Future[Any]]:
        result: Mapping[str, Future[Any]] = self._admin.describe_topics(TopicCollection(names),
                                                                        request_timeout=self.timeout)
        return result

    def _configs_many(self, resources: list[Any]) -> Mapping[Any, Future[Any]]:
        result: Mapping[Any, Future[Any]] = self._admin.describe_configs(resources, request_timeout=self.timeout)
        return result

    def _create_many(self, topics: list[Any]) -> Mapping[str, Future[Any]]:
        result: Mapping[str, Future[Any]] = self._admin.create_topics(
            topics, operation_timeout=self.timeout, request_timeout=self.timeout)
        return result

    def _wait(self, future: Any, topic: str, action: str) -> Any:
        try:
            return future.result(timeout=self.timeout + 2)
        except Exception as exc:
            raise explain(exc, topic, action, self.servers) from exc

    def describe(self, name: str) -> TopicState:
        desc = self._wait(self._describe.submit(name), name, "describe")
        resource = ConfigResource(ResourceType.TOPIC, name)
        entries = self._wait(self._configs.submit(resource), name, "read the configuration of")
        entry = entries.get(RETENTION_MS)
        retention = int(entry.value) if entry is not None and entry.value is not None else None
        return TopicState(name=name, partitions=len(desc.partitions), retention_ms=retention)

    def create(self, spec: TopicSpec) -> None:
        topic = NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=spec.replication_factor,
                         config={} if spec.retention_ms is None else {RETENTION_MS: str(spec.retention_ms)})
        try:
            self._create.submit(topic).result(timeout=self.timeout + 2)
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

    def delete_group(self, group: str) -> None:
        """Delete a consumer group and its committed offsets; an unknown group counts as deleted. A group that
        still has members (its consumer is leaving) raises a retriable ``TopicError``."""
        futures = self._admin.delete_consumer_groups([group], request_timeout=self.timeout)
        try:
            futures[group].result(timeout=self.timeout + 2)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            raise TopicError("ConsumerGroupNotDeleted", f"cannot delete consumer group {group!r}: {exc}") from exc


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
        # Created as specified; describing it at once may still answer "unknown topic" while metadata spreads.
        return TopicOutcome(created=True)
    if not manage:
        return TopicOutcome()
    added, changed = 0, False
    if state.partitions > spec.partitions:
        raise ShrinkRefused(spec.name, state.partitions, spec.partitions)
    if state.partitions < spec.partitions:
        admin.set_partitions(spec.name, spec.partitions)
        added = spec.partitions - state.partitions
    if spec.retention_ms is not None and state.retention_ms != spec.retention_ms:
        admin.set_retention(spec.name, spec.retention_ms)
        changed = True
    return TopicOutcome(partitions_added=added, retention_changed=changed)
