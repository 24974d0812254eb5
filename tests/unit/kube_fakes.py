"""Fakes of the kubernetes client's list/watch calls, for unit tests of ``core/informer.py`` and its users.

They answer as the generated client does with ``_preload_content=False``: a list is a response whose ``data``
is the JSON body, a watch is a stream of JSON lines. The real apiserver is in tests/integration.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

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
    empty ones; records the arguments of every call."""

    def __init__(self, lists: list[Obj], watches: list[list[Obj]]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[dict[str, object]] = []

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
