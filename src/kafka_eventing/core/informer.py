"""List-then-watch caches of API objects (plain dicts), resumable from ``resourceVersion``.

The one list/watch loop of the project: the controller's caches and the receiver's and dispatcher's
KafkaChannel source (``core/channel_source.py``) both run on it. A watch that ends (server timeout) resumes from
the last seen ``resourceVersion`` — BOOKMARK events keep it fresh; a 410 Gone lists again and reports every
object as changed, so nothing is missed; other failures reconnect with capped, jittered backoff. Each request
has a server-side ``timeout_seconds`` and a client-side read timeout past it, so a peer that vanished silently
cannot stall the cache. It only lists and watches: ``list`` + ``watch`` RBAC on the resource is all it needs.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import watch
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

HTTP_GONE = 410
ObjKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
#: (event type ADDED/MODIFIED/DELETED/RELISTED, object) — RELISTED after a 410, for every object listed.
Handler = Callable[[str, Mapping[str, Any]], None]
#: Called once per (re)list, when the cache already holds the whole listed set and before the per-object events.
ListHandler = Callable[[], None]


class Store(Protocol):
    """Read side of a cache: what reconcilers depend on (an Informer, or a dict-backed fake in unit tests)."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
    def items(self) -> list[Mapping[str, Any]]: ...


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop managedFields: often half of an object's size, and nothing here reads them."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class _DictWatch(watch.Watch):  # type: ignore[misc]  # kubernetes ships no type hints
    """A Watch whose events carry the objects as plain dicts, parsed once.

    Not ``stream(..., deserialize=False)``: that path reads ``event["raw_object"]`` of an ERROR event, which it
    never set, so a 410 Gone surfaced as KeyError and the watch retried the expired resourceVersion forever.
    The default path builds model objects (or, with ``return_type="object"``, parses every event twice).
    """

    def unmarshal_event(self, data: str, return_type: Any) -> dict[str, Any] | None:
        if not data or data.isspace():
            return None
        event: dict[str, Any] = json.loads(data)
        event["raw_object"] = event.get("object")
        return event


def obj_key(obj: Mapping[str, Any]) -> ObjKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Informer:
    def __init__(
        self,
        name: str,
        list_func: Callable[..., Any],
        handler: Handler | None = None,
        *,
        on_list: ListHandler | None = None,
        watch_timeout_seconds: int = 240,
        max_backoff_seconds: float = 30.0,
        **list_kwargs: Any,
    ) -> None:
        self.name = name
        self.list_func = list_func
        self.list_kwargs = list_kwargs
        self.handler = handler
        self.on_list = on_list
        self.watch_timeout_seconds = watch_timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._cache: dict[ObjKey, Mapping[str, Any]] = {}
        self._resource_version: str | None = None
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self.relists = 0

    # -- reads --------------------------------------------------------------------------------------
    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._cache.get((namespace, name))

    def items(self) -> list[Mapping[str, Any]]:
        return list(self._cache.values())

    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer:{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)
            if resp is not None:  # shut the socket so a blocked read returns now
                try:
                    resp.shutdown()
                except Exception as exc:  # already closed: nothing to interrupt
                    log.debug("watch socket already closed", extra={"error": str(exc)})
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    # -- list + watch -------------------------------------------------------------------------------
    def _notify(self, kind: str, obj: Mapping[str, Any]) -> None:
        if self.handler is not None:
            self._call(self.handler, kind, obj)

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:  # a bad handler must not stop the watch
            log.exception("informer handler failed", extra={"informer": self.name})

    def _list(self) -> None:
        resp = self.list_func(**self.list_kwargs, _preload_content=False, _request_timeout=(10, 60))
        body = json.loads(resp.data)
        listed: dict[ObjKey, Mapping[str, Any]] = {}
        for item in body.get("items") or ():
            listed[obj_key(item)] = _slim(item)
        gone = [obj for key, obj in self._cache.items() if key not in listed]
        first = not self._synced.is_set()
        self._cache = listed
        self._resource_version = (body.get("metadata") or {}).get("resourceVersion")
        self._synced.set()
        if self.on_list is not None:
            self._call(self.on_list)
        for obj in gone:
            self._notify("DELETED", obj)
        for obj in listed.values():
            self._notify("ADDED" if first else "RELISTED", obj)

    def _watch_once(self) -> None:
        self._watch = w = _DictWatch()
        try:
            for event in w.stream(
                self.list_func, **self.list_kwargs, resource_version=self._resource_version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_seconds,
                _request_timeout=(10, self.watch_timeout_seconds + 30),
            ):
                if self._stopping.is_set():
                    break
                kind, obj = event.get("type"), _slim(event.get("raw_object") or {})
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self._resource_version = rv
                if kind == "DELETED":
                    self._cache.pop(obj_key(obj), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._cache[obj_key(obj)] = obj
                else:
                    continue  # BOOKMARK only moves the resourceVersion
                self._notify(str(kind), obj)
        finally:
            self._watch = None

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list()
                self._watch_once()
                failures = 0
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    log.info("watch expired (410 Gone), listing again", extra={"informer": self.name})
                    self._resource_version = None
                    self.relists += 1
                    continue
                failures += 1
                log.warning("watch failed", extra={"informer": self.name, "status": exc.status, "reason": exc.reason})
            except Exception as exc:
                if self._stopping.is_set():
                    break
                failures += 1
                log.warning("watch failed", extra={"informer": self.name, "error": f"{type(exc).__name__}: {exc}"})
            if failures:
                delay = min(self.max_backoff_seconds, 0.25 * 2 ** min(failures, 10))
                self._stopping.wait(delay * random.uniform(0.5, 1.0))


class NamedWatches:
    """Watches of single named objects (a ``metadata.name`` field selector each), started when first wanted and
    stopped when no longer: for objects that other resources name in any namespace (a Broker's ConfigMap), so a
    change is seen at once without caching every object of the kind in the cluster.

    ``handler`` gets every event of every watched object; ``get`` reads the watched objects' caches.
    """

    def __init__(self, name: str, list_func: Callable[..., Any], handler: Handler,
                 **informer_kwargs: Any) -> None:
        self.name, self.list_func, self.handler = name, list_func, handler
        self.informer_kwargs = informer_kwargs
        self._informers: dict[ObjKey, Informer] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def want(self, keys: set[ObjKey]) -> None:
        """Watch exactly ``keys`` (namespace, name): start the new ones, stop the ones no longer wanted."""
        with self._lock:
            if self._stopped:
                return
            started = {key: Informer(f"{self.name}:{key[0]}/{key[1]}", self.list_func, self.handler,
                                     namespace=key[0], field_selector=f"metadata.name={key[1]}",
                                     **self.informer_kwargs)
                       for key in keys - self._informers.keys()}
            retired = [self._informers.pop(key) for key in self._informers.keys() - keys]
            self._informers.update(started)
        for informer in started.values():
            informer.start()
        for informer in retired:
            informer.stop()

    def watched(self) -> set[ObjKey]:
        with self._lock:
            return set(self._informers)

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        with self._lock:
            informer = self._informers.get((namespace, name))
        return informer.get(namespace, name) if informer is not None else None

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            informers, self._informers = list(self._informers.values()), {}
        for informer in informers:
            informer.stop()
