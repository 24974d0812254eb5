"""The dispatcher's side of a ResetOffset (``core/resetoffsets.py``): carry out the resets the controller accepted
for a consumer group this dispatcher owns, and report them on the ResetOffset's status.

How one reset runs, in every replica of the dispatcher (each watches the ResetOffsets of its namespace):

1. The group's member in this replica stops: no new records, in-flight deliveries finish within the shutdown grace
   (or are cancelled and redelivered from the committed mark, their attempt counts carried, as on any revoke), the
   finished marks are committed, and the member leaves the group. The other subscriptions of the dispatcher keep
   running: each has its own consumer.
2. Once every replica's member has left, the group is empty (Kafka refuses to move a group with members anyway).
   One replica claims the reset on its status (a write at the read ``resourceVersion``: only one wins), reads the
   committed offsets (the "old" ones), computes the new ones (the first offset at or after the time, or the
   watermarks) and commits them all in one request (``GroupOffsets.commit``): the group is then where it was, or
   where it was asked to be, never in between. Each partition's commit carries a marker (the reset's uid,
   generation and the old offset), so a replica restarted after the commit knows that it is done.
3. The claimer writes Done, the partitions' old and new offsets and ``completedGeneration``; then every replica's
   member joins again and starts from the new committed offsets.

A group with a pending reset is held (not joined) from the dispatcher's start, so a dispatcher restarted mid-reset
does not consume before finishing it. A reset whose group has no commits ends with Done=False, GroupNotFound,
nothing moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.conditions import Condition, merge
from kafka_eventing.core.group_offsets import Committed, GroupOffsets, GroupOffsetsError, plan

log = logging.getLogger(__name__)

#: A claim older than this, without Done, may be taken over (its claimer died between claim and commit).
CLAIM_SECONDS = 30.0
#: How long a reset waits for the members of other replicas (or foreign consumers) to leave before it fails.
MEMBER_TIMEOUT = 300.0
POLL_SECONDS = 0.5


class GroupOwner(Protocol):
    """The dispatcher, as the reset sees it."""

    def group_subscriber(self, group: str) -> str | None:
        """The subscriber uid whose consumer group is ``group`` (None: not one of this dispatcher's)."""

    async def pause_group(self, group: str) -> None:
        """Stop the group's member here (drain, commit, leave the group) and keep it stopped."""

    def resume_group(self, group: str) -> None:
        """Let the group's member join again (it starts at the committed offsets)."""


class ResetApi(Protocol):
    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...
    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class KubeResetApi:
    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.get_namespaced_custom_object(ro.GROUP, ro.VERSION, namespace, ro.PLURAL, name,
                                                              _request_timeout=(5, 15)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object_status(ro.GROUP, ro.VERSION, namespace, ro.PLURAL, name, body,
                                                       _request_timeout=(5, 15))

    def informer(self, namespace: str, on_event: Callable[[str, Mapping[str, Any]], None]) -> Any:
        from kafka_eventing.core.informer import Informer

        return Informer(ro.PLURAL, self.api.list_namespaced_custom_object, on_event,
                        on_list=lambda: on_event("LISTED", {}), group=ro.GROUP, version=ro.VERSION,
                        plural=ro.PLURAL, namespace=namespace)


def serves_resetoffsets(api_client: Any) -> bool:
    """Whether the API server serves the ResetOffset CRD (it is optional).

    An API server not reachable yet counts as serving it: the dispatcher must start (and pass its liveness probe)
    before the API answers, and the ResetOffsets watch retries with backoff until it does."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        found = client.CustomObjectsApi(api_client).get_api_resources(ro.GROUP, ro.VERSION, _request_timeout=(5, 15))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    except (HTTPError, OSError) as exc:
        log.warning("API server not reachable; ResetOffsets watched once it is", extra={"error": str(exc)})
        return True
    return ro.PLURAL in {r.name for r in found.resources or ()}


class Resets:
    """The ResetOffsets of one namespace that target this dispatcher (``kind`` KafkaChannel, Broker or
    KafkaSource, ``namespace``/``name``), carried out one at a time per group."""

    def __init__(self, kind: str, namespace: str, name: str, api: ResetApi, offsets: GroupOffsets, *,
                 informer: Any = None, identity: str | None = None, claim_seconds: float = CLAIM_SECONDS,
                 member_timeout: float = MEMBER_TIMEOUT, poll_seconds: float = POLL_SECONDS) -> None:
        self.key = (kind, namespace, name)
        self.namespace = namespace
        self.api = api
        self.offsets = offsets
        self.identity = identity or socket.gethostname()
        self.claim_seconds = claim_seconds
        self.member_timeout = member_timeout
        self.poll_seconds = poll_seconds
        self.informer = informer
        self._owner: GroupOwner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: (uid, generation) of the resets that ended here: the watch may still show them pending for a moment,
        #: and neither holding the group nor running them again may follow from that.
        self._ended: set[tuple[str, int]] = set()

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, owner: GroupOwner, timeout: float = 60.0) -> None:
        """Start watching and wait for the first list (blocking: call from a worker thread), so that groups with
        a pending reset are held before any member joins."""
        self._owner = owner
        if self.informer is None:
            assert isinstance(self.api, KubeResetApi)
            self.informer = self.api.informer(self.namespace, self._on_event)
        self.informer.start()
        if not self.informer.wait_synced(timeout):
            log.warning("ResetOffsets not listed yet; resets wait for the watch", extra={"namespace": self.namespace})

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.informer is not None:
            self.informer.stop()

    # -- which groups wait for a reset ----------------------------------------------------------------
    def _mine(self) -> list[Mapping[str, Any]]:
        """Pending resets targeting this dispatcher, oldest first (one group's second reset waits its turn)."""
        if self.informer is None:
            return []
        out = []
        for obj in self.informer.items():
            target = ro.pending_target(obj)
            if target is None or (str((obj.get("metadata") or {}).get("uid")), ro.generation_of(obj)) in self._ended:
                continue
            if (target.dispatcher_kind, target.dispatcher_namespace, target.dispatcher_name) == self.key:
                out.append(obj)
        return sorted(out, key=lambda o: (str((o.get("metadata") or {}).get("creationTimestamp") or ""),
                                          str((o.get("metadata") or {}).get("name") or "")))

    def holds(self, group: str) -> bool:
        """Whether the group's member must stay out of the group (a reset of it is pending or running)."""
        if group in self._tasks:
            return True
        return any(ro.pending_target(o) is not None and ro.pending_target(o).group == group  # type: ignore[union-attr]
                   for o in self._mine())

    def _on_event(self, _kind: str, _obj: Mapping[str, Any]) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop may already be closed at shutdown
                loop.call_soon_threadsafe(self.kick)

    def kick(self) -> None:
        """Start a task for each group with a pending reset and none running (on the loop)."""
        owner = self._owner
        if owner is None:
            return
        for obj in self._mine():
            target = ro.pending_target(obj)
            assert target is not None
            if target.group in self._tasks:
                continue
            task = asyncio.get_running_loop().create_task(self._carry_out(obj, target), name=f"reset-{target.group}")
            self._tasks[target.group] = task

    # -- one reset ----------------------------------------------------------------------------------
    async def _carry_out(self, obj: Mapping[str, Any], target: ro.Target) -> None:
        assert self._owner is not None
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        paused = False
        try:
            paused = await self._run(obj, target)
            self._ended.add((str(meta.get("uid")), ro.generation_of(obj)))
        except asyncio.CancelledError:
            raise  # the dispatcher stops: a restart takes the reset up again
        except Exception as exc:
            self._ended.add((str(meta.get("uid")), ro.generation_of(obj)))
            log.exception("reset failed", extra={"resetoffset": f"{ns}/{name}", "group": target.group})
            with contextlib.suppress(Exception):
                await self._finish(obj, Condition.false(ro.DONE, ro.REASON_FAILED, f"{type(exc).__name__}: {exc}"))
        finally:
            self._tasks.pop(target.group, None)
            if paused or self._owner.group_subscriber(target.group) is not None:
                self._owner.resume_group(target.group)
            if self._loop is not None:
                self._loop.call_soon(self.kick)  # the group's next reset, if one waits

    async def _run(self, obj: Mapping[str, Any], target: ro.Target) -> bool:
        """Returns whether the group's member was paused here."""
        assert self._owner is not None
        meta = obj.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        generation = ro.generation_of(obj)
        group, topics = target.group, target.topics
        labels = {"resetoffset": f"{ns}/{name}", "group": group, "topics": list(topics)}
        current = await asyncio.to_thread(self.api.read, ns, name)
        if current is None or ro.generation_of(current) != generation or ro.is_finished(current):
            return False  # the watch was behind: deleted, edited or finished meanwhile
        try:
            spec = ro.parse_spec(obj)
        except ro.SpecError as exc:
            await self._finish(obj, Condition.false(ro.DONE, exc.reason, str(exc)))
            return False
        parts = {t: await asyncio.to_thread(self.offsets.partitions, t) for t in topics}
        committed = await asyncio.to_thread(self._committed, group, parts)
        moves = applied(committed, uid, generation)
        if moves is None and all(c.offset < 0 for per in committed.values() for c in per.values()):
            await self._finish(obj, Condition.false(
                ro.DONE, ro.REASON_GROUP_NOT_FOUND,
                f"consumer group {group} has no committed offsets on {', '.join(topics)}: nothing to move"))
            return False
        if moves is not None:  # committed before a restart; only the report is missing
            await self._finish(obj, _done_condition(moves), moves)
            return False
        await self._progress(obj, ro.REASON_PAUSING, f"pausing the members of {group} in this dispatcher")
        await self._owner.pause_group(group)
        log.info("reset: group paused here, waiting for it to be empty", extra=labels)
        deadline = time.monotonic() + self.member_timeout
        while True:
            current = await asyncio.to_thread(self.api.read, ns, name)
            if current is None or ro.generation_of(current) != generation or ro.is_finished(current):
                return True  # deleted, edited, or finished by another replica
            committed = await asyncio.to_thread(self._committed, group, parts)
            moves = applied(committed, uid, generation)
            if moves is not None:
                break
            members = await asyncio.to_thread(self.offsets.members, group)
            if not members.empty:
                if time.monotonic() > deadline:
                    await self._finish(current, Condition.false(
                        ro.DONE, ro.REASON_FAILED,
                        f"{members.count} member(s) of {group} did not leave within {self.member_timeout:.0f} s "
                        f"({', '.join(members.clients)}); nothing moved"))
                    return True
                await self._progress(current, ro.REASON_MEMBERS,
                                     f"waiting for {members.count} member(s) of {group} to leave "
                                     f"({', '.join(members.clients)})")
                await asyncio.sleep(self.poll_seconds)
                continue
            if not await asyncio.to_thread(self._claim, ns, name, generation):
                await asyncio.sleep(self.poll_seconds)  # another replica commits it; wait for its Done
                continue
            planned = [m for t in topics
                       for m in await asyncio.to_thread(plan, self.offsets, t, committed[t],
                                                        earliest=spec.time.earliest, latest=spec.time.latest,
                                                        millis=spec.time.millis)]
            # Every partition of every topic (a KafkaSource's group reads several) in the one request.
            offsets = [TopicPartition(m.topic, m.partition, m.new, ro.marker(uid, generation, m.old))
                       for m in planned]
            try:
                await asyncio.to_thread(self.offsets.commit, group, offsets)
            except (GroupOffsetsError, KafkaException) as exc:
                log.info("reset commit refused, again", extra={**labels, "error": str(exc)})  # a member joined
                await asyncio.sleep(self.poll_seconds)
                continue
            moves = planned
            log.info("reset committed", extra={**labels, "moves": [m.to_status() for m in moves]})
            break
        await self._finish(obj, _done_condition(moves), moves)
        return True

    def _committed(self, group: str, parts: Mapping[str, list[int]]) -> dict[str, dict[int, Committed]]:
        return {topic: self.offsets.committed(group, topic, ps) for topic, ps in parts.items()}

    # -- status -------------------------------------------------------------------------------------
    def _claim(self, ns: str, name: str, generation: int) -> bool:
        """Claim the commit on the status (at the read resourceVersion): True if this replica holds the claim."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(5):
            obj = self.api.read(ns, name)
            if obj is None or ro.generation_of(obj) != generation or ro.is_finished(obj):
                return False
            claim = (obj.get("status") or {}).get("executor") or {}
            if (claim.get("identity") not in (None, self.identity) and claim.get("generation") == generation
                    and time.time() - float(claim.get("claimedAt") or 0) < self.claim_seconds):
                return False
            body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "status": {"executor": {"identity": self.identity, "generation": generation,
                                            "claimedAt": f"{time.time():.3f}"}}}
            try:
                self.api.patch_status(ns, name, body)
                return True
            except ApiException as exc:
                if exc.status != 409:
                    raise
        return False

    async def _progress(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        await self._write(obj, [Condition.true(ro.RESETTING, reason, message),
                                Condition.unknown(ro.DONE, reason, message)])

    async def _finish(self, obj: Mapping[str, Any], done: Condition,
                      moves: list[ro.PartitionMove] | None = None) -> None:
        """The final report; retried until written (other replicas wait for it before joining again)."""
        extra: dict[str, Any] = {}
        if moves is not None and done.is_true:
            extra = {"partitions": [m.to_status() for m in moves], "completedGeneration": ro.generation_of(obj)}
        conditions = [Condition.false(ro.RESETTING, done.reason, "finished"), done]
        delay = 0.5
        while True:
            try:
                await self._write(obj, conditions, extra)
                return
            except Exception as exc:
                log.warning("writing the reset's status failed, will retry", extra={"error": str(exc)})
                await asyncio.sleep(delay)
                delay = min(10.0, delay * 2)

    async def _write(self, obj: Mapping[str, Any], conditions: list[Condition],
                     extra: Mapping[str, Any] | None = None) -> None:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        generation = ro.generation_of(obj)

        def merged(current: Mapping[str, Any]) -> dict[str, Any] | None:
            if ro.generation_of(current) != generation:
                return None  # edited meanwhile: a new reset, not this one's report
            status = current.get("status") or {}
            stored = status.get("conditions") or []
            mine = {c.type for c in conditions}
            kept = [c for c in stored if c.get("type") not in mine]
            new = merge([c for c in stored if c.get("type") in mine], conditions)
            out = {"conditions": sorted([*kept, *new], key=lambda c: str(c.get("type"))), **(extra or {})}
            if all(status.get(k) == v for k, v in out.items()):
                return None
            return out

        from kafka_eventing.dispatcher.status import write_merged

        def write() -> None:
            write_merged(lambda: self.api.read(ns, name) or {"metadata": {"generation": -1}}, merged,
                         lambda body: self.api.patch_status(ns, name, body))

        await asyncio.to_thread(write)


def applied(committed: Mapping[str, Mapping[int, Committed]], uid: str,
            generation: int) -> list[ro.PartitionMove] | None:
    """The moves of this reset if its commit is the group's current one on every partition of every topic, else
    None."""
    if not committed or not all(committed.values()):
        return None
    moves = []
    for topic, per_topic in committed.items():
        for partition, c in sorted(per_topic.items()):
            old = ro.marker_old(c.metadata, uid, generation)
            if old is None:
                return None
            moves.append(ro.PartitionMove(topic, partition, old, c.offset))
    return moves


def _done_condition(moves: list[ro.PartitionMove]) -> Condition:
    early = sorted(m.partition for m in moves if m.before_retention)
    moved = sum(1 for m in moves if m.new != m.old)
    message = f"moved {moved} of {len(moves)} partitions"
    if early:
        message += (f"; the time is older than the oldest record kept on partition(s) "
                    f"{', '.join(map(str, early))} (retention): moved to the earliest kept offset there")
    return Condition.true(ro.DONE, ro.REASON_DONE, message)
