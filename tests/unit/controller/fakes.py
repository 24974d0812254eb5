"""Shared by the controller unit tests: settings, a dict-backed informer store, a fake Kafka Admin client, a
connection with KEDA on."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import ResolvedConnection, resolve
from kafka_eventing.controller.topics import (
    TopicError,
    TopicNotFound,
    TopicSpec,
    TopicState,
)
from kafka_eventing.core.settings import Settings

SETTINGS = Settings(system_namespace="knative-eventing", dispatcher_replicas=3, dispatcher_image="disp:1")


class DictStore:
    def __init__(self, *objs: Mapping[str, Any]) -> None:
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}

    def get(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objs.get((namespace, name))

    def items(self) -> list[Mapping[str, Any]]:
        return list(self.objs.values())


def _secret(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "knative-eventing", "labels": labels or {}},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


class FakeAdmin:
    def __init__(self, topics: dict[str, TopicState] | None = None, fail: TopicError | None = None) -> None:
        self.topics = topics or {}
        self.fail = fail
        self.calls: list[str] = []

    def describe(self, name: str) -> TopicState:
        if self.fail:
            raise self.fail
        if name not in self.topics:
            raise TopicNotFound(name)
        return self.topics[name]

    def create(self, spec: TopicSpec) -> None:
        self.calls.append("create")
        self.topics[spec.name] = TopicState(spec.name, spec.partitions, spec.retention_ms)

    def set_partitions(self, name: str, partitions: int) -> None:
        self.calls.append(f"partitions={partitions}")
        self.topics[name] = TopicState(name, partitions, self.topics[name].retention_ms)

    def set_retention(self, name: str, retention_ms: int) -> None:
        self.calls.append(f"retention={retention_ms}")
        self.topics[name] = TopicState(name, self.topics[name].partitions, retention_ms)

    def delete(self, name: str) -> None:
        self.topics.pop(name, None)

    def delete_group(self, group: str) -> None:
        self.calls.append(f"delete_group={group}")


def _deployment(partitions: int, secret: str | None = "kafka", checksum: str = "c1") -> dict[str, Any]:
    config = res.DispatcherConfig(replicas=3, checksum=checksum, secret_name=secret, bootstrap_servers="k:9092")
    return res.dispatcher_deployment(res.ChannelRef("team", "orders"), SETTINGS, config, partitions)


KEDA_CM = {"dispatcher.keda.enabled": "true", "dispatcher.keda.minReplicas": "2", "dispatcher.keda.maxReplicas": "10",
           "dispatcher.keda.lagThreshold": "25", "dispatcher.keda.pollingInterval": "10",
           "dispatcher.keda.cooldownPeriod": "60"}


def _keda_connection(secret: dict[str, str] | None, **cm: str) -> ResolvedConnection:
    """The connection of config-kafka with ``KEDA_CM`` (overridden by ``cm``) and, unless None, Secret ``creds``."""
    data = {**KEDA_CM, **cm, "bootstrap.servers": "b:9092"}
    if secret is not None:
        data["auth.secret.ref.name"] = "creds"
    config_map = {"metadata": {"name": "config-kafka", "namespace": "knative-eventing"}, "data": data}
    return resolve(SETTINGS, DictStore(config_map), DictStore(_secret("creds", secret or {})),
                   environ={"AWS_REGION": "eu-west-1"})




class StatusPatches:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def patch_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                              name: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append(body)
