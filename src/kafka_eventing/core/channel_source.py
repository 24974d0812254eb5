"""The set of KafkaChannels and their readiness, kept current in the background, for receiver and dispatcher.

Two sources share one interface (``ChannelSource``): ``FileChannelSource`` polls a YAML file of KafkaChannel
documents (standalone mode) and ``KubeChannelSource`` lists and watches the KafkaChannel custom resources
through the shared ``Informer`` (only ``list`` and ``watch`` on kafkachannels).
Readers call ``get``/``snapshot`` (a dict that is replaced, never mutated, so reads need no lock) and may
``subscribe`` to be told of every change. Brokers, KafkaSinks and (with authentication on) EventPolicies are kept
the same way, from the same file or API server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kafka_eventing.core import brokers as kb
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core import sinks as ks
from kafka_eventing.core.channels import (
    GROUP,
    PLURAL,
    Channel,
    ChannelKey,
    ChannelSpecError,
    channel_from_resource,
    load_channels_file,
)
from kafka_eventing.core.settings import Settings, SettingsError

if TYPE_CHECKING:
    from kafka_eventing.core.informer import Informer

VERSION = "v1beta1"

log = logging.getLogger(__name__)

Snapshot = dict[ChannelKey, Channel]
Callback = Callable[[Snapshot], None]


class ChannelSource(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool: ...
    def get(self, key: ChannelKey) -> Channel | None: ...
    def snapshot(self) -> dict[ChannelKey, Channel]: ...
    def subscribe(self, callback: Callable[[dict[ChannelKey, Channel]], None]) -> None: ...


class SnapshotCache:
    """What every ``ChannelSource`` holds, whatever it reads (files or the API; channels, Brokers, sinks, policies
    here; a Broker's Triggers and KafkaSources in the dispatcher's ``triggers.py`` and ``sources.py``): a
    copy-on-write snapshot, a sync flag, change callbacks."""

    def __init__(self) -> None:
        self._channels: Snapshot = {}
        self._synced = threading.Event()
        self._callbacks: list[Callback] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def get(self, key: ChannelKey) -> Channel | None:
        return self._channels.get(key)

    def snapshot(self) -> Snapshot:
        return dict(self._channels)

    def subscribe(self, callback: Callback) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def _publish(self, channels: Snapshot) -> None:
        """Install a new set; tell subscribers only when something changed (or on the first sync)."""
        first = not self._synced.is_set()
        changed = channels != self._channels
        self._channels = channels
        self._synced.set()
        if not (changed or first):
            return
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(dict(channels))
            except Exception:  # one bad subscriber must not stop the watch
                log.exception("channel subscriber callback failed")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    def _join(self, timeout: float) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None


class NoChannels(SnapshotCache):
    """The channels of a receiver that serves none (a KafkaNamespaced data plane's, ``KE_RECEIVER_NAMESPACE``):
    synced and empty from the start, so every channel host is a 404 and nothing is listed."""

    def start(self) -> None:
        self._publish({})

    def stop(self) -> None:
        return


class FileChannelSource(SnapshotCache):
    """KafkaChannels from a YAML file, reloaded when its mtime or size changes.

    A file that cannot be read or parsed keeps the last good set (and logs why); until a first good read the
    source is not synced, so readiness fails rather than serving an empty set by mistake.
    """

    def __init__(self, path: Path, settings: Settings, poll_interval: float = 1.0) -> None:
        super().__init__()
        self.path = Path(path)
        self.settings = settings
        self.poll_interval = poll_interval
        self._stamp: tuple[int, int, int] | None = None

    def start(self) -> None:
        self._reload()  # synchronous first read: a worker is ready as soon as start() returns
        self._spawn(self._run, f"channels-file:{self.path.name}")

    def stop(self) -> None:
        self._join(timeout=self.poll_interval + 1.0)

    def _run(self) -> None:
        while not self._stopping.wait(self.poll_interval):
            self._reload()

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except OSError as exc:
            if self._stamp != (-1, -1, -1):
                log.error("channels file unreadable, keeping the last good set",
                          extra={"path": str(self.path), "error": str(exc)})
                self._stamp = (-1, -1, -1)
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            channels = self._load()
        except (ChannelSpecError, OSError, AttributeError, TypeError, ValueError) as exc:
            # AttributeError/TypeError: YAML that parses but is not a mapping of documents.
            log.error("channels file rejected, keeping the last good set",
                      extra={"path": str(self.path), "error": str(exc)})
            return
        log.info("channels loaded", extra={"path": str(self.path), "channels": len(channels)})
        self._publish(channels)

    def _load(self) -> Snapshot:
        return load_channels_file(self.path, self.settings)


def documents(path: Path) -> list[Mapping[str, Any]]:
    """Every object of a YAML file (multi-document, ``kind: List`` items flattened)."""
    import yaml

    with path.open() as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    return [item for d in docs for item in (d.get("items", []) if d.get("kind") == "List" else [d])]


class FileBrokerSource(FileChannelSource):
    """Kafka-class Brokers from the same YAML file as the channels (standalone mode: no controller, so a Broker
    without status is ready and its topic is made by whoever wrote the file)."""

    def _load(self) -> Snapshot:
        out: Snapshot = {}
        for doc in documents(self.path):
            if doc.get("kind") == "Broker" and kb.served_by(doc, self.settings.receiver_namespace) \
                    and (broker := kb.broker_ingress(doc, reconciled=False)) is not None:
                out[broker.key] = broker
        return out


class FileSinkSource(FileChannelSource):
    """KafkaSinks from the same YAML file (standalone mode: ready unless their status says otherwise)."""

    def _load(self) -> Snapshot:
        out: Snapshot = {}
        for doc in documents(self.path):
            if doc.get("kind") == ks.KIND and (sink := ks.sink_ingress(doc, reconciled=False)) is not None:
                out[sink.key] = sink
        return out


class KubeChannelSource(SnapshotCache):
    """KafkaChannels from the API server, through the shared ``Informer`` (``core/informer.py``).

    The informer lists, watches from the list's resourceVersion, lists again on 410 Gone, and reconnects with
    capped, jittered backoff, each watch bounded by a server-side and a client-side timeout. This class turns
    its cache into the channel snapshot: rebuilt whole after every (re)list, so subscribers never see a
    half-listed set, and patched per watch event. A channel whose spec is invalid is kept out.
    """

    #: (group, version, plural) watched; ``_channel`` turns each object into what the data plane uses.
    resource = (GROUP, VERSION, PLURAL)

    def __init__(
        self,
        api_client: Any,
        settings: Settings,
        namespace: str | None = None,
        name: str | None = None,
        *,
        watch_timeout_seconds: int = 240,
        max_backoff_seconds: float = 30.0,
    ) -> None:
        super().__init__()
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.settings = settings
        self.namespace = namespace
        self.name = name
        self.watch_timeout_seconds = watch_timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.informer: Informer | None = None
        # resourceVersion of each object the snapshot reflects (rejected ones too): the informer reports every
        # listed object again after on_list, and those must not be parsed (and logged) twice.
        self._versions: dict[ChannelKey, str] = {}

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        # Imported here: the kubernetes client takes seconds to import, and file mode never needs it.
        from kafka_eventing.core.informer import Informer

        if self.informer is None:  # built at start, not in __init__, so the API object can still be swapped
            group, version, plural = self.resource
            kwargs: dict[str, Any] = {"group": group, "version": version, "plural": plural}
            if self.name:
                kwargs["field_selector"] = f"metadata.name={self.name}"
            if self.namespace:
                func = self.api.list_namespaced_custom_object
                kwargs["namespace"] = self.namespace
            else:
                func = self.api.list_cluster_custom_object
            self.informer = Informer(
                plural, func, self._on_event, on_list=self._on_list,
                watch_timeout_seconds=self.watch_timeout_seconds, max_backoff_seconds=self.max_backoff_seconds,
                **kwargs)
        self.informer.start()

    def stop(self) -> None:
        if self.informer is not None:
            self.informer.stop()

    # -- informer cache -> channel snapshot ---------------------------------------------------------
    def _channel(self, obj: Mapping[str, Any]) -> Channel | None:
        try:
            return channel_from_resource(obj, self.settings, reconciled=True)
        except ChannelSpecError as exc:
            meta = obj.get("metadata") or {}
            log.error("KafkaChannel rejected", extra={
                "namespace": meta.get("namespace"), "channel": meta.get("name"), "error": str(exc)})
            return None

    @staticmethod
    def _key_version(obj: Mapping[str, Any]) -> tuple[ChannelKey, str]:
        meta = obj.get("metadata") or {}
        return (meta.get("namespace") or "default", meta.get("name") or ""), str(meta.get("resourceVersion") or "")

    def _on_list(self) -> None:
        assert self.informer is not None
        channels: Snapshot = {}
        self._versions = {}
        for obj in self.informer.items():
            key, version = self._key_version(obj)
            self._versions[key] = version
            channel = self._channel(obj)
            if channel is not None:
                channels[channel.key] = channel
        log.info("listed", extra={"resource": self.resource[2], "objects": len(channels)})
        self._publish(channels)

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        key, version = self._key_version(obj)
        if kind == "DELETED":
            if self._versions.pop(key, None) is None:
                return  # gone in a relist: _on_list already left it out
            channel = None
        else:
            if self._versions.get(key) == version:
                return  # already in the snapshot (an object reported again after a list)
            self._versions[key] = version
            channel = self._channel(obj)
        channels = dict(self._channels)
        if channel is None:
            channels.pop(key, None)
        else:
            channels[key] = channel
        self._publish(channels)


class KubeBrokerSource(KubeChannelSource):
    """Brokers as ingress targets (``core.brokers.broker_ingress``), watched like KafkaChannels: those the receiver
    serves (``core.brokers.served_by``) — the shared receiver's Kafka-class Brokers of every namespace, or a
    namespaced receiver's KafkaNamespaced Brokers of its own (``KE_RECEIVER_NAMESPACE``; it lists only there)."""

    resource = (kb.GROUP, kb.VERSION, kb.BROKERS)

    def _channel(self, obj: Mapping[str, Any]) -> Channel | None:
        return kb.broker_ingress(obj) if kb.served_by(obj, self.settings.receiver_namespace) else None


class KubeSinkSource(KubeChannelSource):
    """KafkaSinks as ingress targets (``core.sinks.sink_ingress``), watched like KafkaChannels."""

    resource = (ks.GROUP, ks.VERSION, ks.PLURAL)

    def _channel(self, obj: Mapping[str, Any]) -> Channel | None:
        return ks.sink_ingress(obj)


def _served(api_client: Any, group: str, version: str, plural: str) -> bool:
    # Imported only here: the kubernetes client costs ~50 MB in each receiver worker that runs from a file.
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    try:
        found = client.CustomObjectsApi(api_client).get_api_resources(group, version)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return plural in {r.name for r in found.resources or ()}


def broker_source(settings: Settings, api_client: Any) -> ChannelSource | None:
    """The Broker source when the API server serves Brokers (Knative's CRD or ours), else None."""
    if settings.channel_source != "kube":
        return FileBrokerSource(settings.channels_file, settings) if settings.channels_file else None
    if not _served(api_client, kb.GROUP, kb.VERSION, kb.BROKERS):
        return None
    return KubeBrokerSource(api_client, settings, namespace=settings.receiver_namespace or None)


def sink_source(settings: Settings, api_client: Any) -> ChannelSource | None:
    """The KafkaSink source when the API server serves KafkaSinks (upstream's CRD or ours), else None; None for a
    namespaced receiver too (``KE_RECEIVER_NAMESPACE``: it serves KafkaNamespaced Brokers only)."""
    if settings.receiver_namespace:
        return None
    if settings.channel_source != "kube":
        return FileSinkSource(settings.channels_file, settings) if settings.channels_file else None
    return KubeSinkSource(api_client, settings) if _served(api_client, ks.GROUP, ks.VERSION, ks.PLURAL) else None


def channel_source_from_settings(settings: Settings, api_client: Any = None) -> ChannelSource:
    """The source ``settings.channel_source`` names: ``file`` (``channels_file``) or ``kube``.

    The dispatcher's settings name one channel (``channel_namespace``/``channel_name``): the kube source
    then watches just that one.
    """
    if settings.channel_source == "file":
        if settings.channels_file is None:
            raise SettingsError("KE_CHANNEL_SOURCE=file needs KE_CHANNELS_FILE")
        return FileChannelSource(settings.channels_file, settings)
    # ChannelSourceKind.KUBE (Settings refuses any other value)
    if settings.receiver_namespace:
        return NoChannels()
    if api_client is None:
        from kafka_eventing.core.kube import api_client as build_api_client

        api_client = build_api_client(settings.kubeconfig)
    return KubeChannelSource(
        api_client, settings,
        namespace=settings.channel_namespace or None, name=settings.channel_name or None,
    )


# -- EventPolicies: who may send to the targets above (core.eventpolicies) ----------------------------------
PolicySnapshot = dict[tuple[str, str], ep.Policy]


class PolicySource(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool: ...
    def policies(self) -> PolicySnapshot: ...


class FilePolicySource(FileChannelSource):
    """EventPolicies from the same YAML file (standalone mode: ``status.from`` as written, no controller)."""

    def policies(self) -> PolicySnapshot:
        return self._channels  # type: ignore[return-value]

    def _load(self) -> Snapshot:
        return ep.parse_documents([d for d in documents(self.path)])  # type: ignore[return-value]


class KubePolicySource(KubeChannelSource):
    """EventPolicies in every namespace, watched like KafkaChannels (list and watch on eventpolicies). A policy
    that cannot be parsed applies to its whole namespace and allows no one; the controller says why on its
    status."""

    resource = (ep.GROUP, ep.VERSION, ep.PLURAL)

    def policies(self) -> PolicySnapshot:
        return self._channels  # type: ignore[return-value]

    def _channel(self, obj: Mapping[str, Any]) -> Any:
        policy = ep.policy_or_invalid(obj)
        if policy.problem:
            log.error("EventPolicy cannot be used: it allows no one", extra={"error": policy.problem})
        return policy


def policy_source(settings: Settings, api_client: Any) -> PolicySource | None:
    """Where EventPolicies come from: with authentication off, nowhere (a policy names token subjects); else the
    channels file, or the API server when it serves the EventPolicy CRD (Knative's or the chart's)."""
    if not settings.auth_issuer:
        return None
    if settings.channel_source != "kube":
        return FilePolicySource(settings.channels_file, settings) if settings.channels_file else None
    if not _served(api_client, ep.GROUP, ep.VERSION, ep.PLURAL):
        return None
    return KubePolicySource(api_client, settings, namespace=settings.receiver_namespace or None)
