"""Knative-style status conditions (``type``, ``status``, ``reason``, ``message``, ``lastTransitionTime``): the
controller writes most of them, the dispatcher the consumer-group one of a Trigger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


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


def find(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    """The stored condition of type ``kind``, or None."""
    return next((c for c in conditions or () if isinstance(c, Mapping) and c.get("type") == kind), None)


def gates_hold(conditions: Iterable[Mapping[str, Any]] | None, gates: Iterable[str]) -> str:
    """Why stored ``conditions`` do not open every one of ``gates`` yet ("" when each is True): the first missing
    or not-True gate, with its reason and message."""
    for kind in gates:
        found = find(conditions, kind)
        if found is None:
            return f"waiting for the controller to report {kind}"
        if found.get("status") != "True":
            why = ": ".join(str(found[k]) for k in ("reason", "message") if found.get(k))
            return f"{kind} is {found.get('status')}" + (f" ({why})" if why else "")
    return ""


def from_dict(stored: Mapping[str, Any]) -> Condition:
    return Condition(str(stored.get("type") or ""), str(stored.get("status") or "Unknown"),
                     str(stored.get("reason") or ""), str(stored.get("message") or ""))
