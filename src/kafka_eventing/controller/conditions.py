"""Knative-style status conditions: a set that keeps ``lastTransitionTime`` unless the status changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

READY = "Ready"
ADDRESSABLE = "Addressable"
TOPIC_READY = "TopicReady"
CHANNEL_SERVICE_READY = "ChannelServiceReady"
DISPATCHER_DEPLOYMENT_READY = "DispatcherDeploymentReady"
DISPATCHER_SERVICE_READY = "DispatcherServiceReady"
RECEIVER_DEPLOYMENT_READY = "ReceiverDeploymentReady"
DEAD_LETTER_SINK_RESOLVED = "DeadLetterSinkResolved"
#: Only while KEDA scaling is enabled. Informational: without KEDA the dispatcher runs at the controller's
#: replica count, so the channel stays Ready.
DISPATCHER_AUTOSCALER_READY = "DispatcherAutoscalerReady"

#: Conditions whose truth makes the channel Ready (DeadLetterSinkResolved counts only when a sink is set).
DEPENDENTS = (TOPIC_READY, CHANNEL_SERVICE_READY, DISPATCHER_DEPLOYMENT_READY, DISPATCHER_SERVICE_READY,
              RECEIVER_DEPLOYMENT_READY, ADDRESSABLE)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""

    @classmethod
    def true(cls, kind: str, reason: str = "", message: str = "") -> Condition:
        return cls(kind, "True", reason or kind, message)

    @classmethod
    def false(cls, kind: str, reason: str, message: str) -> Condition:
        return cls(kind, "False", reason, message)

    @classmethod
    def unknown(cls, kind: str, reason: str, message: str) -> Condition:
        return cls(kind, "Unknown", reason, message)

    @property
    def is_true(self) -> bool:
        return self.status == "True"


def ready_condition(conditions: Iterable[Condition], dependents: Sequence[str] = DEPENDENTS) -> Condition:
    """Ready is True when every dependent is True; otherwise it carries the first failing one's reason."""
    by_type = {c.type: c for c in conditions}
    wanted = [*dependents]
    if DEAD_LETTER_SINK_RESOLVED in by_type:
        wanted.append(DEAD_LETTER_SINK_RESOLVED)
    failing = [by_type.get(kind, Condition.unknown(kind, "NotReconciled", f"{kind} not reconciled yet"))
               for kind in wanted]
    # A False condition explains more than an Unknown one, so report it first.
    failing = [c for c in failing if not c.is_true]
    if not failing:
        return Condition.true(READY, "Ready", "")
    worst = next((c for c in failing if c.status == "False"), failing[0])
    return Condition(READY, worst.status, worst.reason, worst.message or worst.type)


def merge(previous: Sequence[Mapping[str, Any]] | None, current: Iterable[Condition],
          now: str | None = None) -> list[dict[str, Any]]:
    """Conditions as status dicts; ``lastTransitionTime`` stays as it was unless the status changed."""
    stamp = now or now_rfc3339()
    old = {str(c.get("type")): c for c in previous or () if isinstance(c, Mapping)}
    out: list[dict[str, Any]] = []
    for cond in sorted(current, key=lambda c: c.type):
        before = old.get(cond.type)
        kept = before is not None and before.get("status") == cond.status and before.get("lastTransitionTime")
        item: dict[str, Any] = {
            "type": cond.type,
            "status": cond.status,
            "lastTransitionTime": before["lastTransitionTime"] if kept and before else stamp,
        }
        if cond.reason:
            item["reason"] = cond.reason
        if cond.message:
            item["message"] = cond.message
        out.append(item)
    return out
