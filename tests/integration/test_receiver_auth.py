"""Ingress authentication on the real receiver with real tokens: service-account tokens minted by the real
kube-apiserver (TokenRequest, with an audience), verified through the API server's own OIDC discovery and JWKS.
401 without or with a bad token, 403 for another channel's audience, 202 for the channel's own — and nothing
that was refused reaches Kafka.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
import support.receiver as receiver_tests
from cryptography.hazmat.primitives.asymmetric import rsa
from support.receiver import Receiver, binary_headers, read_all

from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.core.brokers import broker_audience
from kafka_eventing.core.channels import default_audience
from kafka_eventing.localstack.kafka import KafkaNode

pytestmark = [pytest.mark.kafka, pytest.mark.kube]

start_receiver = receiver_tests.start_receiver  # the real-gunicorn fixture, shared

CUSTOM_AUDIENCE = "https://orders.example/ingest"


def service_account_token(core: Any, namespace: str, account: str, audiences: list[str] | None) -> str:
    from kubernetes import client

    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name=account)))
    spec = client.V1TokenRequestSpec(audiences=audiences or [], expiration_seconds=600)
    res = core.create_namespaced_service_account_token(account, namespace,
                                                       client.AuthenticationV1TokenRequest(spec=spec))
    return str(res.status.token)


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def test_service_account_tokens_for_the_channels_audience(
        kafka_running: KafkaNode, topic: str, tmp_path: Path, kube_control_plane: Any, kube_namespace: str,
        start_receiver: Callable[..., Receiver]) -> None:
    from kubernetes import client

    api = kube_control_plane.api_client()
    try:
        core = client.CoreV1Api(api)
        ns = kube_namespace
        # The receiver's own identity, to fetch discovery and keys (system:service-account-issuer-discovery is
        # granted to every service account by default).
        own = tmp_path / "receiver-token"
        own.write_text(service_account_token(core, ns, "receiver", None))
        orders = service_account_token(core, ns, "orders-sender", [default_audience("shop", "orders")])
        custom = service_account_token(core, ns, "custom-sender", [CUSTOM_AUDIENCE])
        other = service_account_token(core, ns, "other-sender", [default_audience("shop", "other")])
        # A Broker's audience is the Broker's, never the KafkaChannel one of the same namespace/name.
        events = service_account_token(core, ns, "broker-sender", [broker_audience("shop", "events")])
    finally:
        api.close()
    assert claims(orders)["iss"] == kube_control_plane.server
    assert claims(orders)["aud"] == ["messaging.knative.dev/kafkachannel/shop/orders"]

    channels = "---\n".join(
        "apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\n"
        f"metadata:\n  name: {name}\n  namespace: shop\n  annotations:\n"
        f"    kafka.eventing.knative.dev/external.topic: {topic}\n" + extra
        for name, extra in (("orders", ""), ("custom", f"status:\n  address:\n    audience: {CUSTOM_AUDIENCE}\n")))
    channels += ("---\napiVersion: eventing.knative.dev/v1\nkind: Broker\nmetadata:\n  name: events\n"
                 f"  namespace: shop\n  annotations:\n    eventing.knative.dev/broker.class: Kafka\n"
                 f"    kafka.eventing.knative.dev/external.topic: {topic}\n")
    # Authentication only: any valid token may send (the senders' namespace is not the channels'); who may send
    # what is tests/integration/test_eventpolicies.py's.
    receiver = start_receiver(channels, bootstrap=kafka_running.bootstrap_servers, env={
        "KE_AUTH_ISSUER": kube_control_plane.server, "KE_AUTH_CA_FILE": str(kube_control_plane.ca_path),
        "KE_AUTH_TOKEN_FILE": str(own), "KE_AUTH_DEFAULT_MODE": "allow-all"})

    def post(path: str, event_id: str, token: str | None) -> Any:
        headers = binary_headers(event_id)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return receiver.post(path, event_id.encode(), headers)

    res = post("/shop/orders", "no-token", None)
    assert res.status_code == 401 and res.headers["WWW-Authenticate"].startswith("Bearer"), res.text
    assert post("/shop/orders", "garbage", "not.a.jwt").status_code == 401

    # Signed by a key the issuer never had (a forged token with the right claims).
    forged_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode({**claims(orders), "exp": int(time.time()) + 600}, forged_key, algorithm="RS256",
                        headers={"kid": jwt.get_unverified_header(orders)["kid"]})
    assert post("/shop/orders", "forged", forged).status_code == 401

    res = post("/shop/orders", "accepted-1", orders)
    assert res.status_code == 202, res.text
    res = post("/shop/orders", "wrong-audience", other)
    assert res.status_code == 403 and "audience" in res.json()["error"], res.text
    assert post("/shop/custom", "default-audience-on-custom", orders).status_code == 403
    assert post("/shop/custom", "accepted-2", custom).status_code == 202
    # Host routing and the same key again (now cached).
    res = receiver.post("/", b"x", {**binary_headers("accepted-3"), "Authorization": f"Bearer {orders}",
                                    "Host": "orders-kn-channel.shop.svc.cluster.local"})
    assert res.status_code == 202, res.text
    # A valid token does not reveal more than a 404 for a channel that does not exist.
    assert post("/shop/nope", "unknown", orders).status_code == 404
    assert post("/shop/nope", "unknown-no-token", None).status_code == 401

    assert post("/shop/events", "broker-with-a-channel-token", orders).status_code == 403
    assert post("/shop/events", "broker-without-token", None).status_code == 401
    assert post("/shop/events", "accepted-4", events).status_code == 202

    ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, topic)}
    assert ids == {"accepted-1", "accepted-2", "accepted-3", "accepted-4"}
