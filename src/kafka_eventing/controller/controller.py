"""The running controller: caches fed by watches, a work queue, workers, leader election, /healthz and /metrics —
for KafkaChannels, Kafka-class Brokers and their Triggers (controller/brokers.py), KafkaSinks, KafkaSources
(controller/kafkasources.py), ResetOffsets and EventPolicies (controller/eventpolicies.py).

Only the lease holder runs reconciles; followers keep their caches warm so a takeover starts at once. Every
change to a KafkaChannel, to one of its dispatcher objects, to the receiver Deployment, or to the connection
Secret/ConfigMap enqueues the affected channels; a change to a Broker's ConfigMap or the Secret it names enqueues
the Brokers that name it; a periodic resync enqueues all of them. Brokers and Triggers, KafkaSinks, KafkaSources and
ResetOffsets (controller/resetoffsets.py) are reconciled on the same queue when the API server serves their CRDs.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.api import LostLeadership
from kafka_eventing.controller.brokers import ANNOTATION_BROKER, BrokerReconciler, BrokerStores, config_map_of
from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP, KEY_SECRET_NAME, SECRET_LABEL, AdminPool
from kafka_eventing.controller.eventpolicies import EventPolicyReconciler
from kafka_eventing.controller.kafkasources import ANNOTATION_SOURCE, SourceReconciler
from kafka_eventing.controller.leader import LeaderElector
from kafka_eventing.controller.reconciler import Reconciler, Result, Stores
from kafka_eventing.controller.resetoffsets import ResetOffsetReconciler
from kafka_eventing.controller.sinks import SinkReconciler
from kafka_eventing.controller.workqueue import WorkQueue
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core import kafkasources as ksrc
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core import sinks as ks
from kafka_eventing.core.channels import GROUP, PLURAL
from kafka_eventing.core.informer import Informer, NamedWatches, ObjKey, Store, obj_key
from kafka_eventing.core.kafka_config import STATUS_SECRET
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

#: (namespace, name) of a KafkaChannel; ("Broker" | "Trigger" | "KafkaSource", namespace, name) of the others.
Key = tuple[str, ...]
BROKER, TRIGGER = "Broker", "Trigger"
SINK = "KafkaSink"
SOURCE = ksrc.KIND
RESET_OFFSET = ro.KIND
POLICY = ep.KIND
MANAGED = f"{res.LABEL_MANAGED_BY}={res.MANAGED_BY}"


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
    #: reconcile Kafka-class Brokers and their Triggers; None: when the API server serves their CRDs at start.
    brokers: bool | None = None
    broker_config_map: str = kb.DEFAULT_BROKER_CONFIG
    #: reconcile KafkaSinks; None: when the API server serves their CRD at start.
    sinks: bool | None = None
    #: reconcile KafkaSources; None: when the API server serves their CRD at start.
    sources: bool | None = None
    #: reconcile ResetOffsets; None: when the API server serves their (optional) CRD at start.
    resetoffsets: bool | None = None
    #: read EventPolicies (targets' status.policies; their own status with KE_EVENT_POLICY_STATUS); None: when
    #: the API server serves their CRD (Knative's or the chart's) at start.
    eventpolicies: bool | None = None


def _readiness(obj: Mapping[str, Any]) -> tuple[str, str, str, float]:
    """(namespace, name, reason, value) of one resource: 1 with no reason while Ready is True, else 0."""
    meta = obj.get("metadata") or {}
    ready = next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"), None)
    ok = ready is not None and ready.get("status") == "True"
    reason = "" if ok else str((ready or {}).get("reason") or "NotReconciled")
    return str(meta.get("namespace", "")), str(meta.get("name", "")), reason, 1.0 if ok else 0.0


class ChannelReadiness(Collector):
    """``kafkachannel_ready``: 1 per KafkaChannel whose Ready condition is True, else 0 (with its reason).

    Read at scrape time from the informer's cache (the statuses the leader writes come back through the watch),
    so every replica reports the same and nothing is updated per reconcile.
    """

    def __init__(self, channels: Informer) -> None:
        self.channels = channels

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("kafkachannel_ready", "1 while the KafkaChannel's Ready condition is True.",
                                   labels=("namespace", "name", "reason"))
        for obj in self.channels.items():
            namespace, name, reason, value = _readiness(obj)
            family.add_metric((namespace, name, reason), value)
        yield family


class BrokerReadiness(Collector):
    """``kafka_broker_ready`` per Kafka-class Broker and ``kafka_trigger_ready`` per Trigger of one (or of a
    Broker not in the cache, which this controller reconciles too), read at scrape time like ``ChannelReadiness``.

    Brokers and Triggers of other classes are left out: another implementation reports them.
    """

    def __init__(self, brokers: Store, triggers: Store) -> None:
        self.brokers, self.triggers = brokers, triggers

    def collect(self) -> Iterable[Metric]:
        brokers = GaugeMetricFamily("kafka_broker_ready", "1 while the Kafka Broker's Ready condition is True.",
                                    labels=("namespace", "name", "reason"))
        triggers = GaugeMetricFamily("kafka_trigger_ready", "1 while the Trigger's Ready condition is True.",
                                     labels=("namespace", "name", "broker", "reason"))
        for obj in self.brokers.items():
            if kb.is_kafka_broker(obj):
                namespace, name, reason, value = _readiness(obj)
                brokers.add_metric((namespace, name, reason), value)
        for obj in self.triggers.items():
            namespace, name, reason, value = _readiness(obj)
            broker_name = kb.trigger_broker(obj)
            broker = self.brokers.get(namespace, broker_name) if broker_name else None
            if broker is None or kb.is_kafka_broker(broker):
                triggers.add_metric((namespace, name, broker_name, reason), value)
        yield brokers
        yield triggers


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
        self.channels = Gauge("kafkachannel_channels", "KafkaChannels in the cache", registry=registry)


class Controller:
    def __init__(self, api_client: client.ApiClient, settings: Settings,
                 options: ControllerOptions | None = None, *, admins: AdminPool | None = None) -> None:
        self.settings = settings
        self.options = opts = options or ControllerOptions()
        self.identity = opts.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.metrics = Metrics(CollectorRegistry())
        self.queue: WorkQueue[Key] = WorkQueue(base_delay=opts.base_backoff, max_delay=opts.max_backoff)
        system = settings.system_namespace
        core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        wt = opts.watch_timeout_seconds
        self.channels = Informer("kafkachannels", custom.list_cluster_custom_object, self._on_channel,
                                 watch_timeout_seconds=wt, group=GROUP, version="v1beta1", plural=PLURAL)
        self.deployments = Informer("deployments", apps.list_namespaced_deployment, self._on_owned,
                                    watch_timeout_seconds=wt, namespace=system)
        self.services = Informer("services", core.list_service_for_all_namespaces, self._on_owned,
                                 watch_timeout_seconds=wt, label_selector=MANAGED)
        self.config_maps = Informer("configmaps", core.list_namespaced_config_map, self._on_config_map,
                                    watch_timeout_seconds=wt, namespace=system,
                                    field_selector=f"metadata.name={opts.config_map}")
        self.secrets = Informer("secrets", core.list_namespaced_secret, self._on_secret,
                                watch_timeout_seconds=wt, namespace=system)
        self.informers: tuple[Informer, ...] = (self.channels, self.deployments, self.services, self.config_maps,
                                                self.secrets)
        self.metrics.registry.register(ChannelReadiness(self.channels))
        self.elector = LeaderElector(api_client, system, opts.lease_name, self.identity,
                                     lease_duration=opts.lease_duration, renew_deadline=opts.renew_deadline,
                                     retry_period=opts.retry_period, on_started=self._on_leader)
        self.reconciler = Reconciler(
            api_client, settings,
            Stores(channels=self.channels, deployments=self.deployments, services=self.services,
                   config_maps=self.config_maps, secrets=self.secrets),
            admins=admins or AdminPool(timeout=opts.kafka_timeout), config_map=opts.config_map,
            may_write=lambda: self.elector.is_leader, topic_recheck_seconds=opts.topic_recheck_seconds,
            keda_discovery_seconds=opts.keda_discovery_seconds)
        self.broker_reconciler: BrokerReconciler | None = None
        self.brokers: Informer | None = None
        self.triggers: Informer | None = None
        #: the ConfigMaps Brokers name (any namespace), each watched by name while a Broker names it
        self.broker_config_maps = NamedWatches("broker-configmaps", core.list_namespaced_config_map,
                                               self._on_broker_config_map, watch_timeout_seconds=wt)
        if opts.brokers or (opts.brokers is None and _serves_brokers(custom)):
            self.brokers = Informer("brokers", custom.list_cluster_custom_object, self._on_broker,
                                    watch_timeout_seconds=wt, group=kb.GROUP, version=kb.VERSION, plural=kb.BROKERS)
            self.triggers = Informer("triggers", custom.list_cluster_custom_object, self._on_trigger,
                                     watch_timeout_seconds=wt, group=kb.GROUP, version=kb.VERSION,
                                     plural=kb.TRIGGERS)
            self.informers = (*self.informers, self.brokers, self.triggers)
            self.broker_reconciler = BrokerReconciler(
                self.reconciler, BrokerStores(self.brokers, self.triggers),
                recheck_seconds=opts.topic_recheck_seconds, broker_config_map=opts.broker_config_map,
                kafka_timeout=opts.kafka_timeout)
            self.metrics.registry.register(BrokerReadiness(self.brokers, self.triggers))
        self.sink_reconciler: SinkReconciler | None = None
        self.sinks: Informer | None = None
        if opts.sinks or (opts.sinks is None and _serves(custom, ks.GROUP, ks.VERSION, {ks.PLURAL})):
            self.sinks = Informer("kafkasinks", custom.list_cluster_custom_object, self._on_sink,
                                  watch_timeout_seconds=wt, group=ks.GROUP, version=ks.VERSION, plural=ks.PLURAL)
            self.informers = (*self.informers, self.sinks)
            self.sink_reconciler = SinkReconciler(self.reconciler, self.sinks,
                                                  recheck_seconds=opts.topic_recheck_seconds,
                                                  kafka_timeout=opts.kafka_timeout)
        self.sources: Informer | None = None
        self.source_reconciler: SourceReconciler | None = None
        if opts.sources or (opts.sources is None and _serves(custom, ksrc.GROUP, ksrc.VERSION, {ksrc.PLURAL})):
            self.sources = Informer("kafkasources", custom.list_cluster_custom_object, self._on_source,
                                    watch_timeout_seconds=wt, group=ksrc.GROUP, version=ksrc.VERSION,
                                    plural=ksrc.PLURAL)
            self.informers = (*self.informers, self.sources)
            self.source_reconciler = SourceReconciler(self.reconciler, self.sources,
                                                      recheck_seconds=opts.topic_recheck_seconds,
                                                      kafka_timeout=opts.kafka_timeout)
        self.resetoffsets: Informer | None = None
        self.reset_reconciler: ResetOffsetReconciler | None = None
        if opts.resetoffsets or (opts.resetoffsets is None and _serves(custom, ro.GROUP, ro.VERSION, {ro.PLURAL})):
            self.resetoffsets = Informer("resetoffsets", custom.list_cluster_custom_object, self._on_reset,
                                         watch_timeout_seconds=wt, group=ro.GROUP, version=ro.VERSION,
                                         plural=ro.PLURAL)
            self.informers = (*self.informers, self.resetoffsets)
            self.reset_reconciler = ResetOffsetReconciler(api_client, settings, self.resetoffsets,
                                                          lambda: self.elector.is_leader)
        self.eventpolicies: Informer | None = None
        self.policy_reconciler: EventPolicyReconciler | None = None
        if opts.eventpolicies or (opts.eventpolicies is None and _serves(custom, ep.GROUP, ep.VERSION, {ep.PLURAL})):
            self.eventpolicies = Informer("eventpolicies", custom.list_cluster_custom_object, self._on_policy,
                                          watch_timeout_seconds=wt, group=ep.GROUP, version=ep.VERSION,
                                          plural=ep.PLURAL)
            self.informers = (*self.informers, self.eventpolicies)
            self.reconciler.stores.policies = self.eventpolicies
            self.policy_reconciler = EventPolicyReconciler(self.reconciler, self.eventpolicies,
                                                           write_status=settings.event_policy_status)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None
        self.health_port: int | None = None

    # -- event handlers: map any change to the channel keys it affects ------------------------------
    def _on_channel(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((str(meta.get("namespace")), str(meta.get("name"))))

    def _on_owned(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        owner = annotations.get(res.ANNOTATION_CHANNEL)
        broker = annotations.get(ANNOTATION_BROKER)
        source = annotations.get(ANNOTATION_SOURCE)
        if source and "/" in source:
            namespace, _, name = source.partition("/")
            self.queue.add((SOURCE, namespace, name))
        elif owner and "/" in owner:
            namespace, _, name = owner.partition("/")
            self.queue.add((namespace, name))
        elif broker and "/" in broker:
            namespace, _, name = broker.partition("/")
            self.queue.add((BROKER, namespace, name))
        elif meta.get("name") == self.settings.receiver_deployment_name and self.channels.synced():
            self._enqueue_all()  # the shared receiver's availability is part of every channel's status

    def _on_config_map(self, kind: str, obj: Mapping[str, Any]) -> None:
        if self.channels.synced() and kind != "RELISTED":
            self._enqueue_all()  # a new connection: topics re-checked, dispatchers rolled

    def _on_secret(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if self.sources is not None and kind != "RELISTED":
            # A rotated Secret named by a KafkaSource's net rolls that source's dispatcher.
            name = meta.get("name")
            for source in self.sources.items():
                if name in ksrc.secret_names(source):
                    self._on_source(kind, source)
        cm = self.config_maps.get(self.settings.system_namespace, self.options.config_map) or {}
        named = ((cm.get("data") or {}).get(KEY_SECRET_NAME) or "").strip()
        # Only the connection Secret matters, not every token or release Secret of the namespace.
        if (meta.get("labels") or {}).get(SECRET_LABEL) == "true" or meta.get("name") == named:
            self._on_config_map(kind, obj)
        # A Broker or KafkaSink on a connection of its own: its status carries the Secret's new checksum to the
        # receiver. (Only this namespace's Secrets are watched; a sink's elsewhere waits for the resync.)
        secret = f"{meta.get('namespace')}/{meta.get('name')}"
        for informer, handler in ((self.brokers, self._on_broker), (self.sinks, self._on_sink)):
            for target in informer.items() if informer is not None and kind != "RELISTED" else ():
                if ((target.get("status") or {}).get("annotations") or {}).get(STATUS_SECRET) == secret:
                    handler(kind, target)
        # ... and the Secrets that Broker configs name (they live in the system namespace too).
        for key in self.broker_config_maps.watched():
            config = self.broker_config_maps.get(*key) or {}
            if ((config.get("data") or {}).get(KEY_SECRET_NAME) or "").strip() == meta.get("name"):
                self._on_broker_config_map(kind, config)

    def _broker_config_map(self, broker: Mapping[str, Any]) -> ObjKey:
        return config_map_of(broker, self.settings.system_namespace, self.options.broker_config_map)

    def _on_broker_config_map(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A Broker's ConfigMap (or the Secret it names) changed: reconcile the Brokers that name it."""
        key = obj_key(obj)
        for broker in self.brokers.items() if self.brokers is not None else ():
            if self._broker_config_map(broker) == key:
                self._on_broker("CONFIG", broker)

    def _on_broker(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        self.queue.add((BROKER, namespace, name))
        if kind not in ("CONFIG", "RESYNC") and self.brokers is not None:
            # Watch the ConfigMaps the Brokers name now: a Broker waiting for its config sees it at once.
            self.broker_config_maps.want({self._broker_config_map(b) for b in self.brokers.items()
                                          if kb.is_kafka_broker(b)})
        # A Broker's readiness and delivery defaults are part of its Triggers' status.
        for trigger in self.triggers.items() if self.triggers is not None else ():
            tmeta = trigger.get("metadata") or {}
            if tmeta.get("namespace") == namespace and kb.trigger_broker(trigger) == name:
                self.queue.add((TRIGGER, namespace, str(tmeta.get("name"))))

    def _on_sink(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((SINK, str(meta.get("namespace")), str(meta.get("name"))))
    def _on_source(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((SOURCE, str(meta.get("namespace")), str(meta.get("name"))))

    def _on_trigger(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((TRIGGER, str(meta.get("namespace")), str(meta.get("name"))))

    def _on_reset(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.queue.add((RESET_OFFSET, str(meta.get("namespace")), str(meta.get("name"))))

    def _on_policy(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A policy changed: its status, and the status.policies of every target of its namespace (which ones it
        names may have changed too)."""
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace"))
        self.queue.add((POLICY, namespace, str(meta.get("name"))))
        if kind in ("RESYNC", "RELISTED"):
            return  # the resync enqueues every target anyway
        for informer, handler in ((self.channels, self._on_channel), (self.brokers, self._on_broker),
                                  (self.sinks, self._on_sink)):
            for target in informer.items() if informer is not None else ():
                if (target.get("metadata") or {}).get("namespace") == namespace:
                    handler("RESYNC", target)

    def _on_leader(self) -> None:
        self._enqueue_all()

    def _enqueue_all(self) -> None:
        for obj in self.channels.items():
            self._on_channel("RESYNC", obj)
        for obj in self.brokers.items() if self.brokers is not None else ():
            self._on_broker("RESYNC", obj)
        for obj in self.sinks.items() if self.sinks is not None else ():
            self._on_sink("RESYNC", obj)
        for obj in self.sources.items() if self.sources is not None else ():
            self._on_source("RESYNC", obj)
        for obj in self.resetoffsets.items() if self.resetoffsets is not None else ():
            self._on_reset("RESYNC", obj)
        for obj in self.eventpolicies.items() if self.eventpolicies is not None else ():
            self._on_policy("RESYNC", obj)

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
        self.broker_config_maps.stop()
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
            self.metrics.channels.set(len(self.channels.items()))
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
        try:
            result = self._reconcile(key)
        except LostLeadership:
            self.queue.add(key)  # the next leader (maybe us again) picks it up
            self.metrics.reconciles.labels("lost_leadership").inc()
            return
        except Exception as exc:
            result = Result(error=f"{type(exc).__name__}: {exc}")
            log.warning("reconcile failed", extra={"channel": "/".join(key), "error": result.error},
                        exc_info=not _expected(exc))
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

    def _reconcile(self, key: Key) -> Result:
        if len(key) == 2:
            return self.reconciler.reconcile(*key)
        kind, namespace, name = key
        if kind == SINK:
            assert self.sink_reconciler is not None
            return self.sink_reconciler.reconcile_sink(namespace, name)
        if kind == SOURCE:
            assert self.source_reconciler is not None
            return self.source_reconciler.reconcile(namespace, name)
        if kind == RESET_OFFSET:
            assert self.reset_reconciler is not None
            return self.reset_reconciler.reconcile(namespace, name)
        if kind == POLICY:
            assert self.policy_reconciler is not None
            return self.policy_reconciler.reconcile(namespace, name)
        assert self.broker_reconciler is not None
        if kind == BROKER:
            return self.broker_reconciler.reconcile_broker(namespace, name)
        return self.broker_reconciler.reconcile_trigger(namespace, name)

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


def _serves_brokers(custom: client.CustomObjectsApi) -> bool:
    """Whether the API server serves eventing.knative.dev/v1 Brokers and Triggers (Knative's or ours)."""
    return _serves(custom, kb.GROUP, kb.VERSION, {kb.BROKERS, kb.TRIGGERS})


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
