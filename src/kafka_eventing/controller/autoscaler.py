"""The dispatcher's autoscaling by KEDA, as the reconciler drives it: stamp or remove the ScaledObject (and the
TriggerAuthentication it needs), tell whether KEDA or the controller owns the replica count, and remember for a
while whether the API server serves KEDA's CRDs at all. The objects themselves are built by ``keda``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import keda
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import HTTP_NOT_FOUND, CustomObjects, Writer, api_error
from kafka_eventing.controller.connection import ResolvedConnection
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.settings import Settings

#: How long an answer to "does the API server serve keda.sh/v1alpha1?" is reused.
KEDA_DISCOVERY_TTL = 30.0


def keda_scaled(deployment: Mapping[str, Any] | None) -> bool:
    """Whether the live dispatcher Deployment is marked as scaled by KEDA."""
    value = (((deployment or {}).get("metadata") or {}).get("annotations") or {}).get(res.ANNOTATION_SCALER)
    return value is not None and str(value) == res.SCALER_KEDA


class KedaAutoscaler:
    def __init__(self, custom: client.CustomObjectsApi, settings: Settings, writer: Writer,
                 discovery_seconds: float = KEDA_DISCOVERY_TTL) -> None:
        self.custom, self.settings, self.writer = custom, settings, writer
        self.scaled_objects = CustomObjects(custom, keda.GROUP, keda.VERSION, keda.SCALED_OBJECTS)
        self.trigger_auths = CustomObjects(custom, keda.GROUP, keda.VERSION, keda.TRIGGER_AUTHENTICATIONS)
        self._served: tuple[bool, float] | None = None
        self.discovery_seconds = discovery_seconds

    def reconcile(self, ref: res.ChannelRef, obj: Mapping[str, Any], connection: ResolvedConnection,
                    partitions: int, *, topic: str, deployment: Mapping[str, Any] | None,
                    errors: list[str]) -> tuple[Condition | None, bool]:
        """Stamp or remove a channel dispatcher's ScaledObject (lag of ``topic``): (condition or None, whether KEDA
        owns replicas)."""
        was_keda = keda_scaled(deployment)
        subscribers = keda.subscriber_uids(obj.get("spec") or {})
        kind = cond.DISPATCHER_AUTOSCALER_READY
        if not connection.keda.enabled or not subscribers:
            # Nothing to scale on: the controller owns replicas again (and keeps an idle dispatcher at its
            # count instead of letting KEDA hold it at zero). Only a Deployment marked as KEDA-scaled
            # leads to API calls, so the default (KEDA off) costs nothing.
            if was_keda:
                try:
                    self.delete(ref)
                except ApiException as exc:
                    errors.append(f"KEDA ScaledObject removal: {api_error(exc)}")
                    # Until it is gone KEDA still scales: setting replicas now would fight it.
                    return Condition.false(kind, "KEDAScaledObjectFailed", api_error(exc)), True
            if not connection.keda.enabled:
                return None, False
            return Condition.true(kind, "NoSubscribers",
                                  "no subscribers, no consumer lag to scale on: the controller sets replicas"), False
        try:
            auth = keda.keda_auth(connection)
        except keda.KedaAuthError as exc:
            return Condition.false(kind, "KEDAAuthUnsupported", str(exc)), was_keda
        missing = self.missing(errors)
        if missing is not None:
            return missing, False
        so = keda.scaled_object(ref, self.settings, connection, auth, topic=topic,
                                subscribers=subscribers, num_partitions=partitions)
        ta = keda.trigger_authentication(ref, self.settings, auth) if auth.needs_trigger_authentication else None
        return self.apply(so, ta, was_keda=was_keda, errors=errors)

    def missing(self, errors: list[str]) -> Condition | None:
        """None when the API server serves KEDA's CRDs; else the False condition saying why (the caller then
        sets replicas itself)."""
        kind = cond.DISPATCHER_AUTOSCALER_READY
        try:
            served = self._is_served()
        except ApiException as exc:
            errors.append(f"KEDA discovery: {api_error(exc)}")
            return Condition.false(kind, "KEDADiscoveryFailed", api_error(exc))
        if not served:
            return Condition.false(kind, "KEDANotInstalled",
                                   f"the API server does not serve {keda.GROUP}/{keda.VERSION} ScaledObjects: "
                                   "install KEDA; the controller sets replicas meanwhile")
        return None

    def apply(self, so: dict[str, Any], ta: dict[str, Any] | None, *, was_keda: bool,
              errors: list[str]) -> tuple[Condition, bool]:
        """Create or patch the ScaledObject (and its TriggerAuthentication, removed when no longer needed):
        (condition, whether KEDA owns replicas)."""
        kind = cond.DISPATCHER_AUTOSCALER_READY
        try:
            if ta is not None:
                self.writer.apply(self.trigger_auths, self.trigger_auths.create, self.trigger_auths.patch, ta)
            self.writer.apply(self.scaled_objects, self.scaled_objects.create, self.scaled_objects.patch, so)
            if ta is None and was_keda:
                self.writer.delete_quietly(self.trigger_auths, so["metadata"]["name"], self.settings.system_namespace)
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                self._served = None  # the CRDs went away since discovery: ask again next time
            errors.append(f"KEDA ScaledObject: {api_error(exc)}")
            return Condition.false(kind, "KEDAScaledObjectFailed", api_error(exc)), was_keda
        spec = so["spec"]
        return Condition.true(kind, "KEDAScaledObjectReady",
                              f"ScaledObject {so['metadata']['namespace']}/{so['metadata']['name']}: "
                              f"{spec['minReplicaCount']}-{spec['maxReplicaCount']} replicas on the lag of "
                              f"{len(spec['triggers'])} kafka trigger(s)"), True

    def _is_served(self) -> bool:
        now = time.monotonic()
        if self._served is not None and now - self._served[1] < self.discovery_seconds:
            return self._served[0]
        try:
            found = self.custom.get_api_resources(keda.GROUP, keda.VERSION, _request_timeout=(5, 15))
            names = {r.name for r in found.resources or ()}
            served = {keda.SCALED_OBJECTS, keda.TRIGGER_AUTHENTICATIONS} <= names
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            served = False
        self._served = (served, now)
        return served

    def delete(self, ref: res.ChannelRef) -> None:
        """Remove the dispatcher's KEDA objects."""
        self.delete_named(res.dispatcher_name(ref.namespace, ref.name))

    def delete_named(self, name: str) -> None:
        """Remove the KEDA objects of the dispatcher Deployment ``name``."""
        # The ScaledObject first: KEDA then stops scaling before its credentials go.
        for api in (self.scaled_objects, self.trigger_auths):
            self.writer.delete_quietly(api, name, self.settings.system_namespace)
