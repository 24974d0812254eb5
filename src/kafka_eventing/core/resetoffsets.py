"""ResetOffset (``kafka.eventing.knative.dev/v1alpha1``) facts every role shares: API coordinates, the spec
(``spec.offset.time``, ``spec.ref``), the conditions and their reasons, the status fields, and the marker a reset
leaves in the commit metadata.

Who writes what:

* the controller (``controller/resetoffsets.py``) resolves ``spec.ref`` to a ``Target`` (consumer group, topic,
  the dispatcher that owns the group) and validates; it writes ``status.target`` and ``Accepted`` (True, or False
  with the reason: RefNotFound, UnsupportedRef, InvalidRef, NotKafkaBroker, InvalidTime, ResetInProgress);
* the owning dispatcher (``dispatcher/resets.py``) carries it out and writes ``Resetting``, ``Done``,
  ``status.partitions`` (per partition the old and the new offset) and ``status.completedGeneration``; a group
  without commits ends in ``Done=False`` reason GroupNotFound, with nothing moved.

A ResetOffset is done once per ``metadata.generation``: ``completedGeneration`` (or a failure recorded for the
generation) ends it, so no resync or restart applies it again; an edit of the spec is a new reset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka_eventing.core.conditions import find

GROUP = "kafka.eventing.knative.dev"
VERSION = "v1alpha1"
PLURAL = "resetoffsets"
KIND = "ResetOffset"

#: The refs a ResetOffset may name: (apiVersion group, kind).
SUBSCRIPTION = ("messaging.knative.dev", "Subscription")
TRIGGER = ("eventing.knative.dev", "Trigger")
KAFKA_SOURCE = ("sources.knative.dev", "KafkaSource")
SUBSCRIPTION_API = ("messaging.knative.dev", "v1", "subscriptions")
KAFKA_CHANNEL_KIND = "KafkaChannel"
KAFKA_SOURCE_KIND = "KafkaSource"

EARLIEST, LATEST = "earliest", "latest"

# Conditions. The controller writes Accepted; the dispatcher Resetting and Done.
ACCEPTED = "Accepted"
RESETTING = "Resetting"
DONE = "Done"

# Reasons.
REASON_ACCEPTED = "Accepted"
REASON_REF_NOT_FOUND = "RefNotFound"
REASON_UNSUPPORTED_REF = "UnsupportedRef"
REASON_INVALID_REF = "InvalidRef"
REASON_NOT_KAFKA = "NotKafkaBroker"
REASON_INVALID_TIME = "InvalidTime"
REASON_IN_PROGRESS = "ResetInProgress"
REASON_GROUP_NOT_FOUND = "GroupNotFound"
REASON_WAITING = "WaitingForDispatcher"
REASON_PAUSING = "Pausing"
REASON_MEMBERS = "WaitingForMembers"
REASON_COMMITTING = "Committing"
REASON_DONE = "Done"
REASON_FAILED = "Failed"
#: Accepted reasons that end the reset for this generation (nothing moved).
REFUSED = (REASON_REF_NOT_FOUND, REASON_UNSUPPORTED_REF, REASON_INVALID_REF, REASON_NOT_KAFKA, REASON_INVALID_TIME,
           REASON_IN_PROGRESS)

#: Commit metadata of a partition moved by a reset: ``ke.reset=<uid>/<generation>/<old offset>``. The reset's
#: commit carries it on every partition, in the one request that moves them, so a dispatcher restarted after the
#: commit sees that it is done (and the old offsets) instead of moving the group again.
MARKER_PREFIX = "ke.reset="


class SpecError(ValueError):
    """A spec the dispatcher cannot act on; ``reason`` is the condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class OffsetTime:
    """``spec.offset.time``: ``earliest``, ``latest`` or an instant (milliseconds since the epoch)."""

    text: str
    millis: int | None  # None: earliest or latest

    @property
    def earliest(self) -> bool:
        return self.text == EARLIEST

    @property
    def latest(self) -> bool:
        return self.text == LATEST


def parse_time(raw: object) -> OffsetTime:
    """``earliest``, ``latest`` or an RFC 3339 timestamp with a zone (``2026-11-26T21:00:00Z``)."""
    text = str(raw or "").strip()
    if text.lower() in (EARLIEST, LATEST):
        return OffsetTime(text.lower(), None)
    if not _RFC3339.match(text):
        raise SpecError(REASON_INVALID_TIME, f"spec.offset.time {text!r} is not RFC 3339 with a zone "
                                             "(e.g. 2026-11-26T21:00:00Z), earliest or latest")
    try:
        when = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError as exc:
        raise SpecError(REASON_INVALID_TIME, f"spec.offset.time {text!r}: {exc}") from None
    return OffsetTime(text, int(when.astimezone(UTC).timestamp() * 1000))


