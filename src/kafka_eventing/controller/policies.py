"""What a KafkaChannel, Broker or KafkaSink reports about the EventPolicies that apply to it (``status.policies``
and ``EventPoliciesReady``, Knative's fields), and whether the receiver can use a policy as written. The policies'
own status is the EventPolicy kind's (``controller/eventpolicies.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka_eventing.broker.filters import FilterError, compile_filters
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.informer import Store


def problem(policy: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the receiver cannot use the policy as written; None when it can."""
    try:
        parsed = ep.policy_from_resource(policy)
    except ep.PolicySpecError as exc:
        return "InvalidSpec", str(exc)
    try:
        compile_filters(list(parsed.filters))
    except FilterError as exc:
        return "InvalidFilter", f"EventPolicy {parsed.namespace}/{parsed.name}: {exc}"
    return None


def target_status(policies: Store | None, settings: Any, target: ep.Target) -> tuple[list[dict[str, str]],
                                                                                   Condition]:
    """A target's ``status.policies`` and ``EventPoliciesReady``: the policies that apply to it, and whether the
    receiver can use each of them (a policy it cannot use allows no one)."""
    if not settings.auth_issuer:
        return [], Condition.true(ep.TARGET_POLICIES_READY, "AuthenticationDisabled",
                                  "ingress authentication is off: EventPolicies are not enforced")
    objs = list(policies.items()) if policies is not None else []
    usable = {(str(o["metadata"].get("namespace")), str(o["metadata"].get("name"))): o for o in objs}
    applying = ep.applying(map(ep.policy_or_invalid, objs), target)
    refs = [{"apiVersion": ep.API_VERSION, "name": p.name} for p in applying]
    if not applying:
        return refs, Condition.true(ep.TARGET_POLICIES_READY, "DefaultAuthorizationMode",
                                    f"no EventPolicy applies: default authorization mode "
                                    f"{settings.auth_default_mode.value}")
    broken = [p.name for p in applying if problem(usable[p.key]) is not None]
    if broken:
        return refs, Condition.false(ep.TARGET_POLICIES_READY, "EventPoliciesNotReady",
                                     f"EventPolicies {', '.join(broken)} cannot be used: they allow no one")
    return refs, Condition.true(ep.TARGET_POLICIES_READY, "EventPoliciesReady",
                                f"{len(applying)} EventPolicies apply")
