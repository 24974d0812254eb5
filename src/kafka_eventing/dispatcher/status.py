"""``status.subscribers[]`` of the KafkaChannel: built here, written through the status subresource.

A subscriber is ready once its consumer group has joined (first assignment); until then, or when it cannot
join, it is not ready with a message saying why. In file mode the same document is kept in memory only and
served at ``/status``.

Several dispatcher replicas of one channel each run a member of every subscriber's group, so each knows only
its own member. The kube writer therefore merges per subscriber uid into what is stored (``merge_subscribers``)
instead of replacing the list, under optimistic concurrency: a replica that is still joining never overwrites
another's "ready" for the same generation, and entries it does not know are kept.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_eventing.core.channels import GROUP, PLURAL, ChannelKey

log = logging.getLogger(__name__)

VERSION = "v1beta1"
#: The message of a member that has not joined its group yet: a replica's own transient state, not a fault.
JOINING = "joining consumer group"
#: Tries at a read-merge-write before giving up until the next change (another replica wrote in between).
CONFLICT_ATTEMPTS = 5
HTTP_CONFLICT = 409


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


def merge_subscribers(stored: Iterable[Mapping[str, Any]], mine: Iterable[Mapping[str, Any]],
                      wanted: Iterable[str]) -> list[dict[str, Any]]:
    """``status.subscribers`` after this replica's entries (``mine``) are merged into the ``stored`` ones.

    Keyed by uid, for the uids in the spec (``wanted``): an entry of an older generation never replaces a newer
    one, and this replica's "joining" never replaces another replica's ready entry of the same generation (the
    group already consumes). Everything else this replica knows wins: real faults (missing topic, channel not
    ready, unresolvable sink) are seen alike by every replica.
    """
    keep = set(wanted)
    merged = {str(e.get("uid")): dict(e) for e in stored if e.get("uid") in keep}
    for entry in mine:
        uid = str(entry["uid"])
        if uid not in keep:
            continue
        old = merged.get(uid)
        if old is not None:
            generation, old_generation = int(entry.get("observedGeneration") or 0), int(
                old.get("observedGeneration") or 0)
            if generation < old_generation:
                continue
            if (generation == old_generation and entry.get("message") == JOINING
                    and old.get("ready") == "True"):
                continue
        merged[uid] = dict(entry)
    return [merged[uid] for uid in sorted(merged)]


class StatusWriter(Protocol):
    def write(self, key: ChannelKey, body: dict[str, Any]) -> None: ...


class MemoryStatusWriter:
    """File mode: nothing to write to; ``/status`` reads the board."""

    def __init__(self) -> None:
        self.last: dict[ChannelKey, dict[str, Any]] = {}

    def write(self, key: ChannelKey, body: dict[str, Any]) -> None:
        self.last[key] = body


class KubeStatusWriter:
    """This replica's entries merged into the stored ``status.subscribers`` (``merge_subscribers``), written by a
    merge-patch of the status subresource that carries the read ``resourceVersion``: if another replica wrote in
    between, the API server answers 409 and the merge is done again on the new state."""

    def __init__(self, api_client: Any, version: str = VERSION) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.version = version

    def write(self, key: ChannelKey, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace, name = key
        mine = body["status"]["subscribers"]
        for attempt in range(CONFLICT_ATTEMPTS):
            obj = self.api.get_namespaced_custom_object(GROUP, self.version, namespace, PLURAL, name,
                                                        _request_timeout=(5, 15))
            wanted = [str(s.get("uid")) for s in (obj.get("spec") or {}).get("subscribers") or []]
            stored = (obj.get("status") or {}).get("subscribers") or []
            merged = merge_subscribers(stored, mine, wanted)
            if merged == stored:
                return
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "status": {"subscribers": merged}}
            try:
                self.api.patch_namespaced_custom_object_status(
                    GROUP, self.version, namespace, PLURAL, name, patch, _request_timeout=(5, 15))
                return
            except ApiException as exc:
                if exc.status != HTTP_CONFLICT or attempt == CONFLICT_ATTEMPTS - 1:
                    raise


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
