"""The dispatcher's ResetOffset state machine (dispatcher/resets.py) on fakes: the API, Kafka's group offsets and
the dispatcher's members. Real Kafka and the real apiserver: tests/integration/test_resetoffset.py."""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from kubernetes.client.exceptions import ApiException

from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.group_offsets import Committed, GroupOffsetsError, Members, Watermarks
from kafka_eventing.dispatcher.resets import Resets

GROUP_ID, TOPIC = "kafka.ns.kc.sub-1", "ns.kc"


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


def reset_obj(name: str = "r1", *, time: str = "earliest", generation: int = 1, accepted: bool = True,
              created: str = "2026-11-26T21:00:00Z", status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    target = ro.Target(GROUP_ID, (TOPIC,), "KafkaChannel", "ns", "kc")
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": generation,
                         "resourceVersion": "1", "creationTimestamp": created},
            "spec": {"offset": {"time": time}, "ref": {"apiVersion": "messaging.knative.dev/v1",
                                                       "kind": "Subscription", "name": "s"}},
            "status": dict(status) if status is not None else {
                "observedGeneration": generation, "target": target.to_status(),
                "conditions": [{"type": "Accepted", "status": "True" if accepted else "False",
                                "reason": "Accepted"}]}}


class FakeApi:
    """Status patches as the apiserver's merge-patch on the status subresource, with resourceVersion checks."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}
        self.patches: list[dict[str, Any]] = []

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        found = self.objs.get(name)
        return copy.deepcopy(found) if found is not None else None

    def patch_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        obj = self.objs[name]
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv is not None and rv != obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        self.patches.append(copy.deepcopy(body))
        status = obj.setdefault("status", {})
        for k, v in body["status"].items():
            if v is None:
                status.pop(k, None)
            else:
                status[k] = copy.deepcopy(v)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next(c for c in self.objs[name]["status"]["conditions"] if c["type"] == kind)


class FakeInformer:
    def __init__(self, api: FakeApi) -> None:
        self.api = api

    def items(self) -> list[Mapping[str, Any]]:
        return [copy.deepcopy(o) for o in self.api.objs.values()]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def wait_synced(self, timeout: float) -> bool:
        return True


class FakeOffsets:
    """Three partitions; ``members`` counts down (other replicas leaving); commit refused while members > 0."""

    def __init__(self, committed: dict[int, int] | None = None, members: int = 0) -> None:
        base = {0: 5, 1: 7, 2: 9} if committed is None else committed
        self.committed_ = {p: Committed(o, "") for p, o in base.items()}
        self.marks = {0: Watermarks(0, 10), 1: Watermarks(2, 20), 2: Watermarks(0, 30)}
        self.members_left = members
        self.commits: list[list[TopicPartition]] = []

    def partitions(self, topic: str) -> list[int]:
        return sorted(self.marks)

    def committed(self, group: str, topic: str, partitions: Any) -> dict[int, Committed]:
        return dict(self.committed_)

    def watermarks(self, topic: str, partitions: Any) -> dict[int, Watermarks]:
        return dict(self.marks)

    def at_time(self, topic: str, partitions: Any, millis: int) -> dict[int, int]:
        return {0: 3, 1: 2, 2: -1}

    def first_timestamp(self, topic: str, partition: int, offset: int) -> int | None:
        return 2_000_000_000_000

    def members(self, group: str) -> Members:
        count = self.members_left
        if count:
            self.members_left -= 1
        return Members("STABLE" if count else "EMPTY", count, tuple(f"replica-{i}" for i in range(min(count, 3))))

    def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        if self.members_left:
            raise GroupOffsetsError("commit refused: group not empty")
        self.commits.append(offsets)
        for tp in offsets:
            self.committed_[tp.partition] = Committed(tp.offset, tp.metadata)


class FakeOwner:
    def __init__(self) -> None:
        self.events: list[str] = []

    def group_subscriber(self, group: str) -> str | None:
        return "sub-1" if group == GROUP_ID else None

    async def pause_group(self, group: str) -> None:
        self.events.append("pause")

    def resume_group(self, group: str) -> None:
        self.events.append("resume")


def make(api: FakeApi, offsets: FakeOffsets, identity: str = "replica-a") -> tuple[Resets, FakeOwner]:
    resets = Resets("KafkaChannel", "ns", "kc", api, offsets, informer=FakeInformer(api),  # type: ignore[arg-type]
                    identity=identity, poll_seconds=0.01, member_timeout=2.0)
    owner = FakeOwner()
    resets.start(owner)
    return resets, owner


async def settle(resets: Resets) -> None:
    resets.bind(asyncio.get_running_loop())
    resets.kick()
    for _ in range(500):
        await asyncio.sleep(0.01)
        if not resets._tasks:
            return
    raise AssertionError("reset did not finish")


@run
async def test_reset_pauses_commits_every_partition_once_with_markers_and_reports() -> None:
    api, offsets = FakeApi(reset_obj(time="2026-11-26T20:00:00Z")), FakeOffsets()
    resets, owner = make(api, offsets)
    assert resets.holds(GROUP_ID)  # held before anything runs: no member joins a group with a pending reset
    await settle(resets)
    assert owner.events == ["pause", "resume"]
    (commit,) = offsets.commits
    # The first offset at or after the time; the high watermark where nothing is that recent; all in one request.
    assert [(tp.partition, tp.offset) for tp in commit] == [(0, 3), (1, 2), (2, 30)]
    assert [tp.metadata for tp in commit] == ["ke.reset=uid-r1/1/5", "ke.reset=uid-r1/1/7", "ke.reset=uid-r1/1/9"]
    status = api.objs["r1"]["status"]
    assert status["completedGeneration"] == 1
    assert status["partitions"] == [{"topic": TOPIC, "partition": 0, "old": 5, "new": 3},
                                    {"topic": TOPIC, "partition": 1, "old": 7, "new": 2, "beforeRetention": True},
                                    {"topic": TOPIC, "partition": 2, "old": 9, "new": 30}]
    done = api.condition("r1", ro.DONE)
    assert done["status"] == "True" and done["reason"] == "Done"
    assert "older than the oldest record kept on partition(s) 1" in done["message"]
    assert api.condition("r1", ro.RESETTING)["status"] == "False"
    assert api.condition("r1", ro.ACCEPTED)["status"] == "True"  # the controller's condition is kept
    assert not resets.holds(GROUP_ID)


@run
async def test_done_reset_is_never_applied_again() -> None:
    api, offsets = FakeApi(reset_obj()), FakeOffsets()
    resets, _ = make(api, offsets)
    await settle(resets)
    # A resync, a restart: the completed generation ends it.
    again, owner = make(api, offsets, identity="replica-a")
    await settle(again)
    assert len(offsets.commits) == 1 and owner.events == []


@run
async def test_group_without_commits_is_group_not_found_and_nothing_moves() -> None:
    api, offsets = FakeApi(reset_obj()), FakeOffsets(committed={0: -1, 1: -1, 2: -1})
    resets, owner = make(api, offsets)
    await settle(resets)
    assert offsets.commits == [] and "pause" not in owner.events
    done = api.condition("r1", ro.DONE)
    assert (done["status"], done["reason"]) == ("False", ro.REASON_GROUP_NOT_FOUND)


@run
async def test_waits_for_other_members_to_leave_then_commits() -> None:
    api, offsets = FakeApi(reset_obj(time="latest")), FakeOffsets(members=3)
    resets, _ = make(api, offsets)
    seen: list[str] = []
    original = api.patch_status

    def spy(namespace: str, name: str, body: dict[str, Any]) -> None:
        for c in body["status"].get("conditions") or ():
            if c["type"] == ro.RESETTING:
                seen.append(c.get("reason", ""))
        original(namespace, name, body)

    api.patch_status = spy  # type: ignore[method-assign]
    await settle(resets)
    assert ro.REASON_MEMBERS in seen
    assert [(tp.partition, tp.offset) for tp in offsets.commits[0]] == [(0, 10), (1, 20), (2, 30)]


@run
async def test_members_that_never_leave_fail_the_reset_and_nothing_moves() -> None:
    api, offsets = FakeApi(reset_obj()), FakeOffsets(members=10**9)
    resets, owner = make(api, offsets)
    await settle(resets)
    assert offsets.commits == [] and owner.events == ["pause", "resume"]
    done = api.condition("r1", ro.DONE)
    assert (done["status"], done["reason"]) == ("False", ro.REASON_FAILED)
    assert "did not leave" in done["message"] and "nothing moved" in done["message"]


@run
async def test_restart_after_the_commit_reports_done_from_the_markers_without_moving_again() -> None:
    api, offsets = FakeApi(reset_obj()), FakeOffsets()
    offsets.committed_ = {0: Committed(0, "ke.reset=uid-r1/1/5"), 1: Committed(2, "ke.reset=uid-r1/1/7"),
                          2: Committed(0, "ke.reset=uid-r1/1/9")}
    resets, owner = make(api, offsets)
    await settle(resets)
    assert offsets.commits == [] and "pause" not in owner.events
    assert api.objs["r1"]["status"]["partitions"][0] == {"topic": TOPIC, "partition": 0, "old": 5, "new": 0}
    assert api.objs["r1"]["status"]["completedGeneration"] == 1


@run
async def test_two_replicas_one_commit() -> None:
    api, offsets = FakeApi(reset_obj(time="latest")), FakeOffsets()
    a, _ = make(api, offsets, identity="replica-a")
    b, _ = make(api, offsets, identity="replica-b")
    await asyncio.gather(settle(a), settle(b))
    assert len(offsets.commits) == 1
    assert api.objs["r1"]["status"]["executor"]["identity"] in ("replica-a", "replica-b")


@run
async def test_refused_or_other_dispatchers_resets_are_left_alone() -> None:
    refused = reset_obj("r1", accepted=False)
    other = reset_obj("r2")
    other["status"]["target"]["dispatcher"]["name"] = "another-channel"
    api, offsets = FakeApi(refused, other), FakeOffsets()
    resets, owner = make(api, offsets)
    assert not resets.holds(GROUP_ID)
    await settle(resets)
    assert offsets.commits == [] and owner.events == []


@run
async def test_a_second_reset_of_the_group_waits_for_the_first() -> None:
    api = FakeApi(reset_obj("r1", time="earliest", created="2026-11-26T21:00:00Z"),
                  reset_obj("r2", time="latest", created="2026-11-26T21:00:01Z"))
    offsets = FakeOffsets()
    resets, _ = make(api, offsets)
    await settle(resets)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(offsets.commits) == 2 and not resets._tasks:
            break
    assert [[tp.offset for tp in c] for c in offsets.commits] == [[0, 2, 0], [10, 20, 30]]
    assert api.objs["r2"]["status"]["partitions"][0]["old"] == 0  # where the first one left it


@pytest.mark.parametrize("text", ["yesterday", "2026-11-26 21:00", "2026-11-26T21:00:00", "2026-13-01T00:00:00Z"])
def test_malformed_times_are_invalid_time(text: str) -> None:
    with pytest.raises(ro.SpecError) as err:
        ro.parse_time(text)
    assert err.value.reason == ro.REASON_INVALID_TIME


def test_times() -> None:
    assert ro.parse_time("Latest").latest and ro.parse_time("earliest").earliest
    assert ro.parse_time("1970-01-01T00:00:01.5Z").millis == 1500
    assert ro.parse_time("1970-01-01T01:00:00+01:00").millis == 0


def test_marker_round_trip() -> None:
    assert ro.marker_old(ro.marker("u", 3, 42), "u", 3) == 42
    assert ro.marker_old(ro.marker("u", 3, 42), "u", 4) is None
    assert ro.marker_old("ke.attempts=[]", "u", 3) is None


class StaleInformer(FakeInformer):
    """A watch that has not caught up: it still shows the objects as they were."""

    def __init__(self, api: FakeApi) -> None:
        super().__init__(api)
        self.frozen = [copy.deepcopy(o) for o in api.objs.values()]

    def items(self) -> list[Mapping[str, Any]]:
        return copy.deepcopy(self.frozen)


@run
async def test_a_watch_that_lags_behind_neither_holds_the_group_nor_runs_the_reset_again() -> None:
    api, offsets = FakeApi(reset_obj()), FakeOffsets()
    resets, owner = make(api, offsets)
    resets.informer = StaleInformer(api)  # still "pending" after it is done
    await settle(resets)
    assert not resets.holds(GROUP_ID)  # the member rejoins at once
    # The member consumes: its commits replace the markers. The stale view must not start the reset again.
    offsets.committed_ = {p: Committed(c.offset + 1, "") for p, c in offsets.committed_.items()}
    resets.kick()
    await settle(resets)
    assert len(offsets.commits) == 1 and owner.events == ["pause", "resume"]
    # A new process with a stale first list: it reads the object before acting, and leaves it.
    again, owner2 = make(api, offsets, identity="replica-b")
    again.informer = StaleInformer(api)
    again.informer.frozen = resets.informer.frozen
    await settle(again)
    assert len(offsets.commits) == 1 and owner2.events == ["resume"]


def _two_subscriptions() -> tuple[Any, Any, Callable[[str], str]]:
    """A KafkaChannel ns/c with the subscriptions "now" and "other", in a source the dispatcher reads, its settings
    and each subscription's consumer group. (A Broker's Triggers share one read: test_fanout.py.)"""
    from kafka_eventing.core.channels import Channel, Subscriber
    from kafka_eventing.core.settings import Settings

    from .fakes import Source

    settings = Settings(bootstrap_servers="127.0.0.1:1", channel_namespace="ns", channel_name="c")
    source = Source()
    channel = Channel(namespace="ns", name="c", topic="t", subscribers=(
        Subscriber("now", "http://sub/"), Subscriber("other", "http://sub/")))
    source.channels = {channel.key: channel}
    return source, settings, lambda uid: settings.consumer_group_for("ns", "c", uid)


class Member:
    """A consumer that joins nothing: records which groups are joined and left."""

    def __init__(self, config: dict[str, Any], log: list[tuple[str, str]]) -> None:
        self.group, self.log = config["group.id"], log
        log.append(("join", self.group))

    def subscribe(self, topics: list[str], **_callbacks: Any) -> None: ...

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        self.log.append(("leave", self.group))


@run
async def test_the_dispatcher_pauses_only_the_reset_group_and_rejoins_it_after() -> None:
    from prometheus_client import CollectorRegistry

    from kafka_eventing.core.kafka_config import connection_from_settings
    from kafka_eventing.dispatcher.factory import create_dispatcher

    source, settings, group = _two_subscriptions()
    obj = reset_obj()
    obj["status"]["target"] = ro.Target(group("now"), ("t",), "KafkaChannel", "ns", "c").to_status()
    api, offsets = FakeApi(obj), FakeOffsets()
    resets = Resets("KafkaChannel", "ns", "c", api, offsets, informer=FakeInformer(api),  # type: ignore[arg-type]
                    identity="x", poll_seconds=0.01)
    log: list[tuple[str, str]] = []
    dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                   consumer_factory=lambda config: Member(config, log), registry=CollectorRegistry(),
                                   port=-1, shutdown_grace=0.1, resets=resets)
    task = asyncio.create_task(dispatcher.run())
    await dispatcher.wait_started()
    for _ in range(300):
        await asyncio.sleep(0.01)
        if api.objs["r1"]["status"].get("completedGeneration") == 1 and ("join", group("now")) in log:
            break
    dispatcher.stop()
    await task
    # The reset group was held from the start (a pending reset): it joined only after the commit; the other
    # Trigger joined at once and never left until the dispatcher stopped.
    now, other = group("now"), group("other")
    assert log[0] == ("join", other)
    assert [e for e in log if e[1] == now] == [("join", now), ("leave", now)]
    assert [e for e in log if e[1] == other] == [("join", other), ("leave", other)]
    assert len(offsets.commits) == 1


@run
async def test_a_reset_of_a_running_member_stops_it_and_starts_it_again() -> None:
    from prometheus_client import CollectorRegistry

    from kafka_eventing.core.kafka_config import connection_from_settings
    from kafka_eventing.dispatcher.factory import create_dispatcher

    source, settings, group = _two_subscriptions()
    obj = reset_obj(accepted=False)
    obj["status"]["conditions"][0]["reason"] = "NotYet"  # not accepted yet, not refused either
    obj["status"]["target"] = ro.Target(group("now"), ("t",), "KafkaChannel", "ns", "c").to_status()
    api, offsets = FakeApi(obj), FakeOffsets()
    resets = Resets("KafkaChannel", "ns", "c", api, offsets, informer=FakeInformer(api),  # type: ignore[arg-type]
                    identity="x", poll_seconds=0.01)
    log: list[tuple[str, str]] = []
    dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                   consumer_factory=lambda config: Member(config, log), registry=CollectorRegistry(),
                                   port=-1, shutdown_grace=0.1, resets=resets)
    task = asyncio.create_task(dispatcher.run())
    await dispatcher.wait_started()
    await asyncio.sleep(0.05)
    now, other = group("now"), group("other")
    assert sorted(log) == [("join", now), ("join", other)]
    api.objs["r1"]["status"]["conditions"][0].update(status="True", reason="Accepted")
    resets.kick()  # what the watch event does
    for _ in range(300):
        await asyncio.sleep(0.01)
        if api.objs["r1"]["status"].get("completedGeneration") == 1 and log.count(("join", now)) == 2:
            break
    dispatcher.stop()
    await task
    assert [e for e in log if e[1] == now] == [("join", now), ("leave", now), ("join", now), ("leave", now)]
    assert [e for e in log if e[1] == other] == [("join", other), ("leave", other)]
    assert len(offsets.commits) == 1


class TwoTopicOffsets(FakeOffsets):
    """A KafkaSource's group over two topics (three partitions each): committed offsets kept per topic."""

    def __init__(self) -> None:
        super().__init__()
        self.by_topic = {t: {p: Committed(o, "") for p, o in base.items()}
                         for t, base in (("t1", {0: 5, 1: 7, 2: 9}), ("t2", {0: 1, 1: 2, 2: 3}))}

    def committed(self, group: str, topic: str, partitions: Any) -> dict[int, Committed]:
        return dict(self.by_topic[topic])

    def commit(self, group: str, offsets: list[TopicPartition]) -> None:
        self.commits.append(offsets)
        for tp in offsets:
            self.by_topic[tp.topic][tp.partition] = Committed(tp.offset, tp.metadata)


