"""What the dispatcher reports per subscriber, written through the status subresource: a KafkaChannel's
``status.subscribers[]``, or a Broker's Triggers' ``ConsumerGroupReady`` condition.

A subscriber is ready once its consumer group has joined (first assignment); until then, or when it cannot
join, it is not ready with a message saying why. In file mode the same document is kept in memory only and
served at ``/status``.

Several dispatcher replicas of one channel or Broker each run a member of every subscriber's group, so each knows
only its own member. The kube writers therefore merge into what is stored instead of replacing it, under
optimistic concurrency (``write_merged``: read, merge, patch at the read ``resourceVersion``, again on 409): a
replica that is still joining never overwrites another's "ready" for the same generation, entries it does not
know are kept, and on a Trigger every condition but ``ConsumerGroupReady`` is left as the controller wrote it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channels import GROUP, PLURAL, ChannelKey
from kafka_eventing.core.conditions import Condition, find, merge

log = logging.getLogger(__name__)

VERSION = "v1beta1"
#: The message of a member that has not joined its group yet: a replica's own transient state, not a fault.
JOINING = "joining consumer group"
#: Tries at a read-merge-write before giving up until the next change (another replica wrote in between).
CONFLICT_ATTEMPTS = 5
HTTP_CONFLICT = 409
HTTP_NOT_FOUND = 404

# Reasons of a subscriber that is not ready (a channel's status.subscribers has no reason field; a Trigger's
# ConsumerGroupReady condition carries them).
REASON_JOINING = "Joining"
REASON_JOINED = "ConsumerGroupJoined"
REASON_NOT_READY = "NotReady"  # the channel or Broker (its topic) is not ready
REASON_TRIGGER_NOT_READY = "TriggerNotReady"  # held: a controller condition of the Trigger is not True
REASON_DEAD_LETTER = "DeadLetterSinkUnresolved"
REASON_TOPIC = "TopicNotFound"
REASON_KAFKA = "KafkaError"


def consumer_problem(err: Any, topic: str) -> tuple[str, str] | None:
    """A consumer's librdkafka error as (message, reason) for a subscriber's status, or None for one that the
    client retries by itself (only logged)."""
    from confluent_kafka import KafkaError

    code = err.code()
    if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return f"topic {topic} does not exist", REASON_TOPIC
    if err.fatal() or code in (KafkaError._AUTHENTICATION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                               KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError._ALL_BROKERS_DOWN):
        return f"Kafka: {err.str()}", REASON_KAFKA
    return None
REASON_FAILED = "ConsumerFailed"


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    uid: str
    observed_generation: int
    ready: bool
    message: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        # Knative's SubscriberStatus.ready is a ConditionStatus string, not a boolean.
        out: dict[str, Any] = {"uid": self.uid, "observedGeneration": self.observed_generation,
                               "ready": "True" if self.ready else "False"}
        if self.message:
            out["message"] = self.message
        return out


def build_status(statuses: Iterable[SubscriberStatus]) -> dict[str, Any]:
    """The merge-patch body; subscribers sorted by uid so that equal states give equal patches."""
    return {"status": {"subscribers": [s.as_dict() for s in sorted(statuses, key=lambda s: s.uid)]}}


def merge_subscribers(stored: Iterable[Mapping[str, Any]], mine: Iterable[Mapping[str, Any]],
                      wanted: Iterable[str]) -> list[dict[str, Any]]:
    """``status.subscribers`` after this replica's entries (``mine``) are merged into the ``stored`` ones.

    Keyed by uid, for the uids in the spec (``wanted``): an entry of an older generation never replaces a newer
    one, and this replica's "joining" never replaces another replica's ready entry of the same generation (the
    group already consumes). Everything else this replica knows wins: real faults (missing topic, channel not
    ready, unresolvable sink) are seen alike by every replica.
    """
    keep = set(wanted)
    merged = {str(e.get("uid")): dict(e) for e in stored if e.get("uid") in keep}
    for entry in mine:
        uid = str(entry["uid"])
        if uid not in keep:
            continue
        old = merged.get(uid)
        if old is not None:
            generation, old_generation = int(entry.get("observedGeneration") or 0), int(
                old.get("observedGeneration") or 0)
            if generation < old_generation:
                continue
            if (generation == old_generation and entry.get("message") == JOINING
                    and old.get("ready") == "True"):
                continue
        merged[uid] = dict(entry)
    return [merged[uid] for uid in sorted(merged)]


class StatusWriter(Protocol):
    def write(self, key: ChannelKey, statuses: Sequence[SubscriberStatus]) -> None:
        """Report every subscriber of the channel or Broker ``key`` (sorted by uid)."""


class MemoryStatusWriter:
    """File mode: nothing to write to; ``/status`` reads the board."""

    def __init__(self) -> None:
        self.last: dict[ChannelKey, dict[str, Any]] = {}

    def write(self, key: ChannelKey, statuses: Sequence[SubscriberStatus]) -> None:
        self.last[key] = build_status(statuses)


def write_merged(read: Callable[[], Mapping[str, Any]], merged: Callable[[Mapping[str, Any]], Any | None],
                 patch: Callable[[dict[str, Any]], Any]) -> None:
    """Read an object, merge this replica's part into its status, and merge-patch the status subresource at the
    read ``resourceVersion``; on 409 (another writer came in between) all again on the new state.

    ``merged(obj)`` returns the new ``status`` body, or None when the stored one already says it all.
    """
    from kubernetes.client.exceptions import ApiException

    for attempt in range(CONFLICT_ATTEMPTS):
        obj = read()
        status = merged(obj)
        if status is None:
            return
        try:
            patch({"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status})
            return
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT or attempt == CONFLICT_ATTEMPTS - 1:
                raise


class KubeStatusWriter:
    """This replica's entries merged into the stored ``status.subscribers`` (``merge_subscribers``)."""

    def __init__(self, api_client: Any, version: str = VERSION) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.version = version

    def write(self, key: ChannelKey, statuses: Sequence[SubscriberStatus]) -> None:
        namespace, name = key
        mine = [s.as_dict() for s in statuses]

        def merged(obj: Mapping[str, Any]) -> dict[str, Any] | None:
            wanted = [str(s.get("uid")) for s in (obj.get("spec") or {}).get("subscribers") or []]
            stored = (obj.get("status") or {}).get("subscribers") or []
            subscribers = merge_subscribers(stored, mine, wanted)
            return None if subscribers == stored else {"subscribers": subscribers}

        write_merged(
            lambda: self.api.get_namespaced_custom_object(GROUP, self.version, namespace, PLURAL, name,
                                                          _request_timeout=(5, 15)),
            merged,
            lambda body: self.api.patch_namespaced_custom_object_status(
                GROUP, self.version, namespace, PLURAL, name, body, _request_timeout=(5, 15)))


