"""FileChannelSource: first read, reload on change, last good set kept on a broken file, subscribers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kube_fakes import FakeCustomObjects, gone, kube_obj

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channel_source import (
    FileBrokerSource,
    FileChannelSource,
    KubeBrokerSource,
    KubeChannelSource,
    NoChannels,
    channel_source_from_settings,
    sink_source,
)
from kafka_eventing.core.channels import Channel, ChannelKey
from kafka_eventing.core.settings import Settings, SettingsError
from waiting import wait_for

SETTINGS = Settings()


def channel_doc(name: str, namespace: str = "default", extra: str = "") -> str:
    return (
        "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
        f"metadata:\n  name: {name}\n  namespace: {namespace}\n{extra}"
    )


def write(path: Path, *docs: str) -> None:
    # A new inode each time, as `kubectl`/editors/ConfigMap mounts do; mtime bumped so a same-size
    # rewrite inside one mtime tick is still seen.
    tmp = path.with_suffix(".tmp")
    tmp.write_text("---\n".join(docs))
    os.replace(tmp, path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.fixture
def source_factory(tmp_path: Path) -> Iterator[Callable[[], FileChannelSource]]:
    made: list[FileChannelSource] = []

    def make() -> FileChannelSource:
        src = FileChannelSource(tmp_path / "channels.yaml", SETTINGS, poll_interval=0.02)
        made.append(src)
        src.start()
        return src

    yield make
    for src in made:
        src.stop()


def test_first_read_is_synchronous_and_synced(tmp_path: Path,
                                              source_factory: Callable[[], FileChannelSource]) -> None:
    write(tmp_path / "channels.yaml", channel_doc("a"), channel_doc("b", "ns2"))
    src = source_factory()
    assert src.synced()
    assert set(src.snapshot()) == {("default", "a"), ("ns2", "b")}
    got = src.get(("ns2", "b"))
    assert got is not None
    assert got.topic == "ns2.b"
    assert src.get(("ns2", "zzz")) is None


def test_reload_on_change_and_subscribers_told(tmp_path: Path,
                                               source_factory: Callable[[], FileChannelSource]) -> None:
    path = tmp_path / "channels.yaml"
    write(path, channel_doc("a"))
    src = source_factory()
    seen: list[dict[ChannelKey, Channel]] = []
    src.subscribe(seen.append)
    write(path, channel_doc("a"), channel_doc("b"))
    wait_for(lambda: src.get(("default", "b")) is not None)
    assert set(seen[-1]) == {("default", "a"), ("default", "b")}
    write(path, channel_doc("b"))
    wait_for(lambda: src.get(("default", "a")) is None)
    assert set(seen[-1]) == {("default", "b")}


def test_broken_file_keeps_last_good_set(tmp_path: Path, source_factory: Callable[[], FileChannelSource],
                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "channels.yaml"
    write(path, channel_doc("a"))
    src = source_factory()
    seen: list[dict[ChannelKey, Channel]] = []
    src.subscribe(seen.append)
    write(path, "kind: KafkaChannel\nmetadata: [unclosed")
    wait_for(lambda: any("rejected" in r.getMessage() for r in caplog.records))
    assert set(src.snapshot()) == {("default", "a")}
    # An invalid channel spec also rejects the file as a whole (the operator sees the error, nothing vanishes).
    write(path, channel_doc("a"), channel_doc("bad", extra="  annotations:\n"
                                               "    kafka.eventing.knative.dev/content.mode: weird\n"))
    wait_for(lambda: sum("rejected" in r.getMessage() for r in caplog.records) >= 2)
    assert set(src.snapshot()) == {("default", "a")}
    path.unlink()
    wait_for(lambda: any("unreadable" in r.getMessage() for r in caplog.records))
    assert set(src.snapshot()) == {("default", "a")}
    assert seen == []
    write(path, channel_doc("c"))
    wait_for(lambda: src.get(("default", "c")) is not None)
    assert set(src.snapshot()) == {("default", "c")}


def test_missing_file_at_start_is_not_synced(source_factory: Callable[[], FileChannelSource]) -> None:
    src = source_factory()
    assert not src.synced()
    assert src.snapshot() == {}


def test_readiness_reflected_from_status(tmp_path: Path, source_factory: Callable[[], FileChannelSource]) -> None:
    status = ("status:\n  conditions:\n  - type: TopicReady\n    status: 'False'\n"
              "    message: topic is being created\n")
    write(tmp_path / "channels.yaml", channel_doc("a") + status)
    src = source_factory()
    got = src.get(("default", "a"))
    assert got is not None
    assert not got.ready
    assert got.reason == "topic is being created"


def test_source_from_settings(tmp_path: Path) -> None:
    src = channel_source_from_settings(Settings(channel_source="file", channels_file=tmp_path / "c.yaml"))
    assert isinstance(src, FileChannelSource)
    with pytest.raises(SettingsError, match="KE_CHANNELS_FILE"):
        channel_source_from_settings(Settings(channel_source="file"))
    with pytest.raises(SettingsError, match="KE_CHANNEL_SOURCE='etcd' is not one of file, kube"):
        Settings(channel_source="etcd")  # type: ignore[arg-type]
    from kubernetes import client

    kube = channel_source_from_settings(
        Settings(channel_source="kube", channel_namespace="ns", channel_name="one"), client.ApiClient())
    assert isinstance(kube, KubeChannelSource)
    assert kube.namespace == "ns"
    assert kube.name == "one"


# -- KubeChannelSource against a fake CustomObjectsApi (the real apiserver is in tests/integration) ---------


def test_kube_source_lists_watches_and_relists_on_gone() -> None:
    from kubernetes import client

    fake = FakeCustomObjects(
        lists=[{"metadata": {"resourceVersion": "10"}, "items": [kube_obj("a", "9")]},
               {"metadata": {"resourceVersion": "50"}, "items": [kube_obj("a", "9"), kube_obj("z", "49")]}],
        watches=[
            [{"type": "ADDED", "object": kube_obj("b", "11")},
             {"type": "MODIFIED", "object": kube_obj("a", "12", extra={"annotations": {
                 "kafka.eventing.knative.dev/content.mode": "weird"}})},  # invalid → kept out
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}],
            [gone()],
        ],
    )
    src = KubeChannelSource(client.ApiClient(), SETTINGS, namespace="ns", name="x", watch_timeout_seconds=7)
    src.api = fake
    states: list[set[ChannelKey]] = []
    src.subscribe(lambda snap: states.append(set(snap)))
    src.start()
    try:
        wait_for(lambda: len(states) >= 4)
    finally:
        src.stop()
    # One snapshot per change: the relist replaces {b} by {a, z} at once, never a half-listed set in between.
    assert states == [{("ns", "a")}, {("ns", "a"), ("ns", "b")}, {("ns", "b")}, {("ns", "a"), ("ns", "z")}]
    watch_calls = fake.watch_calls()
    assert len(fake.list_calls()) == 2  # the 410 led to a second list
    assert watch_calls[0]["resource_version"] == "10"
    assert watch_calls[1]["resource_version"] == "20"  # resumed after the bookmark, not from the list
    assert watch_calls[2]["resource_version"] == "50"
    for call in watch_calls:
        assert call["timeout_seconds"] == 7
        assert call["_request_timeout"] == (10, 37)
        assert call["field_selector"] == "metadata.name=x"
        assert call["namespace"] == "ns"


def test_file_policy_source_reads_event_policies_beside_the_channels(tmp_path: Path) -> None:
    from kafka_eventing.core.channel_source import FilePolicySource, policy_source

    path = tmp_path / "channels.yaml"
    path.write_text(
        "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\nmetadata: {name: orders, namespace: shop}\n"
        "---\napiVersion: eventing.knative.dev/v1alpha1\nkind: EventPolicy\nmetadata: {name: p, namespace: shop}\n"
        "spec:\n  from: [{sub: 'system:serviceaccount:shop:*'}]\n"
        "---\napiVersion: eventing.knative.dev/v1alpha1\nkind: EventPolicy\nmetadata: {name: bad, namespace: shop}\n"
        "spec:\n  to: [{}]\n")
    settings = Settings(channel_source="file", channels_file=path, auth_issuer="https://issuer.example")
    assert policy_source(Settings(channel_source="file", channels_file=path), None) is None  # auth off: none
    source = policy_source(settings, None)
    assert isinstance(source, FilePolicySource)
    source.start()
    try:
        policies = source.policies()
        assert sorted(policies) == [("shop", "bad"), ("shop", "p")]
        assert policies[("shop", "p")].allows_subject("system:serviceaccount:shop:x")
        assert "spec.to[0]" in policies[("shop", "bad")].problem  # kept, closed: it allows no one
    finally:
        source.stop()


# -- which receiver serves which Broker: the shared one the Kafka class, a namespaced one its KafkaNamespaced ------
def broker(name: str, namespace: str, klass: str, rv: str = "1") -> dict[str, object]:
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv,
                         "annotations": {kb.ANNOTATION_BROKER_CLASS: klass}}}


BROKERS = [broker("shared", "a", kb.BROKER_CLASS), broker("own", "a", kb.NAMESPACED_BROKER_CLASS),
           broker("theirs", "b", kb.NAMESPACED_BROKER_CLASS), broker("mt", "a", "MTChannelBasedBroker")]


def test_the_shared_receiver_and_a_namespaced_one_serve_disjoint_brokers(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(BROKERS))
    served = {}
    for scope in ("", "a", "b"):
        src = FileBrokerSource(path, Settings(receiver_namespace=scope))
        src.start()
        try:
            served[scope] = set(src.snapshot())
        finally:
            src.stop()
    assert served == {"": {("a", "shared")}, "a": {("a", "own")}, "b": {("b", "theirs")}}


def test_a_namespaced_receiver_lists_brokers_of_its_namespace_only_and_serves_no_channel_or_sink() -> None:
    from kubernetes import client

    fake = FakeCustomObjects(lists=[{"metadata": {"resourceVersion": "5"},
                                     "items": [b for b in BROKERS if b["metadata"]["namespace"] == "a"]}])
    settings = Settings(channel_source="kube", receiver_namespace="a")
    src = KubeBrokerSource(client.ApiClient(), settings, namespace=settings.receiver_namespace)
    src.api = fake  # type: ignore[assignment]
    src.start()
    try:
        wait_for(src.synced)
        assert set(src.snapshot()) == {("a", "own")}
    finally:
        src.stop()
    assert {call.get("namespace") for call in fake.list_calls()} == {"a"}
    channels = channel_source_from_settings(settings, client.ApiClient())
    assert isinstance(channels, NoChannels)
    channels.start()
    assert channels.synced() and channels.snapshot() == {}
    assert sink_source(settings, client.ApiClient()) is None
