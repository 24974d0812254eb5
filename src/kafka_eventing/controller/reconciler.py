"""The machinery every kind's reconciler shares (no kind is it): the caches of the system namespace, API clients,
writes made only when the desired object differs (``api.Writer``), status merge patches holding only the fields the
controller owns, finalizers, data-plane Deployments and Services, Secret copies, dead-letter sinks, the policies that
apply to a target, and senders' OIDC identities. Each kind's reconcile lives in its own module on top of it
(``controller/registry.py`` lists them).
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import conditions as cond
from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import (
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    MERGE_PATCH,
    Writer,
)
from kafka_eventing.controller.autoscaler import KEDA_DISCOVERY_TTL, KedaAutoscaler
from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP, AdminPool, ResolvedConnection, resolve
from kafka_eventing.controller.destinations import HTTP_FORBIDDEN, Address, Unresolved, resolve_address
from kafka_eventing.controller.identities import Identities
from kafka_eventing.controller.policies import target_status
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.conditions import Condition, merge
from kafka_eventing.core.informer import Store
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

#: how often a data-plane owner being deleted re-checks that its dispatcher is gone, should the deletion event be
#: missed
STOP_RECHECK_SECONDS = 2.0


@dataclass
class Stores:
    deployments: Store  # dispatcher Deployments and the receiver Deployment, system namespace
    services: Store  # dispatcher Services (system namespace) and channel Services (all namespaces)
    config_maps: Store
    secrets: Store
    #: EventPolicies (every namespace) while the API server serves their CRD; None: it does not.
    policies: Store | None = None


@dataclass(frozen=True)
class Result:
    """``error``: requeue with backoff; ``requeue_after``: look again later even without an event."""

    error: str | None = None
    requeue_after: float | None = None


#: A topic someone else creates (a KafkaSource's, a KafkaSink's, a Broker's or channel's external one) is looked for
#: again after 1 s, then 2 s, then every 3 s while it is missing: Ready within 5 s of its creation, the rest of the
#: reconcile (offsets, the dispatcher Deployment) included.
TOPIC_WAIT_FIRST_SECONDS, TOPIC_WAIT_MAX_SECONDS = 1.0, 3.0
#: ``TopicError.reason`` of a topic that does not exist (``topics.TopicNotFound``, an external topic)
TOPIC_NOT_FOUND = "TopicNotFound"


class TopicWait:
    """How soon an object whose topic does not exist yet looks again: ``first`` seconds, doubling up to ``cap``, per
    object; ``found`` resets it (and ``forget`` once the object is gone).

    Kafka has no watch for a topic's creation, so this is a poll, but a bounded one: one topic description per
    waiting object every ``cap`` seconds at most, so the object notices the topic within ``cap`` seconds of its
    creation. Other topic failures (Kafka unreachable, not authorized, a quota) keep the work queue's exponential
    backoff or the recheck: waiting for them sooner would only load Kafka.
    """

    def __init__(self, first: float = TOPIC_WAIT_FIRST_SECONDS, cap: float = TOPIC_WAIT_MAX_SECONDS) -> None:
        self.first, self.cap = first, cap
        self._tries: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def retry(self, namespace: str, name: str) -> Result:
        with self._lock:
            tries = self._tries.get((namespace, name), 0)
            self._tries[(namespace, name)] = tries + 1
        return Result(requeue_after=min(self.cap, self.first * 2 ** min(tries, 16)))

    def found(self, namespace: str, name: str) -> None:
        with self._lock:
            self._tries.pop((namespace, name), None)

    forget = found

    def waiting(self) -> int:
        with self._lock:
            return len(self._tries)


#: Knative's status fields of a resolved dead-letter sink (what the dispatchers read).
DEAD_LETTER_FIELDS = ("deadLetterSinkUri", "deadLetterSinkAudience", "deadLetterSinkCACerts")


def dead_letter_status(address: Address | None) -> dict[str, Any]:
    """``DEAD_LETTER_FIELDS`` of a resolved dead-letter sink (None: all cleared)."""
    return dict(zip(DEAD_LETTER_FIELDS, (address.url, address.audience, address.ca_certs) if address
                    else (None, None, None), strict=True))


class SecretProblem(Exception):
    """A Secret a resource names cannot be read; ``reason`` is the condition's, the message names what to fix."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Reconciler:
    def __init__(
        self,
        api_client: client.ApiClient,
        settings: Settings,
        stores: Stores,
        *,
        admins: AdminPool | None = None,
        config_map: str = DEFAULT_CONFIG_MAP,
        may_write: Callable[[], bool] = lambda: True,
        keda_discovery_seconds: float = KEDA_DISCOVERY_TTL,
    ) -> None:
        self.settings = settings
        self.stores = stores
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.identities = Identities(api_client, settings)  # senders' OIDC ServiceAccounts (Triggers, KafkaSources)
        self.admins = admins or AdminPool()
        self.config_map = config_map
        self.may_write = may_write
        self.writer = Writer(may_write)
        self.autoscaler = KedaAutoscaler(self.custom, settings, self.writer, discovery_seconds=keda_discovery_seconds)

    def default_connection(self) -> ResolvedConnection:
        """The controller's own Kafka connection (its ConfigMap and the Secret it names); KafkaConfigError when
        unusable."""
        return resolve(self.settings, self.stores.config_maps, self.stores.secrets, self.config_map)

    def event_policies(self, group: str, kind: str, obj: Mapping[str, Any], status: dict[str, Any],
                       conditions: list[Condition]) -> None:
        """A target's ``status.policies`` and ``EventPoliciesReady`` (``controller/policies.py``), added to what
        its reconciler writes — with authentication on only: off, no policy is enforced and neither is written."""
        if not self.settings.auth_issuer:
            status["policies"] = None
            return
        meta = obj.get("metadata") or {}
        target = ep.Target(group, kind, str(meta.get("namespace")), str(meta.get("name")),
                        tuple(sorted((meta.get("labels") or {}).items())))
        refs, condition = target_status(self.stores.policies, self.settings, target)
        status["policies"] = refs or None
        conditions.append(condition)

    def dead_letter_sink(self, namespace: str, spec: Mapping[str, Any]) -> tuple[Condition, Address | None] | None:
        """``spec.delivery.deadLetterSink`` resolved (the condition and the address), None when there is none."""
        sink = ((spec.get("delivery") or {}).get("deadLetterSink")) or None
        if not sink:
            return None
        try:
            uri = resolve_address(self.core, self.custom, sink, namespace, "dead-letter sink")
        except Unresolved as exc:
            reason = {"DestinationNotAddressable": "DeadLetterSinkNotAddressable",
                      "DestinationForbidden": "DeadLetterSinkForbidden"}.get(exc.reason, "DeadLetterSinkUnresolved")
            return Condition.false(cond.DEAD_LETTER_SINK_RESOLVED, reason, str(exc)), None
        return Condition.true(cond.DEAD_LETTER_SINK_RESOLVED), uri

    # -- writes -------------------------------------------------------------------------------------
    def _apply_service(self, desired: dict[str, Any]) -> Mapping[str, Any]:
        live, written = self.writer.apply(self.stores.services, self.core.create_namespaced_service,
                                    self.core.patch_namespaced_service, desired)
        return desired if written or live is None else live

    def read_secret(self, namespace: str, name: str, named_by: str,
                    readers: tuple[str, ...] = ("controller",)) -> dict[str, bytes]:
        """The data of a Secret a resource names in its own namespace, read by name: the chart lets ``readers``
        read Secrets only where ``<reader>.rbac.secretNamespaces`` lists (``SecretProblem`` says which to set)."""
        try:
            found = self.core.read_namespaced_secret(name, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                raise SecretProblem("SecretNotFound",
                                    f"Secret {namespace}/{name} named by {named_by} does not exist") from None
            if exc.status == HTTP_FORBIDDEN:
                lists = " and ".join(f"{r}.rbac.secretNamespaces" for r in readers)
                wide = " and ".join(f"{r}.rbac.clusterWideSecretRead" for r in readers)
                raise SecretProblem("SecretNotReadable",
                                    f"the controller may not read Secret {namespace}/{name}: list {namespace} in the "
                                    f"chart value {lists} (or set {wide})") from None
            raise SecretProblem("SecretNotReadable",
                                f"Secret {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        return {k: base64.b64decode(v) for k, v in (found.data or {}).items()}

    def write_secret_copy(self, name: str, data: Mapping[str, bytes]) -> None:
        """A Secret of the system namespace holding ``data``: the copy of keys a resource names in its own namespace,
        for the dispatcher that runs here (a pod mounts Secrets of its own namespace only). Written only when its
        content differs from the cached copy; the only Secrets the controller writes."""
        system = self.settings.system_namespace
        wanted = {k: base64.b64encode(v).decode() for k, v in data.items()}
        body = {"metadata": {"name": name, "namespace": system, "labels": res.labels("dispatcher")},
                "type": "Opaque", "data": wanted}
        found = self.stores.secrets.get(system, name)
        if found is None:
            try:
                self.core.create_namespaced_secret(system, body, _request_timeout=(5, 15))
                return
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:  # made since the cache last heard: replaced below
                    raise
        elif (found.get("data") or {}) == wanted:
            return
        self.core.replace_namespaced_secret(name, system, body, _request_timeout=(5, 15))

    def delete_secret_copy(self, name: str) -> None:
        """Delete the copy if the cache holds one: a resource that never needed a copy makes no call (and needs no
        delete right — an install rolled back to a chart without it still finalizes)."""
        if self.stores.secrets.get(self.settings.system_namespace, name) is None:
            return
        try:
            self.core.delete_namespaced_secret(name, self.settings.system_namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise

    def _apply_deployment(self, desired: dict[str, Any]) -> Mapping[str, Any] | None:
        """The live Deployment as cached (with its status), or None when it was created just now.

        After an update the cached object is returned: the old ReplicaSet keeps serving during the rollout,
        so a rotated Secret does not flip the channel to not-Ready.
        """
        live, _ = self.writer.apply(self.stores.deployments, self.apps.create_namespaced_deployment,
                              self.apps.patch_namespaced_deployment, desired)
        return live

    def stop_deployment(self, name: str, services: Sequence[tuple[str, str]] = (), namespace: str = "") -> bool:
        """Deletes the data-plane Deployment ``name`` (in ``namespace``, else the system namespace) and the
        ``services`` (name, namespace).

        True while the Deployment still exists. The data plane stops before its topic or consumer group goes: a
        dispatcher still consuming a deleted topic fills its log with UNKNOWN_TOPIC_OR_PART, and a group with
        members cannot be deleted. Foreground deletion keeps the Deployment until its ReplicaSets and Pods are gone
        (the garbage collector), so "not found" means none of its pods runs.
        """
        stopping = True
        doomed = ((self.apps.delete_namespaced_deployment, name, namespace or self.settings.system_namespace,
                   "Foreground"),
                  *((self.core.delete_namespaced_service, svc, where, "Background") for svc, where in services))
        for delete, victim, where, policy in doomed:
            self.writer.check()
            try:
                delete(victim, where, propagation_policy=policy, _request_timeout=(5, 30))
            except ApiException as exc:
                if exc.status != HTTP_NOT_FOUND:
                    raise
                if policy == "Foreground":
                    stopping = False
        return stopping

    def set_finalizers(self, obj: Mapping[str, Any], finalizers: list[str],
                       api: tuple[str, str, str]) -> Mapping[str, Any]:
        """``api``: (group, version, plural) of ``obj``."""
        self.writer.check()
        meta = obj["metadata"]
        # resourceVersion makes this a compare-and-swap: a concurrent change to the list gives a 409, not a loss.
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        return dict(self.custom.patch_namespaced_custom_object(
            *api[:2], meta["namespace"], api[2], meta["name"], patch,
            _content_type=MERGE_PATCH, _request_timeout=(5, 30)))

    def patch_status(self, obj: Mapping[str, Any], status: dict[str, Any], conditions: list[Condition],
                     api: tuple[str, str, str], *, foreign: Sequence[str] = ()) -> None:
        """Merge-patch the status fields the controller owns, only when something changed.

        ``foreign``: condition types another writer owns (a Trigger's dispatcher). A merge-patch replaces the whole
        conditions list, so they are carried over as read, and the patch is made conditional on the read
        ``resourceVersion``: a write of theirs that this controller has not seen yet fails the patch (409, the
        key is retried on the newer object) instead of being overwritten.
        """
        meta = obj["metadata"]
        old: Mapping[str, Any] = obj.get("status") or {}
        kept = [dict(c) for c in old.get("conditions") or () if isinstance(c, Mapping) and c.get("type") in foreign]
        merged = sorted([*merge(old.get("conditions"), conditions), *kept], key=lambda c: str(c["type"]))
        status = {**status, "conditions": merged}
        if all(old.get(k) == v for k, v in status.items()):
            return  # nothing changed (None matches an absent field)
        self.writer.check()
        body: dict[str, Any] = {"status": status}
        if foreign:
            body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        self.custom.patch_namespaced_custom_object_status(
            *api[:2], meta["namespace"], api[2], meta["name"], body,
            _content_type=MERGE_PATCH, _request_timeout=(5, 30))
