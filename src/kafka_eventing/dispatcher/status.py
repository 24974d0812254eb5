"""``status.subscribers[]`` of the KafkaChannel: built here, written through the status subresource.

A subscriber is ready once its consumer group has joined (first assignment); until then, or when it cannot
join, it is not ready with a message saying why. In file mode the same document is kept in memory only and
served at ``/status``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_eventing.core.channels import GROUP, PLURAL, ChannelKey

log = logging.getLogger(__name__)

VERSION = "v1beta1"


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    uid: str
    observed_generation: int
    ready: bool
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        # Knative's SubscriberStatus.ready is a ConditionStatus string, not a boolean.
        out: dict[str, Any] = {"uid": self.uid, "observedGeneration": self.observed_generation,
                               "ready": "True" if self.ready else "False"}
        if self.message:
            out["message"] = self.message
        return out


def build_status(statuses: Iterable[SubscriberStatus]) -> dict[str, Any]:
    """The merge-patch body; subscribers sorted by uid so that equal states give equal patches."""
    return {"status": {"subscribers": [s.as_dict() for s in sorted(statuses, key=lambda s: s.uid)]}}


class StatusWriter(Protocol):
    def write(self, key: ChannelKey, body: dict[str, Any]) -> None: ...


class MemoryStatusWriter:
    """File mode: nothing to write to; ``/status`` reads the board."""

    def __init__(self) -> None:
        self.last: dict[ChannelKey, dict[str, Any]] = {}

    def write(self, key: ChannelKey, body: dict[str, Any]) -> None:
        self.last[key] = body


class KubeStatusWriter:
    """Merge-patch of the KafkaChannel status subresource (a dict body makes the client send merge-patch)."""

    def __init__(self, api_client: Any, version: str = VERSION) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.version = version

    def write(self, key: ChannelKey, body: dict[str, Any]) -> None:
        namespace, name = key
        self.api.patch_namespaced_custom_object_status(
            GROUP, self.version, namespace, PLURAL, name, body, _request_timeout=(5, 15))


class StatusBoard:
    """Current subscriber statuses of one channel; changes are written in the background, coalesced.

    The write runs in a worker thread (the kube client blocks) and is retried on failure, so a slow or
    unavailable API server never stalls delivery.
    """

    def __init__(self, key: ChannelKey, writer: StatusWriter, retry_seconds: float = 2.0) -> None:
        self.key = key
        self.writer = writer
        self.retry_seconds = retry_seconds
        self._statuses: dict[str, SubscriberStatus] = {}
        self._written: dict[str, Any] | None = None
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def set(self, uid: str, generation: int, ready: bool, message: str = "") -> None:
        new = SubscriberStatus(uid, generation, ready, message)
        if self._statuses.get(uid) != new:
            self._statuses[uid] = new
            self._dirty.set()

    def remove(self, uid: str) -> None:
        if self._statuses.pop(uid, None) is not None:
            self._dirty.set()

    def get(self, uid: str) -> SubscriberStatus | None:
        return self._statuses.get(uid)

    def document(self) -> dict[str, Any]:
        return build_status(self._statuses.values())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="status-writer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            body = self.document()
            if body == self._written:
                continue
            try:
                await loop.run_in_executor(None, self.writer.write, self.key, body)
                self._written = body
            except Exception as exc:
                log.warning("writing KafkaChannel status failed, will retry",
                            extra={"channel": "/".join(self.key), "error": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(self.retry_seconds)
                self._dirty.set()
