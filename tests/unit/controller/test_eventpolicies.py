"""The controller's EventPolicy status (status.from, SubjectsResolved, AuthenticationEnabled, Ready with a reason)
and a target's status.policies / EventPoliciesReady. On the real apiserver: tests/integration/test_eventpolicies.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest.mock import MagicMock

from kubernetes.client.rest import ApiException

from kafka_eventing.controller.eventpolicies import EventPolicyReconciler
from kafka_eventing.controller.policies import target_status
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.conditions import Condition

from .fakes import SETTINGS, DictStore

AUTH = replace(SETTINGS, auth_issuer="https://issuer.example")
CHANNEL = ep.Target("messaging.knative.dev", "KafkaChannel", "shop", "orders", (("team", "a"),))


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": ep.API_VERSION, "kind": ep.KIND,
            "metadata": {"name": name, "namespace": "shop", "generation": 2}, "spec": spec}


def reconciler(settings: Any = AUTH, objects: dict[tuple[str, str, str], Any] | None = None) -> EventPolicyReconciler:
    base = MagicMock()
    base.settings = settings

    def read(group: str, version: str, plural: str, namespace: str, name: str) -> Any:
        found = (objects or {}).get((plural, namespace, name))
        if isinstance(found, Exception):
            raise found
        return found

    return EventPolicyReconciler(base, DictStore(), write_status=True, read=read)


def conditions(found: list[Condition]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in found}


def test_subjects_resolved_from_subs_service_accounts_and_sources() -> None:
    source = {"status": {"auth": {"serviceAccountName": "ping-tick"}}}
    r = reconciler(objects={("pingsources", "shop", "tick"): source})
    status, found = r.evaluate(policy("p", **{"from": [
        {"sub": "system:serviceaccount:ops:*"},
        {"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "billing"}},
        {"ref": {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "name": "tick"}}]}))
    assert status == {"observedGeneration": 2, "from": [
        "system:serviceaccount:ops:*", "system:serviceaccount:shop:billing", "system:serviceaccount:shop:ping-tick"]}
    assert conditions(found) == {"AuthenticationEnabled": ("True", "AuthenticationEnabled"),
                                 "SubjectsResolved": ("True", "SubjectsResolved"), "Ready": ("True", "Ready")}


def test_unresolvable_refs_say_why() -> None:
    ref = {"from": [{"ref": {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "name": "tick"}}]}
    missing = reconciler().evaluate(policy("p", **ref))
    assert missing[0]["from"] is None
    (ready,) = [c for c in missing[1] if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", "SubjectsNotResolved") and "does not exist" in ready.message
    anonymous = reconciler(objects={("pingsources", "shop", "tick"): {"status": {}}}).evaluate(policy("p", **ref))
    assert "status.auth.serviceAccountName" in next(c for c in anonymous[1] if c.type == "Ready").message
    forbidden = reconciler(objects={("pingsources", "shop", "tick"): ApiException(status=403)})
    message = next(c for c in forbidden.evaluate(policy("p", **ref))[1] if c.type == "Ready").message
    assert "controller.rbac.readableKinds" in message and "pingsources" in message


def test_invalid_spec_and_filters_are_not_ready_with_the_field() -> None:
    bad_to = reconciler().evaluate(policy("p", to=[{}]))[1]
    assert conditions(bad_to)["Ready"] == ("False", "InvalidSpec")
    bad_filter = reconciler().evaluate(policy("p", **{"from": [{"sub": "x"}]}, filters=[{"cesql": "type = "}]))[1]
    ready = next(c for c in bad_filter if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidFilter") and "filters[0].cesql" in ready.message


def test_authentication_off_is_not_ready() -> None:
    found = reconciler(SETTINGS).evaluate(policy("p", **{"from": [{"sub": "x"}]}))[1]
    assert conditions(found)["AuthenticationEnabled"] == ("False", "OIDCAuthenticationDisabled")
    assert conditions(found)["Ready"] == ("False", "OIDCAuthenticationDisabled")


def test_status_is_left_to_knatives_controller_unless_told() -> None:
    base = MagicMock()
    base.settings = AUTH
    store = DictStore(policy("p", **{"from": [{"sub": "x"}]}))
    EventPolicyReconciler(base, store, write_status=False).reconcile("shop", "p")
    base.patch_status.assert_not_called()
    EventPolicyReconciler(base, store, write_status=True).reconcile("shop", "p")
    base.patch_status.assert_called_once()


def test_target_status_lists_the_applying_policies() -> None:
    store = DictStore(policy("b-all", **{"from": [{"sub": "x"}]}),
                      policy("a-team", to=[{"selector": {"matchLabels": {"team": "a"}}}], **{"from": [{"sub": "x"}]}),
                      policy("other", to=[{"ref": {"kind": "Broker", "name": "orders",
                                                   "apiVersion": "eventing.knative.dev/v1"}}]))
    refs, condition = target_status(store, AUTH, CHANNEL)
    assert refs == [{"apiVersion": ep.API_VERSION, "name": "a-team"}, {"apiVersion": ep.API_VERSION, "name": "b-all"}]
    assert (condition.type, condition.status, condition.reason) == ("EventPoliciesReady", "True", "EventPoliciesReady")


def test_target_status_default_mode_disabled_and_broken_policies() -> None:
    refs, condition = target_status(DictStore(), AUTH, CHANNEL)
    assert refs == [] and condition.reason == "DefaultAuthorizationMode"
    assert "allow-same-namespace" in condition.message
    assert target_status(DictStore(policy("p")), SETTINGS, CHANNEL)[1].reason == "AuthenticationDisabled"
    # A policy the receiver cannot use applies to the whole namespace (it closes) and is reported.
    refs, condition = target_status(DictStore(policy("broken", to=[{}])), AUTH, CHANNEL)
    assert refs == [{"apiVersion": ep.API_VERSION, "name": "broken"}]
    assert (condition.status, condition.reason) == ("False", "EventPoliciesNotReady") and "broken" in condition.message


def test_status_from_is_the_same_when_evaluated_again_on_its_own_output() -> None:
    source = {"status": {"auth": {"serviceAccountName": "ping-tick"}}}
    r = reconciler(objects={("pingsources", "shop", "tick"): source})
    obj = policy("p", **{"from": [{"sub": "system:serviceaccount:ops:*"},
                                  {"ref": {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource",
                                           "name": "tick"}}]})
    first, _ = r.evaluate(obj)
    again, _ = r.evaluate({**obj, "status": first})  # the next reconcile reads what the first one wrote
    assert again["from"] == first["from"] == ["system:serviceaccount:ops:*", "system:serviceaccount:shop:ping-tick"]
