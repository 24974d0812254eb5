"""Who may send to what, on the real receiver with real tokens: EventPolicies and KafkaChannels in the real
kube-apiserver (Knative's EventPolicy schema, the chart's copy), ServiceAccount tokens minted by it (TokenRequest)
and verified through its OIDC discovery and JWKS, events in real Kafka.

Each rule has a positive and a negative case: a policy that allows one ServiceAccount and not another (of the same
namespace, which the default mode alone would let in), a label selector, a policy's filters (prefix and CESQL)
refusing an event and a batch, a wrong audience, no token, the default modes allow-same-namespace and deny-all where
no policy applies, and a policy created and deleted while the receiver runs. Every 401 and 403 leaves nothing in
the topic (read back at the end).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.controller import Env, eventually
from support.receiver import Receiver, binary_headers, read_all

from kafka_eventing.controller.crd import install_crd
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.channels import default_audience
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.kube]

CHANNELS = ("messaging.knative.dev", "v1beta1", "kafkachannels")


def account_token(core: Any, namespace: str, account: str, audiences: list[str]) -> str:
    from kubernetes import client

    with contextlib.suppress(client.ApiException):  # 409: made for an earlier token
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=account)))
    spec = client.V1TokenRequestSpec(audiences=audiences, expiration_seconds=600)
    res = core.create_namespaced_service_account_token(account, namespace,
                                                       client.AuthenticationV1TokenRequest(spec=spec))
    return str(res.status.token)


def ready_channel(objects: Any, namespace: str, name: str, topic: str, labels: dict[str, str]) -> None:
    """A KafkaChannel on ``topic`` that the receiver serves: TopicReady as the controller would report it."""
    group, version, plural = CHANNELS
    objects.create_namespaced_custom_object(group, version, namespace, plural, {
        "apiVersion": f"{group}/{version}", "kind": "KafkaChannel",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": {"kafka.eventing.knative.dev/external.topic": topic}},
        "spec": {"numPartitions": 1}})
    objects.patch_namespaced_custom_object_status(group, version, namespace, plural, name, {"status": {
        "conditions": [{"type": "TopicReady", "status": "True"}, {"type": "Ready", "status": "True"}]}})


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": ep.API_VERSION, "kind": ep.KIND, "metadata": {"name": name}, "spec": spec}


def test_event_policies_and_default_modes_with_real_tokens(
        kafka_running: KafkaNode, topic: str, tmp_path: Path, kube_control_plane: KubeControlPlane,
        kube_namespace: str, start_receiver: Callable[..., Receiver]) -> None:
    from kubernetes import client

    ns = kube_namespace
    elsewhere = f"{ns}-x"
    admin = kube_control_plane.api_client()
    core, objects = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    install_crd(admin)
    install_crd(admin, file="eventpolicies.yaml")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=elsewhere)))
    try:
        for name, labels in (("orders", {}), ("open", {}), ("typed", {"tier": "typed"})):
            ready_channel(objects, ns, name, topic, labels)
        audiences = [default_audience(ns, c) for c in ("orders", "open", "typed")]
        own = tmp_path / "receiver-token"  # the receiver's identity for discovery and keys
        own.write_text(account_token(core, ns, "receiver", []))
        allowed = account_token(core, ns, "allowed", audiences)
        denied = account_token(core, ns, "denied", audiences)
        filtered = account_token(core, ns, "filtered", audiences)
        outsider = account_token(core, elsewhere, "outsider", audiences)
        wrong_audience = account_token(core, ns, "allowed", [default_audience(ns, "payments")])

        def create(body: dict[str, Any]) -> None:
            objects.create_namespaced_custom_object(ep.GROUP, ep.VERSION, ns, ep.PLURAL, body)

        create(policy("orders-senders", {
            "to": [{"ref": {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
                            "name": "orders"}}],
            "from": [{"sub": f"system:serviceaccount:{ns}:allowed"}]}))
        create(policy("typed-events", {
            "to": [{"selector": {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
                                 "matchLabels": {"tier": "typed"}}}],
            "from": [{"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "filtered"}}],
            "filters": [{"prefix": {"type": "com.example."}}, {"cesql": "source LIKE '/shop/%'"}]}))

        env = {"KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig),
               "KE_AUTH_ISSUER": kube_control_plane.server, "KE_AUTH_CA_FILE": str(kube_control_plane.ca_path),
               "KE_AUTH_TOKEN_FILE": str(own)}
        receiver = start_receiver("", bootstrap=kafka_running.bootstrap_servers,
                                  env={**env, "KE_AUTH_DEFAULT_MODE": "allow-same-namespace"})
        ready = httpx.get(receiver.url + "/readyz", timeout=5).json()
        assert ready["eventpolicies"] is True, ready  # ready only once the policies are read

        def post(to: Receiver, channel: str, event_id: str, token: str | None, event_type: str = "com.example.e",
                 source: str = "/shop/1") -> tuple[int, str]:
            headers = {**binary_headers(event_id), "ce-type": event_type, "ce-source": source}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            res = to.post(f"/{ns}/{channel}", b"{}", headers)
            return res.status_code, res.text

        def refused(to: Receiver, channel: str, event_id: str, token: str | None, code: int, why: str,
                    **kw: str) -> None:
            status, text = post(to, channel, event_id, token, **kw)
            assert (status, why in text) == (code, True), (channel, event_id, status, text)

        # A policy applies to orders: only the subject it names, though "denied" is of the same namespace.
        refused(receiver, "orders", "no-token", None, 401, "bearer token")
        refused(receiver, "orders", "wrong-audience", wrong_audience, 403, "audience")
        assert post(receiver, "orders", "a-1", allowed) == (202, "")
        refused(receiver, "orders", "denied-1", denied, 403, "orders-senders")
        refused(receiver, "orders", "outsider-1", outsider, 403, "orders-senders")

        # The selector's policy with filters: the right ServiceAccount and an event that passes them.
        assert post(receiver, "typed", "t-1", filtered)[0] == 202
        refused(receiver, "typed", "t-bad-type", filtered, 403, "filters", event_type="org.other.e")
        refused(receiver, "typed", "t-bad-source", filtered, 403, "filters", source="/elsewhere/1")
        refused(receiver, "typed", "t-allowed-elsewhere", allowed, 403, "typed-events")
        batch = [{"specversion": "1.0", "id": i, "source": "/shop/b", "type": t}
                 for i, t in (("b-ok", "com.example.e"), ("b-bad", "org.other.e"))]
        res = receiver.post(f"/{ns}/typed", json.dumps(batch).encode(), {
            "content-type": "application/cloudevents-batch+json", "Authorization": f"Bearer {filtered}"})
        assert res.status_code == 403, res.text  # one event refused: none of the batch is written

        # No policy applies to open: allow-same-namespace decides.
        assert post(receiver, "open", "o-1", denied)[0] == 202
        refused(receiver, "open", "o-outsider", outsider, 403, "allow-same-namespace")

        # A policy created while the receiver runs applies to open at once (each worker watches), and deleting
        # it gives the default mode back. Watched until every worker agrees: refused requests write nothing.
        create(policy("open-outsiders", {"to": [{"ref": {"kind": "KafkaChannel", "name": "open",
                                                         "apiVersion": "messaging.knative.dev/v1beta1"}}],
                                         "from": [{"sub": f"system:serviceaccount:{elsewhere}:*"}]}))
        wait_for(lambda: all(post(receiver, "open", "o-denied-now", denied)[0] == 403 for _ in range(8)), 30,
                 "the new policy enforced by every worker")
        assert post(receiver, "open", "o-2", outsider)[0] == 202
        objects.delete_namespaced_custom_object(ep.GROUP, ep.VERSION, ns, ep.PLURAL, "open-outsiders")
        wait_for(lambda: all(post(receiver, "open", "o-outsider-again", outsider)[0] == 403 for _ in range(8)),
                 30, "the default mode back on every worker")

        # deny-all: where no policy applies nobody may send; where one does, it still decides.
        strict = start_receiver("", bootstrap=kafka_running.bootstrap_servers,
                                env={**env, "KE_AUTH_DEFAULT_MODE": "deny-all"})
        refused(strict, "open", "deny-all-1", denied, 403, "deny-all")
        assert post(strict, "orders", "d-1", allowed)[0] == 202

        ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, topic)}
        assert ids == {"a-1", "t-1", "o-1", "o-2", "d-1"}
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(elsewhere)
        admin.close()



def test_the_controller_reports_policies_on_targets_and_on_themselves(
        env: Env, kube_control_plane: KubeControlPlane) -> None:
    """The real controller on the real apiserver: which policies apply to a KafkaChannel (``status.policies``,
    EventPoliciesReady), and each policy's own status where the chart owns the CRD (``status.from``, Ready with a
    reason)."""
    e = env
    install_crd(e.api, file="eventpolicies.yaml")
    e.start_controller(e.settings(auth_issuer=kube_control_plane.server, event_policy_status=True))
    e.create("orders")
    e.custom.patch_namespaced_custom_object(*CHANNELS[:2], e.namespace, CHANNELS[2], "orders",
                                            {"metadata": {"labels": {"team": "a"}}},
                                            _content_type="application/merge-patch+json")

    def create(name: str, spec: dict[str, Any]) -> None:
        e.custom.create_namespaced_custom_object(ep.GROUP, ep.VERSION, e.namespace, ep.PLURAL, policy(name, spec))

    def policy_ready(name: str) -> dict[str, Any] | None:
        obj = e.custom.get_namespaced_custom_object(ep.GROUP, ep.VERSION, e.namespace, ep.PLURAL, name)
        ready = next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), None)
        return {**obj["status"], "ready": ready} if ready else None

    # No policy yet: the default mode, said on the channel.
    assert e.wait_condition("orders", ep.TARGET_POLICIES_READY, "True")["reason"] == "DefaultAuthorizationMode"
    create("team-a", {"to": [{"selector": {"matchLabels": {"team": "a"}}}],
                      "from": [{"sub": f"system:serviceaccount:{e.namespace}:*"},
                               {"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "billing"}}]})
    create("team-b", {"to": [{"selector": {"matchLabels": {"team": "b"}}}], "from": [{"sub": "x"}]})
    create("from-a-source", {"to": [{"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                                             "name": "orders"}}],
                             "from": [{"ref": {"apiVersion": "sources.knative.dev/v1", "kind": "PingSource",
                                               "name": "tick"}}]})

    status = eventually(lambda: (s := policy_ready("team-a")) and s, 40, "team-a's status")
    assert status["from"] == [f"system:serviceaccount:{e.namespace}:*",
                              f"system:serviceaccount:{e.namespace}:billing"]
    assert (status["ready"]["status"], status["observedGeneration"]) == ("True", 1)
    unresolved = eventually(lambda: (s := policy_ready("from-a-source")) and s, 40, "from-a-source's status")
    assert (unresolved["ready"]["status"], unresolved["ready"]["reason"]) == ("False", "SubjectsNotResolved")
    assert "PingSource" in unresolved["ready"]["message"]

    eventually(lambda: (e.get("orders").get("status") or {}).get("policies") ==
               [{"apiVersion": ep.API_VERSION, "name": "team-a"}], 40, "status.policies of the channel")
    assert e.condition("orders", ep.TARGET_POLICIES_READY)["reason"] == "EventPoliciesReady"  # type: ignore[index]

    # A policy that cannot be used closes the namespace: it applies, and the channel says so. (A `to` entry naming
    # neither a ref nor a selector is refused at apply by the CRD; a selector's operator only the controller checks.)
    create("broken", {"to": [{"selector": {"matchExpressions": [{"key": "team", "operator": "Near"}]}}],
                      "from": [{"sub": "x"}]})
    cond = e.wait_condition("orders", ep.TARGET_POLICIES_READY, "False")
    assert cond["reason"] == "EventPoliciesNotReady" and "broken" in cond["message"]
    assert [p["name"] for p in e.get("orders")["status"]["policies"]] == ["broken", "team-a"]
    broken = eventually(lambda: (s := policy_ready("broken")) and s, 40, "broken's status")
    assert (broken["ready"]["reason"], "spec.to[0]" in broken["ready"]["message"]) == ("InvalidSpec", True)
