"""What a resource waits for, watched by name: a Trigger's subscriber, a KafkaSource's sink, a dead-letter sink or a
``knative.dev/dependency`` that does not exist yet (or has no address, or is not Ready) reconciles the resources
waiting for it the moment it appears or changes, not at the next recheck.

A kind says which refs one of its objects waits for (``waiting``, read from the object's own status: the
conditions its reconcile wrote, see ``waiting_for``). While at least one object waits for a ref, that one object
is watched (``core.informer.NamedWatches``: a ``metadata.name`` field selector in its namespace; a core Service
through ``CoreV1Api``, any other kind through ``CustomObjectsApi`` with the ref's group, version and plural); its
events enqueue the objects waiting for it, and once none does, its watch stops. A resource whose refs all resolve
costs no watch, so the API server holds one watch per missing dependency, never one per resource.

RBAC: what the controller resolves it may list and watch too (``controller.rbac.readableKinds`` renders get, list
and watch; core Services are in the base rule). A ref the controller may not read at all (``…Forbidden``) is not
watched — the watch would be refused and retried forever; the reconcile's recheck is then the (bounded) fallback,
and the condition names the chart value to extend. Where a hand-made ClusterRole grants get but not list/watch, the
refused watch retries with the informer's backoff (capped at 30 s, one request each) and the recheck still
reconciles the resource: slower, never a loop.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kafka_eventing.controller.conditions import DEAD_LETTER_SINK_RESOLVED
from kafka_eventing.controller.host import RESYNC, Host, namespace_of
from kafka_eventing.core.conditions import find
from kafka_eventing.core.informer import NamedWatches, ObjKey, obj_key

log = logging.getLogger(__name__)

#: (apiVersion, kind, namespace, name) of a referenced object
Ref = tuple[str, str, str, str]
#: (apiVersion, kind): one NamedWatches each
Gvk = tuple[str, str]

#: Condition reasons that mean "the ref's object is missing, unaddressable or not Ready yet" — an event of that object
#: can change the outcome. Not "…Forbidden" (a watch would be refused too) nor an invalid ref (a spec change fixes it).
WAITING_REASONS = frozenset({
    "DestinationNotFound", "DestinationNotAddressable",  # resolve_address
    "DeadLetterSinkUnresolved", "DeadLetterSinkNotAddressable",  # Reconciler.dead_letter_sink
    "DependencyDoesNotExist", "DependencyNotReady",  # a Trigger's knative.dev/dependency
})


def ref_of(destination: Mapping[str, Any] | None, default_namespace: str) -> Ref | None:
    """The object a Destination (``{ref: {apiVersion, kind, name, namespace}}``) or a plain reference names."""
    if not isinstance(destination, Mapping):
        return None
    target = destination.get("ref") if "ref" in destination else destination
    if not isinstance(target, Mapping):
        return None
    kind, name = target.get("kind"), target.get("name")
    if not kind or not name:
        return None
    return (str(target.get("apiVersion") or "v1"), str(kind), str(target.get("namespace") or default_namespace),
            str(name))


def annotated_ref(raw: str | None, default_namespace: str) -> Ref | None:
    """The reference a JSON annotation (``knative.dev/dependency``) names, None when it does not parse."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return ref_of(value, default_namespace) if isinstance(value, Mapping) else None


def waiting_for(obj: Mapping[str, Any], condition: str, ref: Ref | None) -> set[Ref]:
    """``{ref}`` when ``obj``'s ``condition`` says its object is missing or not ready yet, else nothing."""
    if ref is None:
        return set()
    found = find((obj.get("status") or {}).get("conditions"), condition) or {}
    return {ref} if found.get("status") == "False" and found.get("reason") in WAITING_REASONS else set()


def dead_letter_sink_waits(obj: Mapping[str, Any]) -> set[Ref]:
    """``spec.delivery.deadLetterSink``'s ref while ``DeadLetterSinkResolved`` says it is missing (every kind with a
    ``delivery``: channels, Brokers, Triggers, KafkaSources)."""
    sink = ((obj.get("spec") or {}).get("delivery") or {}).get("deadLetterSink")
    return waiting_for(obj, DEAD_LETTER_SINK_RESOLVED, ref_of(sink, namespace_of(obj)))


