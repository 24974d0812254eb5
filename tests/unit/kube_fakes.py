"""Fakes of the kubernetes client's custom-object calls, for unit tests of ``core/informer.py`` and its users and
of the controller's direct reads and writes (``controller.api.CustomObjects``).

List and watch answer as the generated client does with ``_preload_content=False``: a list is a response whose
``data`` is the JSON body, a watch is a stream of JSON lines. The real apiserver is in tests/integration.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException

Obj = dict[str, object]


class FakeListResponse:
    def __init__(self, body: Obj) -> None:
        self.data = json.dumps(body).encode()


class FakeWatchResponse:
    """What the client returns for ``watch=True, _preload_content=False``: a line stream."""

    def __init__(self, events: list[Obj]) -> None:
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]

    def stream(self, amt: object = None, decode_content: object = None) -> Iterator[bytes]:
        yield from self.lines

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def kube_obj(name: str, rv: str, namespace: str = "ns", extra: Obj | None = None) -> Obj:
    return {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv, **(extra or {})}}


def gone() -> Obj:
    """The ERROR event an apiserver sends when the watch's resourceVersion has been compacted away."""
    return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}


class FakeCustomObjects:
    """Serves scripted lists (the last one again once the script runs out), then scripted watch streams, then
    empty ones; records the arguments of every call.

    get/create/patch/delete of single objects work on ``objects`` (keyed by plural, namespace, name) and are
    logged in ``writes``. ``served`` lists the plurals discovery reports per ``group/version``: one not in it
    answers 404, as an API server without the CRDs does; ``discoveries`` counts the asks. An exception in
    ``errors`` under a method's name is raised by every call of that method."""

    def __init__(self, lists: list[Obj] | None = None, watches: list[list[Obj]] | None = None,
                 served: Mapping[str, list[str]] | None = None) -> None:
        empty: Obj = {"metadata": {"resourceVersion": "1"}, "items": []}
        self.lists = lists if lists is not None else [empty]
        self.watches = watches if watches is not None else []
        self.calls: list[dict[str, object]] = []
        self.served = dict(served or {})
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []  # (verb, plural, name)
        self.errors: dict[str, ApiException] = {}
        self.discoveries = 0

    def list_namespaced_custom_object(self, **kwargs: object) -> FakeListResponse | FakeWatchResponse:
        """List, or watch with ``watch=True``."""
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            if not self.watches:
                time.sleep(0.05)
                return FakeWatchResponse([])
            return FakeWatchResponse(self.watches.pop(0))
        return FakeListResponse(self.lists.pop(0) if len(self.lists) > 1 else self.lists[0])

    def list_calls(self) -> list[dict[str, object]]:
        return [c for c in self.calls if not c.get("watch")]

    def watch_calls(self) -> list[dict[str, object]]:
        return [c for c in self.calls if c.get("watch")]

    def _fail(self, method: str) -> None:
        if method in self.errors:
            raise self.errors[method]

    def get_api_resources(self, group: str, version: str, **_kw: object) -> SimpleNamespace:
        self.discoveries += 1
        self._fail("get_api_resources")
        if f"{group}/{version}" not in self.served:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(resources=[SimpleNamespace(name=p) for p in self.served[f"{group}/{version}"]])

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                     **_kw: object) -> dict[str, Any]:
        self._fail("get_namespaced_custom_object")
        if (plural, namespace, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        return self.objects[plural, namespace, name]

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                        body: Mapping[str, Any], **_kw: object) -> None:
        self._fail("create_namespaced_custom_object")
        name = body["metadata"]["name"]
        if (plural, namespace, name) in self.objects:
            raise ApiException(status=409, reason="Conflict")
        self.objects[plural, namespace, name] = json.loads(json.dumps(body))
        self.writes.append(("create", plural, name))

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                       body: Mapping[str, Any], **_kw: object) -> None:
        """A merge patch of the metadata maps and a replaced spec: what ``controller.api.Writer`` sends."""
        self._fail("patch_namespaced_custom_object")
        live = self.get_namespaced_custom_object(group, version, namespace, plural, name)
        for key, value in (body.get("metadata") or {}).items():
            live["metadata"][key] = {**(live["metadata"].get(key) or {}), **value}
        if "spec" in body:
            live["spec"] = json.loads(json.dumps(body["spec"]))
        self.writes.append(("patch", plural, name))

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                        **_kw: object) -> None:
        self._fail("delete_namespaced_custom_object")
        if self.objects.pop((plural, namespace, name), None) is None:
            raise ApiException(status=404, reason="Not Found")
        self.writes.append(("delete", plural, name))
