"""The set of KafkaChannels and their readiness, kept current in the background, for receiver and dispatcher.

Two sources share one interface (``ChannelSource``): ``FileChannelSource`` polls a YAML file of KafkaChannel
documents (standalone mode) and ``KubeChannelSource`` lists and watches the KafkaChannel custom resources.
Readers call ``get``/``snapshot`` (a dict that is replaced, never mutated, so reads need no lock) and may
``subscribe`` to be told of every change.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

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

VERSION = "v1beta1"
HTTP_GONE = 410

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


class _Cache:
    """Snapshot holder shared by both sources: copy-on-write dict, sync flag, change callbacks."""

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


class FileChannelSource(_Cache):
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
            channels = load_channels_file(self.path, self.settings)
        except (ChannelSpecError, OSError, AttributeError, TypeError, ValueError) as exc:
            # AttributeError/TypeError: YAML that parses but is not a mapping of documents.
            log.error("channels file rejected, keeping the last good set",
                      extra={"path": str(self.path), "error": str(exc)})
            return
        log.info("channels loaded", extra={"path": str(self.path), "channels": len(channels)})
        self._publish(channels)


class KubeChannelSource(_Cache):
    """KafkaChannels from the API server: list, then watch from the list's resourceVersion.

    A 410 Gone (history compacted) means list again; any other failure reconnects with capped, jittered
    backoff. Both a server-side ``timeout_seconds`` and a client-side ``_request_timeout`` bound each watch,
    so a silently dead connection cannot stall the cache. A channel whose spec is invalid is kept out.
    """

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
        self._watch: Any = None
        self._resource_version: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._spawn(self._run, "channels-kube")

    def stop(self) -> None:
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.stop()  # shuts the socket, so a blocked read returns now
        self._join(timeout=5.0)

    # -- list + watch -------------------------------------------------------------------------------
    def _call_args(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL}
        if self.name:
            kwargs["field_selector"] = f"metadata.name={self.name}"
        if self.namespace:
            return self.api.list_namespaced_custom_object, {**kwargs, "namespace": self.namespace}
        return self.api.list_cluster_custom_object, kwargs

    def _channel(self, obj: Mapping[str, Any]) -> Channel | None:
        try:
            return channel_from_resource(obj, self.settings)
        except ChannelSpecError as exc:
            meta = obj.get("metadata") or {}
            log.error("KafkaChannel rejected", extra={
                "namespace": meta.get("namespace"), "channel": meta.get("name"), "error": str(exc)})
            return None

    def _list(self) -> None:
        func, kwargs = self._call_args()
        result = func(**kwargs, _request_timeout=(10, 30))
        channels: Snapshot = {}
        for item in result.get("items") or ():
            channel = self._channel(item)
            if channel is not None:
                channels[channel.key] = channel
        self._resource_version = (result.get("metadata") or {}).get("resourceVersion")
        log.info("KafkaChannels listed", extra={"channels": len(channels)})
        self._publish(channels)

    def _watch_once(self) -> None:
        from kubernetes import watch

        func, kwargs = self._call_args()
        self._watch = w = watch.Watch()
        try:
            stream = w.stream(
                func, **kwargs, resource_version=self._resource_version, allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds,
                # connect timeout, and a read timeout past the server's, for a peer that vanished silently
                _request_timeout=(10, self.watch_timeout_seconds + 30),
            )
            for event in stream:
                if self._stopping.is_set():
                    break
                raw = event["raw_object"]
                self._apply(event["type"], raw)
                version = (raw.get("metadata") or {}).get("resourceVersion")
                if version:  # bookmarks carry one too
                    self._resource_version = version
        finally:
            self._watch = None

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK only moves the resourceVersion
        meta = obj.get("metadata") or {}
        key: ChannelKey = (meta.get("namespace") or "default", meta.get("name") or "")
        channels = dict(self._channels)
        channel = self._channel(obj) if kind != "DELETED" else None
        if channel is None:
            channels.pop(key, None)
        else:
            channels[key] = channel
        self._publish(channels)

    def _run(self) -> None:
        from kubernetes.client.rest import ApiException

        failures = 0
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list()
                self._watch_once()
                failures = 0
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    log.info("KafkaChannel watch expired (410 Gone), listing again")
                    self._resource_version = None
                    continue
                failures += 1
                log.warning("KafkaChannel watch failed", extra={"status": exc.status, "reason": exc.reason})
            except Exception as exc:
                if self._stopping.is_set():
                    break
                failures += 1
                log.warning("KafkaChannel watch failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            if failures:
                delay = min(self.max_backoff_seconds, 0.5 * 2 ** min(failures, 10))
                self._stopping.wait(delay * random.uniform(0.5, 1.0))


def channel_source_from_settings(settings: Settings, api_client: Any = None) -> ChannelSource:
    """The source ``settings.channel_source`` names: ``file`` (``channels_file``) or ``kube``.

    The dispatcher's settings name one channel (``channel_namespace``/``channel_name``): the kube source
    then watches just that one.
    """
    if settings.channel_source == "file":
        if settings.channels_file is None:
            raise SettingsError("KE_CHANNEL_SOURCE=file needs KE_CHANNELS_FILE")
        return FileChannelSource(settings.channels_file, settings)
    if settings.channel_source == "kube":
        if api_client is None:
            from kubernetes import client, config

            if settings.kubeconfig is not None:
                api_client = config.new_client_from_config(config_file=str(settings.kubeconfig))
            else:
                config.load_incluster_config()
                api_client = client.ApiClient()
        return KubeChannelSource(
            api_client, settings,
            namespace=settings.channel_namespace or None, name=settings.channel_name or None,
        )
    raise SettingsError(f"KE_CHANNEL_SOURCE={settings.channel_source!r} must be 'file' or 'kube'")
