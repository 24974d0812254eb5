"""What every write of the controller shares: the leadership check before it, create-or-merge-patch by desired-state
hash, custom objects read straight from the API, and API errors worded for a status condition."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import resources as res

MERGE_PATCH = "application/merge-patch+json"
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class LostLeadership(RuntimeError):
    """Raised before a write once this replica no longer holds the lease."""


class CustomObjects:
    """``get``/``create``/``patch``/``delete`` of one custom resource straight from the API (no cache: KEDA's CRDs
    may be absent, and an informer on a missing type would only log errors), shaped for ``Writer.apply``."""

    def __init__(self, api: client.CustomObjectsApi, group: str, version: str, plural: str) -> None:
        self.api, self.group, self.version, self.plural = api, group, version, plural

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return dict(self.api.get_namespaced_custom_object(self.group, self.version, namespace, self.plural,
                                                              name, _request_timeout=(5, 15)))
        except ApiException as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise

    def create(self, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.api.create_namespaced_custom_object(self.group, self.version, namespace, self.plural, body,
                                                        **kwargs)

    def patch(self, name: str, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
        return self.api.patch_namespaced_custom_object(self.group, self.version, namespace, self.plural, name,
                                                       body, **kwargs)

    def delete(self, name: str, namespace: str, **kwargs: Any) -> Any:
        return self.api.delete_namespaced_custom_object(self.group, self.version, namespace, self.plural, name,
                                                        **kwargs)


def api_error(exc: ApiException) -> str:
    """``<status> <the API server's message>`` — the message says which quota or admission rule refused."""
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f"{exc.status} {message or exc.reason}"


class Writer:
    """Writes made only while ``may_write()`` (this replica leads) and only when the desired object changed."""

    def __init__(self, may_write: Callable[[], bool]) -> None:
        self.may_write = may_write

    def check(self) -> None:
        if not self.may_write():
            raise LostLeadership

    def apply(self, store: Any, create: Any, patch: Any,
               desired: dict[str, Any]) -> tuple[Mapping[str, Any] | None, bool]:
        """Create or merge-patch ``desired``: (the cached live object or None, whether anything was written)."""
        ns, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        live = store.get(ns, name)
        if live is not None and not res.needs_update(live, desired):
            return live, False
        self.check()
        if live is None:
            try:
                create(ns, desired, _request_timeout=(5, 30), _preload_content=False)
                return None, True
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT:
                    raise
                # Created by an earlier attempt whose event has not reached the cache yet: update it.
        # ownerReferences only where the desired object has them (a merge patch replaces the whole list).
        body = {"metadata": {k: desired["metadata"][k] for k in ("labels", "annotations", "ownerReferences")
                             if k in desired["metadata"]}, "spec": desired["spec"]}
        patch(name, ns, body, _content_type=MERGE_PATCH, _request_timeout=(5, 30), _preload_content=False)
        return live, True

    def delete_quietly(self, api: CustomObjects, name: str, namespace: str) -> None:
        """Delete; already gone (or the resource type gone) counts as deleted."""
        self.check()
        try:
            api.delete(name, namespace, _request_timeout=(5, 30))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