class Dependencies:
    """The refs the objects of one kind wait for, each watched by name while one does."""

    def __init__(self, host: Host, kind: str, waiting: Callable[[Mapping[str, Any]], Iterable[Ref]]) -> None:
        self.host, self.kind, self.waiting = host, kind, waiting
        self._lock = threading.Lock()
        self._waits: dict[ObjKey, frozenset[Ref]] = {}  # object of ``kind`` → the refs it waits for
        self._watches: dict[Gvk, NamedWatches] = {}
        self._stopped = False

    # -- events of the kind's own objects ------------------------------------------------------------------
    def on_object(self, event: str, obj: Mapping[str, Any]) -> None:
        if event == RESYNC:
            return  # the cache did not change: neither did what anything waits for
        key = obj_key(obj)
        refs = frozenset() if event == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp") \
            else frozenset(ref for ref in self.waiting(obj) if _watchable(ref))
        with self._lock:
            before = self._waits.get(key, frozenset())
            if refs == before:
                return
            if refs:
                self._waits[key] = refs
            else:
                self._waits.pop(key, None)
            changed = {ref[:2] for ref in before ^ refs}
            wanted = {gvk: {(ns, name) for waits in self._waits.values() for (av, k, ns, name) in waits
                            if (av, k) == gvk} for gvk in changed}
        # Already watched for another object and already there: its event may have come before this object waited
        # for it (created between this object's read and its status write), so look again now. A watch started
        # here enqueues it from its first listing instead.
        there = any(self._named(ref[:2]).get(*ref[2:]) is not None for ref in refs - before)
        for gvk, keys in wanted.items():
            self._named(gvk).want(keys)
        if there:
            self.host.enqueue(self.kind, *key)

    # -- events of the watched objects ---------------------------------------------------------------------
    def _on_dependency(self, gvk: Gvk) -> Callable[[str, Mapping[str, Any]], None]:
        def handler(event: str, dependency: Mapping[str, Any]) -> None:
            namespace, name = obj_key(dependency)
            ref = (*gvk, namespace, name)
            with self._lock:
                waiting = [key for key, refs in self._waits.items() if ref in refs]
            for obj_namespace, obj_name in waiting:
                self.host.enqueue(self.kind, obj_namespace, obj_name)

        return handler

    def _named(self, gvk: Gvk) -> NamedWatches:
        with self._lock:
            found = self._watches.get(gvk)
            if found is None:
                api_version, kind = gvk
                opts = {"watch_timeout_seconds": self.host.options.watch_timeout_seconds}
                name = f"{self.kind.lower()}-waits-for-{kind.lower()}"
                if api_version == "v1":  # only Services are resolved in the core group (_watchable)
                    found = NamedWatches(name, self.host.base.core.list_namespaced_service,
                                         self._on_dependency(gvk), **opts)
                else:
                    group, _, version = api_version.rpartition("/")
                    found = NamedWatches(name, self.host.base.custom.list_namespaced_custom_object,
                                         self._on_dependency(gvk), group=group, version=version,
                                         plural=f"{kind.lower()}s", **opts)
                if self._stopped:
                    found.stop()
                self._watches[gvk] = found
            return found

    def watched(self) -> set[Ref]:
        with self._lock:
            watches = dict(self._watches)
        return {(*gvk, ns, name) for gvk, named in watches.items() for ns, name in named.watched()}

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            watches = list(self._watches.values())
        for named in watches:
            named.stop()


def _watchable(ref: Ref) -> bool:
    """A ref the resolvers read: a core Service, or a kind of an API group (as ``resolve_address`` reads it)."""
    api_version, kind, _, _ = ref
    if api_version == "v1":
        return kind == "Service"
    group, _, version = api_version.rpartition("/")
    return bool(group and version)


def watch_dependencies(host: Host, kind: str, waiting: Callable[[Mapping[str, Any]], Iterable[Ref]]) -> Dependencies:
    """Watch what the objects of ``kind`` wait for (``waiting(obj)``, from the object as cached) while they do: an
    event of a watched object enqueues the objects of ``kind`` waiting for it."""
    dependencies = Dependencies(host, kind, waiting)
    host.on(kind, dependencies.on_object)
    host.stops(dependencies.stop)
    return dependencies