@run
async def test_a_kafka_source_group_moves_every_partition_of_every_topic_in_one_commit() -> None:
    obj = reset_obj(time="earliest")
    obj["status"]["target"] = ro.Target(GROUP_ID, ("t1", "t2"), "KafkaChannel", "ns", "kc").to_status()
    api, offsets = FakeApi(obj), TwoTopicOffsets()
    resets, _ = make(api, offsets)
    await settle(resets)
    (commit,) = offsets.commits
    assert [(tp.topic, tp.partition, tp.offset) for tp in commit] == [
        ("t1", 0, 0), ("t1", 1, 2), ("t1", 2, 0), ("t2", 0, 0), ("t2", 1, 2), ("t2", 2, 0)]
    assert [(p["topic"], p["old"]) for p in api.objs["r1"]["status"]["partitions"]] == [
        ("t1", 5), ("t1", 7), ("t1", 9), ("t2", 1), ("t2", 2), ("t2", 3)]
    # A restart finds the markers on both topics and reports without moving again.
    api.objs["r1"]["status"].pop("completedGeneration")
    api.objs["r1"]["status"]["conditions"] = [c for c in api.objs["r1"]["status"]["conditions"]
                                              if c["type"] == ro.ACCEPTED]
    again, _ = make(api, offsets, identity="replica-b")
    await settle(again)
    assert len(offsets.commits) == 1 and api.objs["r1"]["status"]["completedGeneration"] == 1
