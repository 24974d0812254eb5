"""KafkaSinks on the real API server: ``Sinks`` creates them and waits on their conditions (fixture ``sinks``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kafka_eventing.controller.crd import BROKER_CRDS, SINK_CRDS, install_crd
from kafka_eventing.controller.main import api_client
from kafka_eventing.core import sinks as ks
from kafka_eventing.localstack.kube import KubeControlPlane
from support.controller import Env, eventually

SINK_HOST = "kafka-sink-ingress"


class Sinks:
    def __init__(self, environment: Env) -> None:
        self.env, self.ns, self.custom = environment, environment.namespace, environment.custom

    def create(self, name: str, **spec: Any) -> None:
        body = {"apiVersion": f"{ks.GROUP}/{ks.VERSION}", "kind": ks.KIND,
                "metadata": {"name": name, "namespace": self.ns}, "spec": spec}
        self.custom.create_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, name))

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for c in (self.get(name).get("status") or {}).get("conditions") or ():
            if c["type"] == kind:
                return dict(c)
        return None

    def wait(self, name: str, kind: str, status: str, reason: str | None = None,
             timeout: float = 40) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition(name, kind)
            ok = c is not None and c["status"] == status and (reason is None or c.get("reason") == reason)
            return c if ok else None

        return eventually(check, timeout, f"KafkaSink {name} {kind}={status} {reason or ''}")

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(ks.GROUP, ks.VERSION, self.ns, ks.PLURAL, name)


@pytest.fixture
def sinks(env: Env) -> Iterator[Sinks]:
    yield Sinks(env)
    for ctl in env.controllers:
        ctl.stop()
    env.controllers.clear()




@pytest.fixture(scope="module")
def api(kube_control_plane: KubeControlPlane) -> Iterator[client.ApiClient]:
    c = api_client(kube_control_plane.kubeconfig)
    install_crd(c)
    for file in (*BROKER_CRDS, *SINK_CRDS):
        install_crd(c, file=file)
    yield c
    c.close()
