"""controller.autoscaler: when the controller stamps, keeps or removes a dispatcher's KEDA objects, and who then
owns the replica count. The real API server (CRDs installed and removed under a running controller) is in
tests/integration/test_controller_keda.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from kube_fakes import FakeCustomObjects
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import Writer
from kafka_eventing.controller.autoscaler import KedaAutoscaler
from kafka_eventing.controller.connection import ResolvedConnection
from kafka_eventing.core.conditions import Condition

from .fakes import SETTINGS, _keda_connection

REF = res.ChannelRef("team", "orders")
TOPIC = "team.orders"
NAME = res.dispatcher_name("team", "orders")
NS = SETTINGS.system_namespace
KEDA_SERVED = {f"{keda.GROUP}/{keda.VERSION}": [keda.SCALED_OBJECTS, keda.TRIGGER_AUTHENTICATIONS]}
SCRAM = {"protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "user": "u", "password": "p"}
#: The live dispatcher Deployment as the controller marks it once KEDA owns its replicas.
KEDA_SCALED = {"metadata": {"annotations": {res.ANNOTATION_SCALER: res.SCALER_KEDA}}}


def _channel(*uids: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "team", "name": "orders"},
            "spec": {"subscribers": [{"uid": u, "subscriberUri": f"http://s/{u}"} for u in uids]}}


def _autoscaler(fake: FakeCustomObjects, discovery_seconds: float = 30.0) -> KedaAutoscaler:
    return KedaAutoscaler(fake, SETTINGS, Writer(lambda: True),
                          discovery_seconds=discovery_seconds)  # type: ignore[arg-type]


def _reconcile(scaler: KedaAutoscaler, connection: ResolvedConnection, channel: dict[str, Any],
               deployment: dict[str, Any] | None = None) -> tuple[Condition | None, bool, list[str]]:
    errors: list[str] = []
    condition, keda_owned = scaler.reconcile(REF, channel, connection, 3, topic=TOPIC, deployment=deployment,
                                             errors=errors)
    return condition, keda_owned, errors


def test_keda_off_costs_no_api_call() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    condition, keda_owned, errors = _reconcile(_autoscaler(fake), _keda_connection(None, **{
        "dispatcher.keda.enabled": "false"}), _channel("s1"))
    assert (condition, keda_owned, errors) == (None, False, [])
    assert (fake.discoveries, fake.writes) == (0, [])


def test_without_keda_installed_the_controller_keeps_replicas_and_asks_again_only_after_the_ttl() -> None:
    fake = FakeCustomObjects()
    scaler = _autoscaler(fake)
    for _ in range(2):
        condition, keda_owned, _ = _reconcile(scaler, _keda_connection(None), _channel("s1"))
        assert condition is not None and (condition.status, condition.reason) == ("False", "KEDANotInstalled")
        assert keda_owned is False
    assert (fake.discoveries, fake.writes) == (1, [])  # the answer is reused within discovery_seconds
    scaler = _autoscaler(fake, discovery_seconds=0)
    fake.served.update(KEDA_SERVED)  # KEDA installed since
    condition, keda_owned, _ = _reconcile(scaler, _keda_connection(None), _channel("s1"))
    assert condition is not None and condition.reason == "KEDAScaledObjectReady" and keda_owned


def test_scaled_object_and_trigger_authentication_written_once_then_left_alone() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    scaler = _autoscaler(fake)
    connection = _keda_connection(SCRAM)
    condition, keda_owned, errors = _reconcile(scaler, connection, _channel("s1", "s2"))
    assert condition == Condition.true(
        "DispatcherAutoscalerReady", "KEDAScaledObjectReady",
        f"ScaledObject {NS}/{NAME}: 2-3 replicas on the lag of 2 kafka trigger(s)")
    assert keda_owned and errors == []
    # The credentials before the object that refers to them.
    assert fake.writes == [("create", keda.TRIGGER_AUTHENTICATIONS, NAME), ("create", keda.SCALED_OBJECTS, NAME)]
    so = fake.objects[keda.SCALED_OBJECTS, NS, NAME]
    assert {t["metadata"]["topic"] for t in so["spec"]["triggers"]} == {"team.orders"}
    _reconcile(scaler, connection, _channel("s1", "s2"), KEDA_SCALED)
    assert len(fake.writes) == 2  # unchanged desired state: no write
    _reconcile(scaler, connection, _channel("s1"), KEDA_SCALED)
    assert fake.writes[2:] == [("patch", keda.SCALED_OBJECTS, NAME)]
    assert len(fake.objects[keda.SCALED_OBJECTS, NS, NAME]["spec"]["triggers"]) == 1


def test_a_trigger_authentication_no_longer_needed_is_removed() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    scaler = _autoscaler(fake)
    _reconcile(scaler, _keda_connection(SCRAM), _channel("s1"))
    condition, keda_owned, _ = _reconcile(scaler, _keda_connection(None), _channel("s1"), KEDA_SCALED)
    assert condition is not None and condition.is_true and keda_owned
    assert (keda.TRIGGER_AUTHENTICATIONS, NS, NAME) not in fake.objects
    assert (keda.SCALED_OBJECTS, NS, NAME) in fake.objects


def test_no_subscribers_hands_replicas_back_to_the_controller() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    scaler = _autoscaler(fake)
    _reconcile(scaler, _keda_connection(SCRAM), _channel("s1"))
    condition, keda_owned, _ = _reconcile(scaler, _keda_connection(SCRAM), _channel(), KEDA_SCALED)
    assert condition is not None and (condition.status, condition.reason) == ("True", "NoSubscribers")
    assert keda_owned is False
    # The ScaledObject first, so that KEDA stops scaling before its credentials go.
    assert fake.writes[-2:] == [("delete", keda.SCALED_OBJECTS, NAME), ("delete", keda.TRIGGER_AUTHENTICATIONS, NAME)]
    assert fake.objects == {}


def test_keda_keeps_the_replicas_until_its_scaled_object_is_gone() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    scaler = _autoscaler(fake)
    _reconcile(scaler, _keda_connection(None), _channel("s1"))
    fake.errors["delete_namespaced_custom_object"] = ApiException(status=500, reason="Internal Server Error")
    condition, keda_owned, errors = _reconcile(scaler, _keda_connection(None, **{"dispatcher.keda.enabled": "false"}),
                                               _channel("s1"), KEDA_SCALED)
    assert condition is not None and (condition.status, condition.reason) == ("False", "KEDAScaledObjectFailed")
    assert keda_owned is True  # setting replicas now would fight KEDA
    assert errors == ["KEDA ScaledObject removal: 500 Internal Server Error"]


def test_crds_removed_after_discovery_are_asked_about_again() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    scaler = _autoscaler(fake)
    fake.errors["get_namespaced_custom_object"] = ApiException(status=404, reason="Not Found")
    fake.errors["create_namespaced_custom_object"] = ApiException(status=404, reason="Not Found")
    condition, keda_owned, errors = _reconcile(scaler, _keda_connection(None), _channel("s1"))
    assert condition is not None and condition.reason == "KEDAScaledObjectFailed" and not keda_owned
    assert errors == ["KEDA ScaledObject: 404 Not Found"]
    del fake.served[f"{keda.GROUP}/{keda.VERSION}"]
    condition, _, _ = _reconcile(scaler, _keda_connection(None), _channel("s1"))
    assert condition is not None and condition.reason == "KEDANotInstalled"
    assert fake.discoveries == 2  # the 404 dropped the cached answer within the TTL


def test_a_connection_keda_cannot_use_is_reported_without_api_calls() -> None:
    fake = FakeCustomObjects(served=KEDA_SERVED)
    # The user from a provider preset (Event Hubs' `$ConnectionString`), not the Secret: KEDA cannot read it.
    connection = dataclasses.replace(_keda_connection(SCRAM), secret_keys=frozenset({"password"}))
    condition, keda_owned, _ = _reconcile(_autoscaler(fake), connection, _channel("s1"), KEDA_SCALED)
    assert condition is not None and (condition.status, condition.reason) == ("False", "KEDAAuthUnsupported")
    assert keda_owned is True  # unchanged: whatever KEDA object exists still scales
    assert (fake.discoveries, fake.writes) == (0, [])
