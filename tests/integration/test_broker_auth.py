"""Brokers with ingress authentication on, end to end: the real controller (it publishes the Broker's
``status.address.audience``, gives every Trigger its OIDC ServiceAccount and the dispatchers the right to request
exactly those accounts' tokens, resolves EventPolicies' ``from.ref``), the real receiver verifying tokens against the
real kube-apiserver's OIDC discovery and JWKS and enforcing the policies, real Broker dispatchers requesting their
tokens as the dispatchers' ServiceAccount (so the Role the controller wrote is what RBAC checks), and real Kafka.

Each Trigger sends as itself: its subscriber, its reply into the Broker and its dead-letter sink get tokens whose
subject is the Trigger's own account, and a policy that names the Trigger (``from.ref``) admits its replies under
deny-all. The attack this closes: a Trigger author in another namespace points a subscriber at their own server
with the audience of someone else's Broker, receives the token the dispatcher sends, and replays it — refused, and
nothing of it in that Broker's topic; the dispatchers cannot request any other account's token.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from support.broker_dispatch import PONG, RunningDispatcher, reply_with
from support.brokers import (
    Brokers,
)
from support.brokers import api as brokers_api
from support.dispatcher import Received, Subscriber
from support.receiver import Receiver, binary_headers, read_all

from fixtures.kube import account_client
from kafka_eventing.controller.crd import SOURCE_CRD, install_crd
from kafka_eventing.controller.kafkasources import source_dispatcher_name
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core import kafkasources as ks
from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import DISPATCHER_SERVICE_ACCOUNT, TOKEN_ROLE, TokenSource, kube_requester
from kafka_eventing.core.tokens import oidc_service_account as oidc_account
from kafka_eventing.dispatcher.sources import KubeSourceSource
from kafka_eventing.dispatcher.status import KubeTriggerStatusWriter, MemoryStatusWriter
from kafka_eventing.dispatcher.triggers import KubeTriggerSource
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import wait_for

#: The module's API server, with these kinds' CRDs (a fixture, used by name).
api = brokers_api

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

BROKER = "secured"
SUBSCRIBER_AUDIENCE = "https://replier.example/ingest"
DLS_AUDIENCE = "https://dead-letters.example"


@pytest.fixture
def http() -> Iterator[Subscriber]:
    with Subscriber().running() as sub:
        yield sub


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def bearer(received: Received) -> str | None:
    value = next((v for k, v in received.headers.items() if k.lower() == "authorization"), None)
    return value.removeprefix("Bearer ") if value else None


def account_token(core: Any, namespace: str, account: str, audiences: list[str]) -> str:
    from kubernetes import client

    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=account)))
    spec = client.V1TokenRequestSpec(audiences=audiences, expiration_seconds=600)
    res = core.create_namespaced_service_account_token(account, namespace,
                                                       client.AuthenticationV1TokenRequest(spec=spec))
    return str(res.status.token)


def trigger_subject(namespace: str, name: str) -> str:
    return ep.service_account_subject(namespace, oidc_account(kb.GROUP, "Trigger", name))


def test_each_trigger_sends_as_itself_and_a_token_it_received_opens_no_other_broker(
        brokers: Brokers, http: Subscriber, start_receiver: Callable[..., Receiver],
        kube_control_plane: KubeControlPlane, tmp_path: Path) -> None:
    from kubernetes import client

    e = brokers.env
    ns, issuer = e.namespace, kube_control_plane.server
    mallory = f"{ns}-m"  # another tenant, who may create Brokers and Triggers in their own namespace only
    api_client = kube_control_plane.api_client()
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=mallory)))
    install_crd(e.api, file="eventpolicies.yaml")
    install_crd(e.api, file=SOURCE_CRD)
    e.start_controller(e.settings(auth_issuer=issuer, event_policy_status=True), brokers=True, sources=True)
    theirs = Brokers(e)
    theirs.ns = mallory
    brokers.ready_broker(BROKER)
    theirs.ready_broker("own")
    audience = kb.broker_audience(ns, BROKER)
    # Auth on: the controller publishes the audience senders ask tokens for, in Knative's format.
    assert brokers.get(kb.BROKERS, BROKER)["status"]["address"]["audience"] == audience == (
        f"eventing.knative.dev/broker/{ns}/{BROKER}")

    own = tmp_path / "receiver-token"  # the receiver's identity for discovery and keys
    own.write_text(account_token(core, ns, "receiver", []))  # the API server's own audience
    sender = account_token(core, ns, "sender", [audience])
    elsewhere = account_token(core, ns, "elsewhere", [kb.broker_audience(ns, "other")])
    mallorys = account_token(core, mallory, "mallory", [kb.broker_audience(mallory, "own")])
    # The victim's Broker: deny-all where no policy applies, and one policy naming a ServiceAccount and a Trigger.
    e.custom.create_namespaced_custom_object(ep.GROUP, ep.VERSION, ns, ep.PLURAL, {
        "apiVersion": ep.API_VERSION, "kind": ep.KIND, "metadata": {"name": "senders"},
        "spec": {"to": [{"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": BROKER}}],
                 "from": [{"sub": ep.service_account_subject(ns, "sender")},
                          {"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger", "name": "replier",
                                   "namespace": ns}},
                          {"ref": {"apiVersion": f"{ks.GROUP}/{ks.VERSION}", "kind": ks.KIND, "name": "feed",
                                   "namespace": ns}}]}})

    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig),
        "KE_AUTH_ISSUER": issuer, "KE_AUTH_CA_FILE": str(kube_control_plane.ca_path),
        "KE_AUTH_TOKEN_FILE": str(own), "KE_AUTH_DEFAULT_MODE": "allow-same-namespace"})
    ingress = receiver.url + f"/{ns}/{BROKER}"
    http.behaviours.update({"/replier": reply_with(PONG), "/failing": lambda _r, _a: (500, {}, b"broken", 0.0),
                            "/stray": reply_with({**PONG, "ce-id": "stray-pong"})})
    brokers.trigger("replier", {"broker": BROKER, "subscriber": {"uri": http.url("/replier"),
                                                                 "audience": SUBSCRIBER_AUDIENCE},
                                "filters": [{"exact": {"type": "com.example.ping"}}]})
    # Replies too, but no policy names it: its reply is refused under the victim's policy.
    brokers.trigger("stray", {"broker": BROKER, "subscriber": {"uri": http.url("/stray")},
                              "filters": [{"exact": {"type": "com.example.stray"}}]})
    brokers.trigger("pongs", {"broker": BROKER, "subscriber": {"uri": http.url("/pongs")},
                              "filters": [{"exact": {"type": "com.example.pong"}}]})
    brokers.trigger("failing", {"broker": BROKER, "subscriber": {"uri": http.url("/failing")},
                                "filters": [{"exact": {"type": "com.example.fail"}}],
                                "delivery": {"deadLetterSink": {"uri": http.url("/dls"), "audience": DLS_AUDIENCE}}})
    brokers.trigger("from-feed", {"broker": BROKER, "subscriber": {"uri": http.url("/feed")},
                                  "filters": [{"exact": {"type": "com.example.feed"}}]})
    # A KafkaSource into the Broker: it sends as its own account, which the policy names.
    topic = f"test.feed.{e.namespace}"
    for fut in e.admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    producer = Producer(e.kafka.client_config())
    producer.produce(topic, value=b"{}", headers=[("ce_specversion", b"1.0"), ("ce_id", b"src-1"),
                                                 ("ce_source", b"/feed"), ("ce_type", b"com.example.feed")])
    assert producer.flush(30) == 0
    e.custom.create_namespaced_custom_object(ks.GROUP, ks.VERSION, ns, ks.PLURAL, {
        "apiVersion": f"{ks.GROUP}/{ks.VERSION}", "kind": ks.KIND, "metadata": {"name": "feed"},
        "spec": {"bootstrapServers": [e.kafka.bootstrap_servers], "topics": [topic], "initialOffset": "earliest",
                 "sink": {"uri": ingress, "audience": audience}}})
    # The attack: a subscriber of one's own, with the audience of the victim's Broker.
    theirs.trigger("thief", {"broker": "own", "subscriber": {"uri": http.url("/thief"), "audience": audience}})

    # The dispatchers request tokens as their own ServiceAccount: only the Roles the controller wrote let them.
    dispatcher_client = account_client(kube_control_plane, e.system, DISPATCHER_SERVICE_ACCOUNT,
                                       tmp_path / "dispatcher.kubeconfig")
    running: list[RunningDispatcher] = []
    try:
        for namespace, name, reply_to in ((ns, BROKER, ingress), (mallory, "own", receiver.url + f"/{mallory}/own")):
            settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, broker_namespace=namespace,
                                broker_name=name, log_level="WARNING", auth_issuer=issuer,
                                kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
            source = KubeTriggerSource(api_client, namespace, name, reply_uri=reply_to, authenticated=True)
            running.append(RunningDispatcher(settings, source, KubeTriggerStatusWriter(api_client),
                                             tokens=TokenSource(kube_requester(dispatcher_client))))
        feed = wait_for(lambda: e.custom.get_namespaced_custom_object(ks.GROUP, ks.VERSION, ns, ks.PLURAL, "feed")
                        ["status"]["auth"], 60, "the KafkaSource's identity", tolerate=(KeyError,))
        assert feed == {"serviceAccountName": oidc_account(ks.GROUP, ks.KIND, "feed")} == {
            "serviceAccountName": "feed-oidc-sources.knative.dev-kafkasource"}
        tokens = running[0].dispatcher.tokens
        assert tokens is not None
        for name in ("replier", "stray", "pongs", "failing", "from-feed"):
            brokers.wait(kb.TRIGGERS, name, "Ready", "True", timeout=60)
            trigger = brokers.get(kb.TRIGGERS, name)
            account = oidc_account(kb.GROUP, "Trigger", name)
            # Knative's name and field; the account is the Trigger's (deleted with it) and labelled as upstream's.
            assert trigger["status"]["auth"] == {"serviceAccountName": account}
            sa = core.read_namespaced_service_account(account, ns)
            assert [(o.kind, o.name, o.controller) for o in sa.metadata.owner_references] == [("Trigger", name, True)]
            assert sa.metadata.labels == {"eventing.knative.dev/oidc": "enabled"}
        theirs.wait(kb.TRIGGERS, "thief", "Ready", "True", timeout=60)
        role = rbac.read_namespaced_role(TOKEN_ROLE, ns)
        (rule,) = role.rules
        assert (rule.resources, rule.verbs, sorted(rule.resource_names)) == (
            ["serviceaccounts/token"], ["create"],
            sorted([*(oidc_account(kb.GROUP, "Trigger", n) for n in ("replier", "stray", "pongs", "failing",
                                                                      "from-feed")),
                    oidc_account(ks.GROUP, ks.KIND, "feed")]))
        wait_for(lambda: all(len(r.dispatcher.status_document()["subscriptions"]) == n
                             for r, n in zip(running, (5, 1), strict=True)), 60, "groups joined")
        # The policy's from.ref resolved to the Trigger's account.
        wait_for(lambda: (e.custom.get_namespaced_custom_object(ep.GROUP, ep.VERSION, ns, ep.PLURAL, "senders")
                          .get("status") or {}).get("from"), 30, "the policy's subjects resolved")
        resolved = e.custom.get_namespaced_custom_object(ep.GROUP, ep.VERSION, ns, ep.PLURAL, "senders")["status"]
        assert resolved["from"] == [ep.service_account_subject(ns, "sender"), trigger_subject(ns, "replier"),
                                    ep.service_account_subject(ns, oidc_account(ks.GROUP, ks.KIND, "feed"))]
        # The source's dispatcher once the policy names it (before, its events would be refused: no dead letters).
        e.make_available(source_dispatcher_name(ns, "feed"))
        settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, channel_source="kube",
                            source_namespace=ns, source_name="feed", log_level="WARNING",
                            kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
        running.append(RunningDispatcher(settings, KubeSourceSource(api_client, ns, "feed"),
                                         MemoryStatusWriter(), tokens=TokenSource(kube_requester(dispatcher_client))))

        def send(url: str, event_id: str, event_type: str, token: str | None) -> httpx.Response:
            headers = {**binary_headers(event_id), "ce-type": event_type}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            return httpx.post(url, content=b"{}", headers=headers, timeout=20)

        assert send(ingress, "no-token", "com.example.ping", None).status_code == 401
        assert send(ingress, "other-audience", "com.example.ping", elsewhere).status_code == 403
        assert send(ingress, "ping-1", "com.example.ping", sender).status_code == 202
        assert send(ingress, "f-1", "com.example.fail", sender).status_code == 202
        assert send(ingress, "s-1", "com.example.stray", sender).status_code == 202
        assert send(receiver.url + f"/{mallory}/own", "bait", "com.example.anything", mallorys).status_code == 202

        # The reply went into the Broker as the Trigger "replier", which the policy names.
        wait_for(lambda: http.ids("/pongs") == ["pong-1"], 60, "the reply routed back through the secured Broker")
        wait_for(lambda: http.ids("/dls") == ["f-1"], 60, "the failing delivery dead-lettered")
        wait_for(lambda: http.ids("/thief") == ["bait"], 60, "the thief's subscriber got its event")
        wait_for(lambda: http.ids("/stray") == ["s-1"], 60, "the stray Trigger's delivery")
        # The KafkaSource's event went in as the source, which the policy names (from.ref KafkaSource).
        wait_for(lambda: http.ids("/feed") == ["src-1"], 60, "the source's event through the secured Broker")
        for path, want, sub in (("/replier", SUBSCRIBER_AUDIENCE, trigger_subject(ns, "replier")),
                                ("/dls", DLS_AUDIENCE, trigger_subject(ns, "failing")),
                                ("/thief", audience, trigger_subject(mallory, "thief"))):
            token = bearer(http.at(path)[0])
            assert token is not None, f"{path} got no token"
            got = claims(token)
            assert (got["aud"], got["sub"], got["iss"]) == ([want], sub, issuer), path
        # A destination that declares no audience gets no token (it is not ours to hand out).
        assert bearer(http.at("/pongs")[0]) is None and bearer(http.at("/failing")[0]) is None

        # The stolen token: the right audience, but the subject is the thief's own Trigger, which no policy names.
        stolen = bearer(http.at("/thief")[0])
        res = send(ingress, "replayed", "com.example.ping", stolen)
        assert res.status_code == 403 and trigger_subject(mallory, "thief") in res.json()["error"], res.text
        # Nor anywhere else: its audience is that one Broker's.
        assert send(receiver.url + f"/{mallory}/own", "replayed-2", "com.example.x", stolen).status_code == 403

        # The dispatchers may request exactly the senders' accounts' tokens: not a user's, nor another namespace's.
        requester = kube_requester(dispatcher_client)
        assert requester((ns, oidc_account(kb.GROUP, "Trigger", "replier")), "any")[0]
        for identity in ((ns, "sender"), (ns, "default"), ("kube-system", "default"),
                         (e.system, DISPATCHER_SERVICE_ACCOUNT)):
            with pytest.raises(client.ApiException) as refused:
                requester(identity, audience)
            assert refused.value.status == 403, identity

        # The stray Trigger's reply was refused at the ingress (not named), so it never reached the topic.
        ids = {event_from_kafka(m.headers(), m.value()).get_id()
               for m in read_all(e.kafka, kb.broker_topic(ns, BROKER))}
        assert ids == {"ping-1", "f-1", "s-1", "pong-1", "src-1"}, ids

        # A deleted Trigger's account leaves the Role.
        brokers.delete(kb.TRIGGERS, "stray")
        wait_for(lambda: oidc_account(kb.GROUP, "Trigger", "stray") not in (
            rbac.read_namespaced_role(TOKEN_ROLE, ns).rules[0].resource_names), 60, "the stray account off the Role")
    finally:
        for r in running:
            r.stop()
        # What would outlive the test: controllers of later tests watch every namespace and would reconcile it (a
        # dispatcher Deployment in their system namespace). Finalizers go with the controller that is stopping.
        e.controllers[0].stop()
        e.controllers.clear()
        for namespace, group, version, plural in ((mallory, kb.GROUP, kb.VERSION, kb.BROKERS),
                                                  (mallory, kb.GROUP, kb.VERSION, kb.TRIGGERS),
                                                  (ns, ks.GROUP, ks.VERSION, ks.PLURAL)):
            for item in e.custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]:
                name = item["metadata"]["name"]
                with contextlib.suppress(client.ApiException):
                    e.custom.patch_namespaced_custom_object(group, version, namespace, plural, name,
                                                            {"metadata": {"finalizers": []}},
                                                            _content_type="application/merge-patch+json")
                    e.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(mallory)
        api_client.close()


def test_with_exactly_the_charts_rbac_the_controller_grants_the_dispatchers_a_triggers_token_and_no_more(
        brokers: Brokers, kube_control_plane: KubeControlPlane, tmp_path: Path) -> None:
    """The controller's side of the RBAC, as the chart grants it (escalate and bind on the token Role's name only):
    it creates a Trigger's account and the Role and RoleBinding, and then the dispatchers may request that account's
    token. What it was not granted stays refused: another Role name, a ClusterRole; an account of the Trigger's name
    that the Trigger does not own is refused with a condition, not granted."""
    from kubernetes import client

    from chart.render import helm, of_kind
    from kafka_eventing.controller.identities import OIDC_IDENTITY_CREATED, Identities

    e = brokers.env
    admin = kube_control_plane.api_client()
    rbac = client.RbacAuthorizationV1Api(admin)
    (rendered,) = [d for d in of_kind(helm(), "ClusterRole") if d["metadata"]["name"].endswith("-controller")]
    role = {**copy.deepcopy(rendered), "metadata": {"name": f"controller-{e.system}"}}  # the render is cached
    rbac.create_cluster_role(role)
    e.core.create_namespaced_service_account(e.system, {"metadata": {"name": "controller"}})
    rbac.create_cluster_role_binding({
        "metadata": {"name": f"controller-{e.system}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"controller-{e.system}"},
        "subjects": [{"kind": "ServiceAccount", "name": "controller", "namespace": e.system}]})
    try:
        as_controller = account_client(kube_control_plane, e.system, "controller", tmp_path / "controller.kubeconfig")
        identities = Identities(as_controller, e.settings(auth_issuer=kube_control_plane.server))
        brokers.trigger("t", {"broker": "b", "subscriber": {"uri": "http://sub.example"}})
        trigger = brokers.get(kb.TRIGGERS, "t")
        status: dict[str, Any] = {}
        created = identities.ensure(f"{kb.GROUP}/{kb.VERSION}", "Trigger", trigger, status)
        assert created.is_true and created.type == OIDC_IDENTITY_CREATED, created
        account = oidc_account(kb.GROUP, "Trigger", "t")
        assert status["auth"] == {"serviceAccountName": account}

        dispatcher = account_client(kube_control_plane, e.system, DISPATCHER_SERVICE_ACCOUNT,
                                    tmp_path / "dispatcher.kubeconfig")
        wait_for(lambda: kube_requester(dispatcher)((e.namespace, account), "aud")[0], 30,
                 "the dispatcher may request the Trigger's token", tolerate=(client.ApiException,))
        with pytest.raises(client.ApiException) as refused:
            kube_requester(dispatcher)((e.namespace, "default"), "aud")
        assert refused.value.status == 403

        # Escalation is granted on the token Role's name only: the same rule under another name is refused.
        other = client.RbacAuthorizationV1Api(as_controller)
        other.create_namespaced_role(e.namespace, {"metadata": {"name": "other"}, "rules": []})
        with pytest.raises(client.ApiException) as escalation:
            other.replace_namespaced_role("other", e.namespace, {"metadata": {"name": "other"}, "rules": [
                {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}]})
        assert escalation.value.status == 403
        with pytest.raises(client.ApiException) as cluster_wide:
            other.create_cluster_role({"metadata": {"name": f"x-{e.system}"}, "rules": []})
        assert cluster_wide.value.status == 403

        # An account of the Trigger's name that the Trigger does not own is not taken over, nor granted.
        squatted = oidc_account(kb.GROUP, "Trigger", "squat")
        e.core.create_namespaced_service_account(e.namespace, {"metadata": {"name": squatted}})
        brokers.trigger("squat", {"broker": "b", "subscriber": {"uri": "http://sub.example"}})
        status = {}
        refused_identity = identities.ensure(f"{kb.GROUP}/{kb.VERSION}", "Trigger", brokers.get(kb.TRIGGERS, "squat"),
                                             status)
        assert (refused_identity.status, refused_identity.reason) == ("False", "OIDCIdentityFailed")
        assert "not owned by Trigger squat" in refused_identity.message and status["auth"] is None
        assert squatted not in rbac.read_namespaced_role(TOKEN_ROLE, e.namespace).rules[0].resource_names
    finally:
        rbac.delete_cluster_role_binding(f"controller-{e.system}")
        rbac.delete_cluster_role(f"controller-{e.system}")
        admin.close()