@dataclass(frozen=True)
class Ref:
    """``spec.ref``: an object in the ResetOffset's namespace."""

    group: str
    version: str
    kind: str
    name: str

    @property
    def api(self) -> tuple[str, str]:
        return self.group, self.kind

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


def parse_ref(raw: object) -> Ref:
    if not isinstance(raw, Mapping):
        raise SpecError(REASON_UNSUPPORTED_REF, "spec.ref is missing")
    api_version = str(raw.get("apiVersion") or "")
    group, _, version = api_version.rpartition("/")
    kind, name = str(raw.get("kind") or ""), str(raw.get("name") or "")
    if not name or not kind or not version:
        raise SpecError(REASON_UNSUPPORTED_REF, "spec.ref needs apiVersion, kind and name")
    return Ref(group, version, kind, name)


@dataclass(frozen=True)
class Spec:
    ref: Ref
    time: OffsetTime


def parse_spec(obj: Mapping[str, Any]) -> Spec:
    """The spec, or ``SpecError`` with the condition reason."""
    spec = obj.get("spec") or {}
    time = parse_time((spec.get("offset") or {}).get("time"))
    ref = parse_ref(spec.get("ref"))
    namespace = str((obj.get("metadata") or {}).get("namespace") or "")
    other = str((spec.get("ref") or {}).get("namespace") or "")
    if other and namespace and other != namespace:
        # The dispatcher that carries a reset out watches its own namespace's ResetOffsets only.
        raise SpecError(REASON_UNSUPPORTED_REF, f"spec.ref.namespace {other!r}: the ref must be in the "
                                                f"ResetOffset's namespace {namespace!r}")
    return Spec(ref, time)


@dataclass(frozen=True)
class Target:
    """What a ref resolves to: the consumer group to move, its topics (several for a KafkaSource), and the
    dispatcher that owns the group (``dispatcher_kind`` KafkaChannel, Broker or KafkaSource, with its namespace
    and name)."""

    group: str
    topics: tuple[str, ...]
    dispatcher_kind: str
    dispatcher_namespace: str
    dispatcher_name: str

    def to_status(self) -> dict[str, Any]:
        return {"group": self.group, "topics": list(self.topics),
                "dispatcher": {"kind": self.dispatcher_kind, "namespace": self.dispatcher_namespace,
                               "name": self.dispatcher_name}}

    @classmethod
    def from_status(cls, raw: object) -> Target | None:
        if not isinstance(raw, Mapping) or not raw.get("group") or not raw.get("topics"):
            return None
        d = raw.get("dispatcher") or {}
        return cls(str(raw["group"]), tuple(str(t) for t in raw["topics"]), str(d.get("kind") or ""),
                   str(d.get("namespace") or ""), str(d.get("name") or ""))


@dataclass(frozen=True)
class PartitionMove:
    """One partition of a reset: where the group was (``old``, -1 without a commit) and where it goes (``new``);
    ``before_retention``: the time is older than the oldest record Kafka still keeps, so ``new`` is that one."""

    topic: str
    partition: int
    old: int
    new: int
    before_retention: bool = False

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"topic": self.topic, "partition": self.partition, "old": self.old, "new": self.new}
        if self.before_retention:
            out["beforeRetention"] = True
        return out


def marker(uid: str, generation: int, old: int) -> str:
    return f"{MARKER_PREFIX}{uid}/{generation}/{old}"


def marker_old(metadata: str | None, uid: str, generation: int) -> int | None:
    """The old offset a reset's commit recorded, if ``metadata`` is this reset's marker; else None."""
    prefix = f"{MARKER_PREFIX}{uid}/{generation}/"
    if not metadata or not metadata.startswith(prefix):
        return None
    try:
        return int(metadata[len(prefix):])
    except ValueError:
        return None


def generation_of(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def is_finished(obj: Mapping[str, Any]) -> bool:
    """Whether this generation's reset has ended: done, failed, or refused (never applied again)."""
    status = obj.get("status") or {}
    generation = generation_of(obj)
    if int(status.get("completedGeneration") or 0) >= generation:
        return True
    if int(status.get("observedGeneration") or 0) != generation:
        return False
    done = find(status.get("conditions"), DONE)
    if done is not None and done.get("status") in ("True", "False"):
        return True
    accepted = find(status.get("conditions"), ACCEPTED)
    return accepted is not None and accepted.get("status") == "False" and accepted.get("reason") in REFUSED


def pending_target(obj: Mapping[str, Any]) -> Target | None:
    """The target of an accepted reset of the current generation that has not ended, else None."""
    status = obj.get("status") or {}
    if is_finished(obj) or int(status.get("observedGeneration") or 0) != generation_of(obj):
        return None
    accepted = find(status.get("conditions"), ACCEPTED)
    if accepted is None or accepted.get("status") != "True":
        return None
    return Target.from_status(status.get("target"))


def now_rfc3339_millis() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
