"""The CRDs shipped with the package (KafkaChannel; Broker and Trigger for clusters without Knative Eventing;
KafkaSink and KafkaSource for clusters without upstream's),
and a helper to install them (tests, benchmarks, local stack)."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

import yaml

CRD_NAME = "kafkachannels.messaging.knative.dev"
#: The files of crds/ by what they define.
CHANNEL_CRD = "kafkachannels.yaml"
BROKER_CRDS = ("brokers.yaml", "triggers.yaml")
SINK_CRDS = ("kafkasinks.yaml",)
SOURCE_CRD = "kafkasources.yaml"


def crd_manifest(file: str = CHANNEL_CRD) -> dict[str, Any]:
    text = resources.files("kafka_eventing.controller").joinpath(f"crds/{file}").read_text()
    return dict(yaml.safe_load(text))


def install_crd(api_client: Any, timeout: float = 60.0, file: str = CHANNEL_CRD) -> None:
    """Create (or replace) the CRD and wait until it is Established and served."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.ApiextensionsV1Api(api_client)
    body = crd_manifest(file)
    name = str(body["metadata"]["name"])
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.create_custom_resource_definition(body)
            break
        except ApiException as exc:
            if exc.status != 409:
                raise
        # Already there: replace it with this version, unless it is being deleted (a CRD with objects left goes
        # only once they are gone); one deleted between the two calls is created on the next pass.
        try:
            live = api.read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        else:
            if live.metadata.deletion_timestamp is None:
                body["metadata"]["resourceVersion"] = live.metadata.resource_version
                api.replace_custom_resource_definition(name, body)
                break
        if time.monotonic() >= deadline:
            raise TimeoutError(f"CRD {name} exists but could not be read and replaced within {timeout:.0f}s "
                               "(being deleted?)")
        time.sleep(0.2)
    while time.monotonic() < deadline:
        crd = api.read_custom_resource_definition(name)
        if any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or ())):
            return
        time.sleep(0.2)
    raise TimeoutError(f"CRD {name} not Established within {timeout:.0f}s")
