"""The running controller: shared caches fed by watches, a work queue, workers, leader election, resync, /healthz
and /metrics — for whatever kinds ``controller/registry.py`` lists (each kind's module registers its caches, the
events that concern it and its reconcile: ``controller/host.py``). A kind is set up when the API server serves its
CRD at start, or when ``ControllerOptions.kinds`` says so.

Only the lease holder runs reconciles; followers keep their caches warm so a takeover starts at once. A change to a
dispatcher Deployment or Service enqueues the object it belongs to; a change to the shared receiver's Deployment or
to the connection ConfigMap and its Secret enqueues everything, as does the periodic resync.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import LostLeadership
from kafka_eventing.controller.connection import KEY_SECRET_NAME, SECRET_LABEL, AdminPool
from kafka_eventing.controller.host import (
    CONFIG_MAP,
    DEPLOYMENT,
    RESYNC,
    SECRET,
    SERVICE,
    ControllerOptions,
    Kind,
    Reconcile,
)
from kafka_eventing.controller.leader import LeaderElector
from kafka_eventing.controller.reconciler import Reconciler, Result, Stores
from kafka_eventing.controller.registry import KINDS
from kafka_eventing.controller.workqueue import WorkQueue
from kafka_eventing.core.informer import Handler, Informer, Store
from kafka_eventing.core.settings import Settings

__all__ = ["Controller", "ControllerOptions", "Metrics"]

log = logging.getLogger(__name__)

#: (kind, namespace, name)
Key = tuple[str, str, str]
MANAGED = f"{res.LABEL_MANAGED_BY}={res.MANAGED_BY}"


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reconciles = Counter("kafkachannel_reconcile_total", "Reconciles by result", ["result"],
                                  registry=registry)
        self.latency = Histogram("kafkachannel_reconcile_duration_seconds", "Reconcile latency",
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                 registry=registry)
        self.depth = Gauge("kafkachannel_workqueue_depth", "Keys waiting to be reconciled", registry=registry)
        self.delayed = Gauge("kafkachannel_workqueue_delayed", "Keys waiting for a requeue delay", registry=registry)
        self.leader = Gauge("kafkachannel_controller_leader", "1 while this replica holds the lease",
                            registry=registry)


class Controller:
    def __init__(self, api_client: client.ApiClient, settings: Settings,
                 options: ControllerOptions | None = None, *, admins: AdminPool | None = None,
                 kinds: Sequence[Kind] = KINDS) -> None:
        self.api_client, self.settings = api_client, settings
        self.options = opts = options or ControllerOptions()
        self.identity = opts.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.metrics = Metrics(CollectorRegistry())
        self.registry = self.metrics.registry
        self.queue: WorkQueue[Key] = WorkQueue(base_delay=opts.base_backoff, max_delay=opts.max_backoff)
        self.informers: tuple[Informer, ...] = ()
        self._stores: dict[str, Informer] = {}
        self._handlers: dict[str, list[Handler]] = defaultdict(list)
        self._reconcilers: dict[str, Reconcile] = {}
        self._owners: list[tuple[str, str]] = []  # (annotation, kind)
        self._stoppers: list[Callable[[], None]] = []
        system = settings.system_namespace
        core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        # The caches every kind shares: the system namespace's Deployments and Secrets, the controller's Services
        # everywhere, its connection ConfigMap.
        self.deployments = self.informer(DEPLOYMENT, apps.list_namespaced_deployment, namespace=system)
        self.services = self.informer(SERVICE, core.list_service_for_all_namespaces, label_selector=MANAGED)
        self.config_maps = self.informer(CONFIG_MAP, core.list_namespaced_config_map, namespace=system,
                                         field_selector=f"metadata.name={opts.config_map}")
        self.secrets = self.informer(SECRET, core.list_namespaced_secret, namespace=system)
        self.on(DEPLOYMENT, self._on_owned)
        self.on(SERVICE, self._on_owned)
        self.on(CONFIG_MAP, self._on_connection)
        self.on(SECRET, self._on_secret)
        self.elector = LeaderElector(api_client, system, opts.lease_name, self.identity,
                                     lease_duration=opts.lease_duration, renew_deadline=opts.renew_deadline,
                                     retry_period=opts.retry_period, on_started=self._enqueue_all)
        self.base = Reconciler(
            api_client, settings,
            Stores(deployments=self.deployments, services=self.services, config_maps=self.config_maps,
                   secrets=self.secrets),
            admins=admins or AdminPool(timeout=opts.kafka_timeout), config_map=opts.config_map,
            may_write=self.is_leader, keda_discovery_seconds=opts.keda_discovery_seconds)
        custom = client.CustomObjectsApi(api_client)
        self.kinds = [kind.name for kind in kinds if self._wanted(kind, custom)]
        for kind in kinds:
            if kind.name in self.kinds:
                kind.setup(self)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None
        self.health_port: int | None = None

    def _wanted(self, kind: Kind, custom: client.CustomObjectsApi) -> bool:
        forced = self.options.kinds.get(kind.option)
        if forced is not None:
            return forced
        return kind.always or _serves(custom, kind.group, kind.version, set(kind.plurals))

    # -- what a kind registers (controller/host.py) -------------------------------------------------
    def is_leader(self) -> bool:
        return self.elector.is_leader

    def informer(self, kind: str, list_func: Callable[..., Any], **list_kwargs: Any) -> Informer:
        def handler(event: str, obj: Mapping[str, Any]) -> None:
            for react in self._handlers.get(kind, ()):
                react(event, obj)

        informer = Informer(kind.lower(), list_func, handler, watch_timeout_seconds=self.options.watch_timeout_seconds,
                            **list_kwargs)
        self._stores[kind] = informer
        self.informers = (*self.informers, informer)
        return informer

    def store(self, kind: str) -> Store | None:
        return self._stores.get(kind)

    def on(self, kind: str, handler: Handler) -> None:
        self._handlers[kind].append(handler)

    def owns(self, annotation: str, kind: str) -> None:
        self._owners.append((annotation, kind))

    def reconciles(self, kind: str, reconcile: Reconcile) -> None:
        self._reconcilers[kind] = reconcile

    def enqueue(self, kind: str, namespace: str, name: str) -> None:
        self.queue.add((kind, namespace, name))

    def stops(self, stop: Callable[[], None]) -> None:
        self._stoppers.append(stop)

    # -- the shared caches' events ------------------------------------------------------------------
    def _on_owned(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        for annotation, kind in self._owners:
            owner = annotations.get(annotation)
            if owner and "/" in owner:
                namespace, _, name = owner.partition("/")
                self.enqueue(kind, namespace, name)
                return
        if meta.get("name") == self.settings.receiver_deployment_name and self.synced():
            self._enqueue_all()  # the shared receiver's availability is part of every data plane's status

    def _on_connection(self, event: str, obj: Mapping[str, Any]) -> None:
        if self.synced() and event != "RELISTED":
            self._enqueue_all()  # a new connection: topics re-checked, dispatchers rolled

    def _on_secret(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        cm = self.config_maps.get(self.settings.system_namespace, self.options.config_map) or {}
        named = ((cm.get("data") or {}).get(KEY_SECRET_NAME) or "").strip()
        # Only the connection Secret matters here, not every token or release Secret of the namespace.
        if (meta.get("labels") or {}).get(SECRET_LABEL) == "true" or meta.get("name") == named:
            self._on_connection(event, obj)

    def _enqueue_all(self) -> None:
        for kind in self._reconcilers:
            for obj in (store.items() if (store := self._stores.get(kind)) is not None else ()):
                for react in self._handlers.get(kind, ()):
                    react(RESYNC, obj)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        for informer in self.informers:
            informer.start()
        if self.options.health_port is not None:
            self._serve_http(self.options.health_port)
        self.elector.start()
        for i in range(self.options.workers):
            self._spawn(self._worker, f"reconcile-{i}")
        self._spawn(self._resync, "resync")

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(timeout=15)
        self._threads.clear()
        self.elector.stop(release=True)
        for stop in self._stoppers:
            stop()
        for informer in self.informers:
            informer.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def synced(self) -> bool:
        return all(i.synced() for i in self.informers)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - time.monotonic())) for i in self.informers)

    # -- work ---------------------------------------------------------------------------------------
    def _resync(self) -> None:
        while not self._stop.wait(self.options.resync_seconds):
            if self.elector.is_leader:
                self._enqueue_all()

    def _worker(self) -> None:
        while not self._stop.is_set():
            self.metrics.depth.set(len(self.queue))
            self.metrics.delayed.set(self.queue.delayed())
            self.metrics.leader.set(1 if self.elector.is_leader else 0)
            if not self.elector.is_leader or not self.synced():
                # Followers and cold caches do not reconcile; queued keys stay until leadership comes.
                self._stop.wait(0.2)
                continue
            key = self.queue.get(timeout=0.5)
            if key is None:
                continue
            try:
                self._process(key)
            finally:
                self.queue.done(key)

    def _process(self, key: Key) -> None:
        start = time.monotonic()
        kind, namespace, name = key
        try:
            result = self._reconcilers[kind](namespace, name)
        except LostLeadership:
            self.queue.add(key)  # the next leader (maybe us again) picks it up
            self.metrics.reconciles.labels("lost_leadership").inc()
            return
        except Exception as exc:
            result = Result(error=f"{type(exc).__name__}: {exc}")
            log.warning("reconcile failed", extra={"kind": kind, "object": f"{namespace}/{name}",
                                                   "error": result.error}, exc_info=not _expected(exc))
        finally:
            self.metrics.latency.observe(time.monotonic() - start)
        if result.error:
            self.metrics.reconciles.labels("error").inc()
            self.queue.add_rate_limited(key)
            return
        self.metrics.reconciles.labels("success").inc()
        self.queue.forget(key)
        if result.requeue_after:
            self.queue.add_after(key, result.requeue_after)

    # -- HTTP: liveness and metrics -----------------------------------------------------------------
    def _serve_http(self, port: int) -> None:
        controller = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    # Alive means the worker threads run; leadership and Kafka are not liveness concerns.
                    alive = all(t.is_alive() for t in controller._threads)
                    body, code, ctype = (b"ok" if alive else b"workers stopped"), (200 if alive else 500), "text/plain"
                elif self.path == "/readyz":
                    ready = controller.synced()
                    body = b"ok" if ready else b"caches not synced"
                    code, ctype = (200 if ready else 503), "text/plain"
                elif self.path == "/metrics":
                    body, code, ctype = generate_latest(controller.metrics.registry), 200, CONTENT_TYPE_LATEST
                else:
                    body, code, ctype = b"not found", 404, "text/plain"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # probes every few seconds would flood the log

        self._http = ThreadingHTTPServer((self.options.health_address, port), Handler)
        self.health_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, name="health", daemon=True).start()


def _serves(custom: client.CustomObjectsApi, group: str, version: str, plurals: set[str]) -> bool:
    """Whether the API server serves every one of ``plurals`` in ``group/version``."""
    from kubernetes.client.rest import ApiException

    try:
        found = custom.get_api_resources(group, version, _request_timeout=(5, 15))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return plurals <= {r.name for r in found.resources or ()}


def _expected(exc: BaseException) -> bool:
    from kubernetes.client.rest import ApiException

    return isinstance(exc, ApiException) and exc.status in (404, 409)