def consumer_group_condition(status: SubscriberStatus, group: str) -> Condition:
    """A Trigger's ``ConsumerGroupReady`` from its subscriber status: joining is Unknown (in progress)."""
    if status.ready:
        return Condition.true(kb.CONSUMER_GROUP_READY, REASON_JOINED, f"consumer group {group} joined")
    if status.message == JOINING:
        return Condition.unknown(kb.CONSUMER_GROUP_READY, REASON_JOINING, f"joining consumer group {group}")
    return Condition.false(kb.CONSUMER_GROUP_READY, status.reason or REASON_NOT_READY, status.message)


def merge_trigger_condition(trigger: Mapping[str, Any], mine: SubscriberStatus) -> dict[str, Any] | None:
    """The Trigger's ``status.conditions`` with this replica's ``ConsumerGroupReady``, or None to leave it.

    Left as stored: when this replica's view of the Trigger is older than the stored Trigger (it reports again
    once its watch catches up), when it is still joining and another replica already reported the group joined
    (the group consumes), or when nothing would change. Every other condition is kept as is.
    """
    meta = trigger.get("metadata") or {}
    if mine.observed_generation < int(meta.get("generation") or 0):
        return None
    conditions = [dict(c) for c in (trigger.get("status") or {}).get("conditions") or () if isinstance(c, Mapping)]
    stored = find(conditions, kb.CONSUMER_GROUP_READY)
    if stored is not None and stored.get("status") == "True" and not mine.ready and mine.message == JOINING:
        return None
    group = kb.trigger_group(str(meta.get("namespace")), mine.uid)
    (new,) = merge([stored] if stored is not None else None, [consumer_group_condition(mine, group)])
    if stored is not None and {**stored, "lastTransitionTime": None} == {**new, "lastTransitionTime": None}:
        return None
    others = [c for c in conditions if c.get("type") != kb.CONSUMER_GROUP_READY]
    return {"conditions": sorted([*others, new], key=lambda c: str(c.get("type")))}


