"""What a resource kind gets from the running controller, and how it registers itself.

A kind is a module with a ``KIND`` (a ``Kind``) listed in ``controller/registry.py``. When the API server serves its
CRD (or the options force it on), the controller calls its ``setup`` with the ``Host``: the kind makes its caches
(``Host.informer``), says which events of other kinds' caches concern it (``Host.on``), which dispatcher objects it
owns (``Host.owns``), and what reconciles one of its objects (``Host.reconciles``). The controller runs whatever is
registered — its queue, workers, leadership, resync and /metrics — and changes for no kind.

Event names are kinds (``"Broker"``) or the shared caches' (``DEPLOYMENT``, ``SERVICE``, ``CONFIG_MAP``, ``SECRET``:
the system namespace's, plus channel Services everywhere); an event's type is the informer's (``ADDED``,
``MODIFIED``, ``DELETED``, ``RELISTED``) or ``RESYNC`` when the controller enqueues everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes import client
from prometheus_client import CollectorRegistry

from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP
from kafka_eventing.core.brokers import DEFAULT_BROKER_CONFIG
from kafka_eventing.core.informer import Handler, Informer, Store
from kafka_eventing.core.kafka_config import STATUS_SECRET
from kafka_eventing.core.settings import Settings

if TYPE_CHECKING:
    from kafka_eventing.controller.reconciler import Reconciler, Result

DEPLOYMENT, SERVICE, CONFIG_MAP, SECRET = "Deployment", "Service", "ConfigMap", "Secret"
#: The event type of the controller's own "look at everything" (leadership gained, resync, connection changed).
RESYNC = "RESYNC"


@dataclass(frozen=True)
class ControllerOptions:
    """Knobs of the controller process itself (the shared ``Settings`` hold the rest)."""

    workers: int = 8
    resync_seconds: float = 300.0
    topic_recheck_seconds: float = 60.0
    keda_discovery_seconds: float = 30.0  # how long "KEDA's CRDs are (not) installed" is believed
    watch_timeout_seconds: int = 240
    lease_name: str = "kafka-channel-controller"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = ""
    config_map: str = DEFAULT_CONFIG_MAP
    health_port: int | None = None  # None: no HTTP server (tests); 0: any free port
    health_address: str = "0.0.0.0"  # in a pod the kubelet probes the pod IP
    kafka_timeout: float = 10.0
    base_backoff: float = 0.5
    max_backoff: float = 300.0
    broker_config_map: str = DEFAULT_BROKER_CONFIG
    #: a registered kind's ``option`` (``"brokers"``, ``"sinks"`` …) → reconcile it or not; a kind not named here
    #: is reconciled when the API server serves its CRD at start.
    kinds: Mapping[str, bool] = field(default_factory=dict)


Reconcile = Callable[[str, str], "Result"]


class Host(Protocol):
    """The running controller, as a kind's ``setup`` sees it."""

    api_client: client.ApiClient
    settings: Settings
    options: ControllerOptions
    #: the shared machinery: API clients, status and finalizer writes, Deployments, Secret copies, policies
    base: Reconciler
    registry: CollectorRegistry

    def is_leader(self) -> bool: ...

    def informer(self, kind: str, list_func: Callable[..., Any], **list_kwargs: Any) -> Informer:
        """A cache, started and stopped with the controller, whose events go to every ``on(kind, …)`` handler."""
        ...

    def store(self, kind: str) -> Store | None:
        """The cache of ``kind`` (a registered kind's or a shared one); None when that kind is not served."""
        ...

    def on(self, kind: str, handler: Handler) -> None:
        """Call ``handler(event_type, obj)`` on each event of ``kind``'s cache."""
        ...

    def owns(self, annotation: str, kind: str) -> None:
        """Deployments and Services annotated ``annotation: <namespace>/<name>`` belong to that object of
        ``kind``: their changes enqueue it."""
        ...

    def reconciles(self, kind: str, reconcile: Reconcile) -> None: ...

    def enqueue(self, kind: str, namespace: str, name: str) -> None: ...

    def stops(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` when the controller stops (watches a kind starts by itself)."""
        ...


def enqueue_object(host: Host, kind: str) -> Handler:
    """The handler most kinds need: an event of one of its objects enqueues that object."""

    def handler(event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        host.enqueue(kind, str(meta.get("namespace")), str(meta.get("name")))

    return handler


@dataclass(frozen=True)
class Kind:
    """A resource kind the controller can reconcile."""

    name: str  # the queue key's first element and its events' name, e.g. "KafkaSink"
    option: str  # its key in ``ControllerOptions.kinds``, e.g. "sinks"
    group: str
    version: str
    plurals: frozenset[str]  # every one must be served for the kind to be reconciled
    setup: Callable[[Host], None]
    #: reconciled whether or not discovery finds it (the KafkaChannel: the controller's first kind)
    always: bool = False


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace"))


def on_policies(host: Host, kind: str, store: Store) -> None:
    """``kind`` is a target of EventPolicies: a policy's change enqueues the objects of its namespace (which of them
    it selects may have changed too). The resync enqueues every target anyway."""

    def handler(event: str, policy: Mapping[str, Any]) -> None:
        if event in (RESYNC, "RELISTED"):
            return
        namespace = namespace_of(policy)
        for obj in store.items():
            if namespace_of(obj) == namespace:
                enqueue_object(host, kind)(event, obj)

    host.on("EventPolicy", handler)


def on_status_secret(host: Host, kind: str, store: Store) -> None:
    """Objects of ``kind`` on a connection of their own carry its Secret's checksum in their status (read by the
    receiver): a change of that Secret (system namespace) enqueues them."""

    def handler(event: str, secret: Mapping[str, Any]) -> None:
        if event == "RELISTED":
            return
        meta = secret.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        for obj in store.items():
            if ((obj.get("status") or {}).get("annotations") or {}).get(STATUS_SECRET) == name:
                enqueue_object(host, kind)(event, obj)

    host.on(SECRET, handler)


def readiness(obj: Mapping[str, Any]) -> tuple[str, str, str, float]:
    """(namespace, name, reason, value) of one resource: 1 with no reason while Ready is True, else 0."""
    meta = obj.get("metadata") or {}
    ready = next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"), None)
    ok = ready is not None and ready.get("status") == "True"
    reason = "" if ok else str((ready or {}).get("reason") or "NotReconciled")
    return str(meta.get("namespace", "")), str(meta.get("name", "")), reason, 1.0 if ok else 0.0
