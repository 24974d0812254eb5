"""A Broker with ingress authentication on, end to end: the real controller (it publishes the Broker's
``status.address.audience``), the real receiver verifying tokens against the real kube-apiserver's OIDC discovery
and JWKS, the real Broker dispatcher obtaining its tokens with TokenRequest on that apiserver, and real Kafka.

The case that failed before the dispatcher sent tokens: a Trigger's reply goes back into the Broker, whose ingress
answers 401 without a token — the reply now arrives at the Trigger that matches it. A dead-letter sink and a
subscriber that declare an audience get a token for exactly that audience. Senders without a token or with another
audience's are refused, and nothing of theirs is in the Broker's topic.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_broker_conformance import PONG, RunningDispatcher, reply_with
from test_broker_controller import Brokers, api, brokers, start  # noqa: F401 - fixtures used by name
from test_controller import Env, env  # noqa: F401
from test_dispatcher import Received, Subscriber
from test_receiver import Receiver, binary_headers, read_all, start_receiver  # noqa: F401

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import TokenSource, kube_requester
from kafka_eventing.dispatcher.status import KubeTriggerStatusWriter
from kafka_eventing.dispatcher.triggers import KubeTriggerSource
from kafka_eventing.localstack.kube import KubeControlPlane
from waiting import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

BROKER = "secured"
DISPATCHER_ACCOUNT = "kafka-channel-dispatcher"
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


def test_broker_replies_and_dead_letters_carry_the_dispatchers_tokens(
        brokers: Brokers, http: Subscriber, start_receiver: Callable[..., Receiver],  # noqa: F811
        kube_control_plane: KubeControlPlane, tmp_path: Path) -> None:
    from kubernetes import client

    e = brokers.env
    issuer = kube_control_plane.server
    start(e, auth_issuer=issuer)
    brokers.ready_broker(BROKER)
    audience = kb.broker_audience(e.namespace, BROKER)
    # Auth on: the controller publishes the audience senders ask tokens for, in Knative's format.
    address = brokers.get(kb.BROKERS, BROKER)["status"]["address"]
    assert address["audience"] == audience == f"eventing.knative.dev/broker/{e.namespace}/{BROKER}"

    api_client = kube_control_plane.api_client()
    core = client.CoreV1Api(api_client)
    own = tmp_path / "receiver-token"  # the receiver's identity for discovery and keys
    own.write_text(account_token(core, e.namespace, "receiver", []))  # the API server's own audience
    sender = account_token(core, e.namespace, "sender", [audience])
    elsewhere = account_token(core, e.namespace, "elsewhere", [kb.broker_audience(e.namespace, "other")])
    core.create_namespaced_service_account(e.namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=DISPATCHER_ACCOUNT)))

    receiver = start_receiver("", bootstrap=e.kafka.bootstrap_servers, env={
        "KE_CHANNEL_SOURCE": "kube", "KE_KUBECONFIG": str(kube_control_plane.kubeconfig),
        "KE_AUTH_ISSUER": issuer, "KE_AUTH_CA_FILE": str(kube_control_plane.ca_path),
        "KE_AUTH_TOKEN_FILE": str(own)})
    ingress = receiver.url + f"/{e.namespace}/{BROKER}"
    http.behaviours.update({"/replier": reply_with(PONG), "/failing": lambda _r, _a: (500, {}, b"broken", 0.0)})
    brokers.trigger("replier", {"broker": BROKER, "subscriber": {"uri": http.url("/replier"),
                                                                 "audience": SUBSCRIBER_AUDIENCE},
                                "filters": [{"exact": {"type": "com.example.ping"}}]})
    brokers.trigger("pongs", {"broker": BROKER, "subscriber": {"uri": http.url("/pongs")},
                              "filters": [{"exact": {"type": "com.example.pong"}}]})
    brokers.trigger("failing", {"broker": BROKER, "subscriber": {"uri": http.url("/failing")},
                                "filters": [{"exact": {"type": "com.example.fail"}}],
                                "delivery": {"deadLetterSink": {"uri": http.url("/dls"), "audience": DLS_AUDIENCE}}})

    settings = Settings(bootstrap_servers=e.kafka.bootstrap_servers, broker_namespace=e.namespace,
                        broker_name=BROKER, log_level="WARNING", auth_issuer=issuer,
                        kafka_extra="session.timeout.ms=6000,heartbeat.interval.ms=500")
    tokens = TokenSource(kube_requester(api_client, e.namespace, DISPATCHER_ACCOUNT))
    source = KubeTriggerSource(api_client, e.namespace, BROKER, reply_uri=ingress, authenticated=True)
    running = RunningDispatcher(settings, source, KubeTriggerStatusWriter(api_client), tokens=tokens)
    try:
        for name in ("replier", "pongs", "failing"):
            brokers.wait(kb.TRIGGERS, name, "Ready", "True", timeout=60)
        wait_for(lambda: len(running.dispatcher.status_document()["subscriptions"]) == 3, 60, "groups joined")

        def send(event_id: str, event_type: str, token: str | None) -> httpx.Response:
            headers = {**binary_headers(event_id), "ce-type": event_type}
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            return httpx.post(ingress, content=b"{}", headers=headers, timeout=20)

        assert send("no-token", "com.example.ping", None).status_code == 401
        assert send("other-audience", "com.example.ping", elsewhere).status_code == 403
        assert send("ping-1", "com.example.ping", sender).status_code == 202
        assert send("f-1", "com.example.fail", sender).status_code == 202

        # The reply went into the Broker through the authenticating ingress, with the dispatcher's token.
        wait_for(lambda: http.ids("/pongs") == ["pong-1"], 60, "the reply routed back through the secured Broker")
        wait_for(lambda: http.ids("/dls") == ["f-1"], 60, "the failing delivery dead-lettered")
        ours = f"system:serviceaccount:{e.namespace}:{DISPATCHER_ACCOUNT}"
        for path, want in (("/replier", SUBSCRIBER_AUDIENCE), ("/dls", DLS_AUDIENCE)):
            token = bearer(http.at(path)[0])
            assert token is not None, f"{path} got no token"
            got = claims(token)
            assert (got["aud"], got["sub"], got["iss"]) == ([want], ours, issuer), path
        # A destination that declares no audience gets no token (it is not ours to hand out).
        assert bearer(http.at("/pongs")[0]) is None and bearer(http.at("/failing")[0]) is None
        assert tokens.requests == 3  # subscriber, Broker ingress, dead-letter sink: one each, then the cache

        ids = {event_from_kafka(m.headers(), m.value()).get_id()
               for m in read_all(e.kafka, kb.broker_topic(e.namespace, BROKER))}
        assert ids == {"ping-1", "f-1", "pong-1"}  # nothing of the refused senders
    finally:
        running.stop()
        api_client.close()