class KubeTriggerStatusWriter:
    """A Broker's dispatcher: each Trigger's ``ConsumerGroupReady`` (``merge_trigger_condition``), written on the
    Trigger's status subresource. Only Triggers whose status changed since this writer last wrote them are read
    and written; the controller's conditions and Ready are its own (it computes Ready from this condition too)."""

    def __init__(self, api_client: Any, *, api: Any = None) -> None:
        """``api``: a CustomObjectsApi-like object to use instead of one on ``api_client``."""
        if api is None:
            from kubernetes import client

            api = client.CustomObjectsApi(api_client)
        self.api = api
        self._written: dict[str, SubscriberStatus] = {}

    def write(self, key: ChannelKey, statuses: Sequence[SubscriberStatus]) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace, _broker = key
        current = {s.uid: s for s in statuses}
        for uid in set(self._written) - set(current):
            del self._written[uid]
        for status in statuses:
            if self._written.get(status.uid) == status:
                continue
            try:
                self._write(namespace, status)
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                # Deleted meanwhile: the source drops it on the next change.
            self._written[status.uid] = status

    def _write(self, namespace: str, status: SubscriberStatus) -> None:
        def merged(trigger: Mapping[str, Any]) -> dict[str, Any] | None:
            return merge_trigger_condition(trigger, status)

        write_merged(
            lambda: self.api.get_namespaced_custom_object(kb.GROUP, kb.VERSION, namespace, kb.TRIGGERS, status.uid,
                                                          _request_timeout=(5, 15)),
            merged,
            lambda body: self.api.patch_namespaced_custom_object_status(
                kb.GROUP, kb.VERSION, namespace, kb.TRIGGERS, status.uid, body, _request_timeout=(5, 15)))


class StatusBoard:
    """Current subscriber statuses of one channel; changes are written in the background, coalesced.

    The write runs in a worker thread (the kube client blocks) and is retried on failure, so a slow or
    unavailable API server never stalls delivery.
    """

    def __init__(self, key: ChannelKey, writer: StatusWriter, retry_seconds: float = 2.0) -> None:
        self.key = key
        self.writer = writer
        self.retry_seconds = retry_seconds
        self._statuses: dict[str, SubscriberStatus] = {}
        self._written: tuple[SubscriberStatus, ...] | None = None
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def set(self, uid: str, generation: int, ready: bool, message: str = "", reason: str = "") -> None:
        new = SubscriberStatus(uid, generation, ready, message, reason)
        if self._statuses.get(uid) != new:
            self._statuses[uid] = new
            self._dirty.set()

    def remove(self, uid: str) -> None:
        if self._statuses.pop(uid, None) is not None:
            self._dirty.set()

    def get(self, uid: str) -> SubscriberStatus | None:
        return self._statuses.get(uid)

    def statuses(self) -> tuple[SubscriberStatus, ...]:
        return tuple(sorted(self._statuses.values(), key=lambda s: s.uid))

    def document(self) -> dict[str, Any]:
        return build_status(self._statuses.values())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="status-writer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            statuses = self.statuses()
            if statuses == self._written:
                continue
            try:
                await loop.run_in_executor(None, self.writer.write, self.key, statuses)
                self._written = statuses
            except Exception as exc:
                log.warning("writing subscriber status failed, will retry",
                            extra={"channel": "/".join(self.key), "error": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(self.retry_seconds)
                self._dirty.set()
