"""The ASGI variant answers exactly like the WSGI app (same Ingress); checked on the paths that differ:
async body reading and waiting for the delivery report on the event loop."""

from __future__ import annotations

import pytest
from falcon import testing
from test_receiver import FakeChannels, FakeProducer

from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.asgi import create_app
from kafka_eventing.receiver.sender import KafkaSender

ORDERS = Channel("shop", "orders", "shop.orders")
HEADERS = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/t", "ce-type": "t",
           }
HOST = "orders-kn-channel.shop.svc"  # falcon's ASGI simulator sets Host from its `host` argument


def client_for(producer: FakeProducer) -> tuple[testing.TestClient, KafkaSender]:
    settings = Settings(produce_timeout_seconds=0.3, max_event_bytes=4096)
    sender = KafkaSender(producer, timeout=0.3, poll_interval=0.05)
    app = create_app(producer, FakeChannels(ORDERS), settings, sender=sender)
    return testing.TestClient(app), sender


@pytest.mark.parametrize(("mode", "body", "status"), [
    ("ok", b"data", 202), ("error", b"data", 503), ("never", b"data", 503), ("buffer", b"data", 503),
    ("ok", b"x" * 4097, 413),
])
def test_status_codes(mode: str, body: bytes, status: int) -> None:
    producer = FakeProducer(mode=mode)
    client, sender = client_for(producer)
    try:
        res = client.simulate_post("/", body=body, headers=HEADERS, host=HOST)
    finally:
        sender.close(0.5)
    assert res.status_code == status, res.text
    if status == 202:
        assert producer.produced[0].value == body


def test_routing_and_other_endpoints() -> None:
    producer = FakeProducer()
    client, sender = client_for(producer)
    try:
        assert client.simulate_post("/shop/nope", body=b"x", headers=HEADERS).status_code == 404
        assert client.simulate_post("/", body=b"x", headers={**HEADERS, "ce-id": ""}, host=HOST).status_code == 400
        res = client.simulate_options("/", headers={"WebHook-Request-Origin": "o.example"})
        assert res.headers["WebHook-Allowed-Origin"] == "o.example"
        assert client.simulate_get("/").status_code == 405
        assert client.simulate_get("/healthz").status_code == 200
        assert client.simulate_get("/readyz").json == {"channels": True, "kafka": True, "accepting": True}
        assert "kafka_receiver_events_total" in client.simulate_get("/metrics").text
    finally:
        sender.close(0.5)
