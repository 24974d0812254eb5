"""EventPolicy parsing and Knative's rules: which policies apply to a target, whose subject they allow, the default
modes. The receiver's decisions on them: tests/unit/receiver/test_policies.py; real tokens and Kafka:
tests/integration/test_eventpolicies.py."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_eventing.core import eventpolicies as ep


def policy(name: str = "p", namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": ep.API_VERSION, "kind": ep.KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


ORDERS = ep.Target("messaging.knative.dev", "KafkaChannel", "shop", "orders", (("team", "a"),))
EVENTS = ep.Target("eventing.knative.dev", "Broker", "shop", "events", (("team", "b"), ("tier", "gold")))


def test_an_empty_to_applies_to_every_target_of_its_namespace_only() -> None:
    p = ep.policy_from_resource(policy(**{"from": [{"sub": "x"}]}))
    assert p.applies_to(ORDERS) and p.applies_to(EVENTS)
    assert not p.applies_to(ep.Target("messaging.knative.dev", "KafkaChannel", "other", "orders"))


def test_refs_name_kind_group_and_name() -> None:
    p = ep.policy_from_resource(policy(to=[{"ref": {"apiVersion": "messaging.knative.dev/v1beta1",
                                                    "kind": "KafkaChannel", "name": "orders"}}]))
    assert p.applies_to(ORDERS)
    assert not p.applies_to(EVENTS)
    assert not p.applies_to(ep.Target("messaging.knative.dev", "KafkaChannel", "shop", "payments"))
    # Same name, another kind: a Broker named orders is not the channel.
    assert not p.applies_to(ep.Target("eventing.knative.dev", "Broker", "shop", "orders"))


def test_selectors_match_kind_and_labels() -> None:
    p = ep.policy_from_resource(policy(to=[{"selector": {
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "matchLabels": {"team": "b"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                             {"key": "legacy", "operator": "DoesNotExist"}]}}]))
    assert p.applies_to(EVENTS)
    assert not p.applies_to(ORDERS)
    assert not p.applies_to(ep.Target("eventing.knative.dev", "Broker", "shop", "x", (("team", "b"),)))
    assert not p.applies_to(ep.Target("eventing.knative.dev", "Broker", "shop", "x",
                                      (("legacy", "1"), ("team", "b"), ("tier", "gold"))))
    notin = ep.policy_from_resource(policy(to=[{"selector": {"matchExpressions": [
        {"key": "team", "operator": "NotIn", "values": ["a"]}, {"key": "team", "operator": "Exists"}]}}]))
    assert notin.applies_to(EVENTS) and not notin.applies_to(ORDERS)


def test_subjects_exact_prefix_service_accounts_and_resolved() -> None:
    p = ep.policy_from_resource({**policy(**{"from": [
        {"sub": "system:serviceaccount:shop:sender"},
        {"sub": "system:serviceaccount:ops:*"},
        {"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "billing"}},
        {"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "audit", "namespace": "sec"}},
        {"ref": {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "name": "tick"}}]}),
        "status": {"from": ["system:serviceaccount:shop:ping-source-tick"]}})
    for allowed in ("system:serviceaccount:shop:sender", "system:serviceaccount:ops:anyone",
                    "system:serviceaccount:shop:billing", "system:serviceaccount:sec:audit",
                    "system:serviceaccount:shop:ping-source-tick"):
        assert p.allows_subject(allowed), allowed
    for refused in ("system:serviceaccount:shop:sender2", "system:serviceaccount:opsx:a",
                    "system:serviceaccount:sec:billing", ""):
        assert not p.allows_subject(refused), refused
    # The source ref is a controller's to resolve; until then it is kept, and allows no one by itself.
    assert p.source_refs == (("sources.knative.dev/v1", "PingSource", "shop", "tick"),)


def test_a_policy_without_from_allows_no_one() -> None:
    p = ep.policy_from_resource(policy())
    assert not p.allows_subject("system:serviceaccount:shop:x")


@pytest.mark.parametrize(("spec", "problem"), [
    ({"to": [{}]}, "spec.to[0] needs a ref or a selector"),
    ({"to": [{"ref": {"kind": "Broker"}}]}, "spec.to[0].ref needs kind and name"),
    ({"from": [{}]}, "spec.from[0] needs a sub or a ref"),
    ({"to": [{"selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}]}, "operator"),
    ({"to": [{"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]}, "In needs values"),
    ({"filters": "type = 'x'"}, "spec.filters must be a list"),
])
def test_invalid_policies_name_the_field(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ep.PolicySpecError, match="EventPolicy shop/p") as info:
        ep.policy_from_resource(policy(**spec))
    assert problem in str(info.value)


def test_default_modes() -> None:
    same, other = "system:serviceaccount:shop:a", "system:serviceaccount:elsewhere:a"
    assert ep.default_allows(ep.DefaultMode.ALLOW_ALL, other, "shop")
    assert ep.default_allows(ep.DefaultMode.ALLOW_SAME_NAMESPACE, same, "shop")
    assert not ep.default_allows(ep.DefaultMode.ALLOW_SAME_NAMESPACE, other, "shop")
    # A prefix of the namespace is another namespace.
    assert not ep.default_allows(ep.DefaultMode.ALLOW_SAME_NAMESPACE, "system:serviceaccount:shopx:a", "shop")
    assert not ep.default_allows(ep.DefaultMode.DENY_ALL, same, "shop")


def test_parse_documents_keeps_only_event_policies() -> None:
    docs = [policy("a"), {"kind": "List", "items": [policy("b", "ops")]},
            {"apiVersion": "example.com/v1", "kind": ep.KIND, "metadata": {"name": "c"}}, None]
    assert sorted(ep.parse_documents(docs)) == [("ops", "b"), ("shop", "a")]


def test_a_policy_that_cannot_be_used_closes_its_namespace() -> None:
    broken = ep.policy_or_invalid(policy("broken", to=[{"ref": {"kind": "Broker"}}], **{"from": [{"sub": "x"}]}))
    assert "spec.to[0].ref" in broken.problem
    assert broken.applies_to(ORDERS) and broken.applies_to(EVENTS)
    assert not broken.applies_to(ep.Target("messaging.knative.dev", "KafkaChannel", "other", "orders"))
    assert not broken.allows_subject("x")
    assert ep.policy_or_invalid(policy("fine")).problem == ""
