"""Receiver app with a fake producer: the status-code table, keys, batches, headers, limits, handshake."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from falcon import testing

from kafka_eventing.core.binding import ContentMode, event_from_kafka
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.app import create_app
from kafka_eventing.receiver.sender import KafkaSender

from .fakes import BINARY, Client, FakeChannels, FakeProducer, make_app

# -- fakes (also used by test_app_fuzz.py and test_sender.py) ------------------------------------------












# -- tests ---------------------------------------------------------------------------------------------------

ORDERS = Channel("shop", "orders", "shop.orders")
AUDIT = Channel("shop", "audit", "shop.audit", content_mode=ContentMode.STRUCTURED)
BROKEN = Channel("shop", "broken", "shop.broken", ready=False, reason="topic shop.broken missing")
HOST = "orders-kn-channel.shop.svc.cluster.local"





@pytest.fixture
def client(producer: FakeProducer) -> Iterator[Client]:
    app, sender = make_app(producer, ORDERS, AUDIT, BROKEN)
    yield Client(app)
    sender.close(1.0)


def post(client: testing.TestClient, body: bytes = b'{"n":1}', host: str = HOST, path: str = "/",
         **headers: str) -> Any:
    hdrs = {**BINARY, "Host": host, **{k.replace("_", "-"): v for k, v in headers.items()}}
    return client.simulate_post(path, body=body, headers=hdrs)


# -- happy path and mapping -----------------------------------------------------------------------------


def test_binary_event_202_and_record(client: testing.TestClient, producer: FakeProducer) -> None:
    res = post(client, b'{"n":1}', traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               tracestate="k=v")
    assert res.status_code == 202, res.text
    [rec] = producer.produced
    assert rec.topic == "shop.orders"
    assert rec.value == b'{"n":1}'
    headers = dict(rec.headers)
    assert headers["ce_id"] == b"e-1"
    assert headers["ce_type"] == b"order.created"
    assert headers["content-type"] == b"application/json"
    assert headers["traceparent"] == b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert headers["tracestate"] == b"k=v"
    assert rec.key is None
    event = event_from_kafka(rec.headers, rec.value)
    assert event.get_id() == "e-1"


def test_structured_channel_writes_structured_record(client: testing.TestClient, producer: FakeProducer) -> None:
    res = post(client, host="audit-kn-channel.shop.svc:8080")
    assert res.status_code == 202, res.text
    [rec] = producer.produced
    assert rec.topic == "shop.audit"
    assert dict(rec.headers)["content-type"].startswith(b"application/cloudevents+json")
    assert json.loads(rec.value or b"")["id"] == "e-1"


def test_structured_http_input(client: testing.TestClient, producer: FakeProducer) -> None:
    body = json.dumps({"specversion": "1.0", "id": "s-1", "source": "/s", "type": "t", "subject": "sub",
                       "data": {"a": 1}}).encode()
    res = client.simulate_post("/shop/orders", body=body,
                               headers={"content-type": "application/cloudevents+json"})
    assert res.status_code == 202, res.text
    [rec] = producer.produced
    assert dict(rec.headers)["ce_id"] == b"s-1"
    assert rec.key == b"sub"


@pytest.mark.parametrize(("extra", "key"), [
    ({"ce-partitionkey": "pk", "ce-subject": "sub"}, b"pk"),
    ({"ce-subject": "sub"}, b"sub"),
    ({}, None),
])
def test_key_selection_order(client: testing.TestClient, producer: FakeProducer,
                             extra: dict[str, str], key: bytes | None) -> None:
    res = client.simulate_post("/", body=b"x", headers={**BINARY, "Host": HOST, **extra})
    assert res.status_code == 202
    assert producer.produced[0].key == key


def test_path_based_routing(client: testing.TestClient, producer: FakeProducer) -> None:
    res = post(client, host="localhost:8080", path="/shop/orders")
    assert res.status_code == 202
    assert producer.produced[0].topic == "shop.orders"


# -- the status-code table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "path", "status"), [
    ("nope-kn-channel.shop.svc", "/", 404),       # unknown channel
    ("localhost", "/", 404),                       # no channel at all
    (HOST, "/a/b/c", 404),                         # other path
    ("localhost", "/shop/nope", 404),              # unknown channel by path
])
def test_not_found(client: testing.TestClient, producer: FakeProducer, host: str, path: str, status: int) -> None:
    res = post(client, host=host, path=path)
    assert res.status_code == status
    assert "error" in res.json
    assert producer.produced == []


def test_not_ready_is_503_with_reason(client: testing.TestClient) -> None:
    res = post(client, host="broken-kn-channel.shop.svc")
    assert res.status_code == 503
    assert "topic shop.broken missing" in res.json["error"]
    assert res.headers["Retry-After"] == "7"


def test_invalid_event_400_names_problem(client: testing.TestClient, producer: FakeProducer) -> None:
    headers = {k: v for k, v in BINARY.items() if k != "ce-id"}
    res = client.simulate_post("/", body=b"{}", headers={**headers, "Host": HOST})
    assert res.status_code == 400
    assert "id" in res.json["details"]
    res = client.simulate_post("/", body=b"{}", headers={"Host": HOST, "content-type": "text/plain"})
    assert res.status_code == 400
    assert "not a CloudEvent" in res.json["error"]
    res = client.simulate_post("/", body=b"{not json", headers={"Host": HOST,
                                                                 "content-type": "application/cloudevents+json"})
    assert res.status_code == 400
    assert producer.produced == []


@pytest.mark.parametrize(("mode", "status"), [("error", 503), ("never", 503), ("buffer", 503), ("too_large", 413),
                                                   ("broker_too_large", 413)])
def test_kafka_failures(producer: FakeProducer, mode: str, status: int) -> None:
    producer.mode = mode
    app, sender = make_app(producer, ORDERS)
    try:
        res = post(Client(app))
    finally:
        sender.close(0.5)
    assert res.status_code == status, res.text
    if status == 503:
        assert res.headers["Retry-After"] == "7"


def test_methods_and_options_handshake(client: testing.TestClient) -> None:
    res = client.simulate_options("/", headers={"Host": HOST, "WebHook-Request-Origin": "eventemitter.example.com",
                                                "WebHook-Request-Rate": "120"})
    assert res.status_code == 200
    assert res.headers["WebHook-Allowed-Origin"] == "eventemitter.example.com"
    assert res.headers["WebHook-Allowed-Rate"] == "*"
    plain = client.simulate_options("/shop/orders")
    assert plain.status_code == 200
    assert "WebHook-Allowed-Rate" not in plain.headers
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        assert client.simulate_request(method, "/", headers={"Host": HOST}).status_code == 405
    assert client.simulate_get("/shop/orders").status_code == 405


# -- batches -----------------------------------------------------------------------------------------------


def _batch(*ids: str) -> bytes:
    return json.dumps([{"specversion": "1.0", "id": i, "source": "/b", "type": "t", "data": i} for i in ids]).encode()


def test_batch_all_delivered(client: testing.TestClient, producer: FakeProducer) -> None:
    res = client.simulate_post("/shop/orders", body=_batch("a", "b", "c"),
                               headers={"content-type": "application/cloudevents-batch+json"})
    assert res.status_code == 202, res.text
    assert [dict(p.headers)["ce_id"] for p in producer.produced] == [b"a", b"b", b"c"]


def test_batch_invalid_item_rejects_all(client: testing.TestClient, producer: FakeProducer) -> None:
    items = json.loads(_batch("a", "b"))
    del items[1]["type"]
    res = client.simulate_post("/shop/orders", body=json.dumps(items).encode(),
                               headers={"content-type": "application/cloudevents-batch+json"})
    assert res.status_code == 400
    assert "batch item 1" in res.json["error"]
    assert producer.produced == []


@pytest.mark.parametrize("modes", [["ok", "error", "ok"], ["ok", "ok", "never"], ["ok", "buffer"]])
def test_batch_is_202_only_if_every_report_succeeded(producer: FakeProducer, modes: list[str]) -> None:
    producer.modes = list(modes)
    app, sender = make_app(producer, ORDERS)
    try:
        res = Client(app).simulate_post(
            "/shop/orders", body=_batch("a", "b", "c"), headers={"content-type": "application/cloudevents-batch+json"})
    finally:
        sender.close(0.5)
    assert res.status_code == 503


# -- size limits -------------------------------------------------------------------------------------------


def _asgi_post(app: Any, chunks: Iterator[bytes | dict[str, Any]], headers: dict[str, str],
               last: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """POST the chunks to ``/`` straight through ASGI, then ``last`` (default: the end of the body); what the app
    sent. A dict among the chunks is sent as the event it is (a body whose last event carries data)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"",
             "root_path": "", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in {**BINARY, "Host": HOST, **headers}.items()]}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        chunk = next(chunks, None)
        if isinstance(chunk, dict):
            return chunk
        if chunk is None and last is not None:
            return last
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def _chunked_post(app: Any, chunks: Iterator[bytes | dict[str, Any]]) -> tuple[int, bytes]:
    """POST a body without Content-Length (as a chunked request arrives), straight through ASGI."""
    sent = _asgi_post(app, chunks, {})
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_413_on_declared_length(client: testing.TestClient, producer: FakeProducer) -> None:
    res = post(client, body=b"x" * 4097)
    assert res.status_code == 413
    assert post(client, body=b"x" * 4096).status_code == 202


def test_413_on_chunked_body_without_reading_it_all(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS)
    given = 0

    def endless() -> Iterator[bytes]:
        nonlocal given
        while True:
            given += 1000
            assert given <= 6000, "the app kept reading past the limit"
            yield b"x" * 1000

    try:
        status, _ = _chunked_post(app, endless())
    finally:
        sender.close(0.5)
    assert status == 413
    assert given == 5000  # the first chunk past 4096 bytes, no more
    assert producer.produced == []


def test_413_on_chunked_body_that_comes_in_one_event(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS)
    try:
        status, _ = _chunked_post(app, iter([{"type": "http.request", "body": b"x" * 4097, "more_body": False}]))
        assert _chunked_post(app, iter([{"type": "http.request", "body": b"x" * 4096}]))[0] == 202
    finally:
        sender.close(0.5)
    assert status == 413
    assert [len(p.value or b"") for p in producer.produced] == [4096]


def test_chunked_body_within_limit(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS)
    try:
        status, body = _chunked_post(app, iter([b"y" * 1000, b"y" * 2000]))
    finally:
        sender.close(0.5)
    assert status == 202, body
    assert producer.produced[0].value == b"y" * 3000


def test_a_declared_body_in_several_events_is_written_whole(producer: FakeProducer) -> None:
    # Small bodies come whole in the first ASGI event; a larger one (or a slow sender's) comes in several.
    app, sender = make_app(producer, ORDERS)
    try:
        sent = _asgi_post(app, iter([b"a" * 10, b"", b"b" * 20, b"c" * 5]), {"Content-Length": "35"})
    finally:
        sender.close(0.5)
    assert sent[0]["status"] == 202
    assert [p.value for p in producer.produced] == [b"a" * 10 + b"b" * 20 + b"c" * 5]


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_client_that_leaves_mid_body_gets_nothing_written(producer: FakeProducer, declared: bool) -> None:
    # A disconnect ends the ASGI events as a body's end does (and falcon's stream does not tell them apart); the
    # part read must not become a record.
    app, sender = make_app(producer, ORDERS)
    try:
        sent = _asgi_post(app, iter([b"x" * 50]), {"Content-Length": "100"} if declared else {},
                          last={"type": "http.disconnect"})
        assert producer.produced == []
        assert sent[0]["status"] == 499  # to nobody (a server drops what is sent after a disconnect); counted
        assert post(Client(app), body=b"whole").status_code == 202  # the next client's event is written
        assert [p.value for p in producer.produced] == [b"whole"]
    finally:
        sender.close(0.5)


def test_an_unexpected_error_is_a_logged_500_in_the_receivers_json(producer: FakeProducer,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    class Failing(KafkaSender):  # a bug, not the request's fault nor Kafka's
        def submit_async(self, *_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError("a bug")

    sender = Failing(producer, timeout=1.0)
    try:
        res = post(Client(create_app(producer, FakeChannels(ORDERS), Settings(), sender=sender)))
    finally:
        sender.close(0.5)
    assert res.status_code == 500
    assert res.json == {"error": "500 Internal Server Error"}
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["request failed"]
    assert producer.produced == []


def test_limit_capped_by_message_max_bytes(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS, message_max_bytes=1000)
    try:
        client = Client(app)
        assert post(client, body=b"x" * 1001).status_code == 413
        assert post(client, body=b"x" * 1000).status_code == 202
    finally:
        sender.close(0.5)


# -- health, readiness, metrics, shutdown ------------------------------------------------------------------


def test_health_and_readiness(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS, synced=False)
    client = Client(app)
    assert client.simulate_get("/healthz").status_code == 200
    res = client.simulate_get("/readyz")
    assert res.status_code == 503
    assert res.json == {"channels": False, "accepting": True}
    sender.close(0.5)

    # Kafka unreachable: the pod can still answer (503 + Retry-After per request), so it stays ready.
    producer.reachable = False
    producer.mode = "error"
    app, sender = make_app(producer, ORDERS)
    client = Client(app)
    res = client.simulate_get("/readyz")
    assert res.status_code == 200 and res.json == {"channels": True, "accepting": True}
    res = post(client)
    assert res.status_code == 503 and res.headers["Retry-After"] == "7"
    sender.close(0.5)


def test_metrics_count_events(client: testing.TestClient) -> None:
    post(client)
    post(client, host="broken-kn-channel.shop.svc")
    post(client, host="zzz-kn-channel.shop.svc")
    text = client.simulate_get("/metrics").text
    assert 'kafka_receiver_events_total{channel="shop/orders",code="202"}' in text
    assert 'kafka_receiver_events_total{channel="shop/broken",code="503"}' in text
    assert "zzz" not in text  # unknown names create no series
    assert "kafka_receiver_produce_latency_seconds_bucket" in text
    assert 'kafka_receiver_bytes_in_total{channel="shop/orders"}' in text


def test_closing_refuses_new_events_and_flushes(producer: FakeProducer) -> None:
    app, sender = make_app(producer, ORDERS)
    client = Client(app)
    assert post(client).status_code == 202
    assert sender.close(1.0) == 0
    assert producer.flushed == 1
    res = post(client)
    assert res.status_code == 503
    assert "shutting down" in res.json["error"]
    assert client.simulate_get("/readyz").json["accepting"] is False
    assert len(producer.produced) == 1


def test_attributes_reach_kafka_as_the_sender_wrote_them(client: testing.TestClient, producer: FakeProducer) -> None:
    """``time`` keeps its text; a non-ASCII value sent without percent-encoding is read as the UTF-8 it is."""
    raw_utf8 = "café ✓".encode().decode("latin-1")  # the header bytes as they go on the wire
    res = post(client, ce_time="2024-05-01T12:34:56.789Z", ce_myext=raw_utf8, ce_other="caf%C3%A9")
    assert res.status_code == 202, res.text
    headers = dict(producer.produced[0].headers)
    assert headers["ce_time"] == b"2024-05-01T12:34:56.789Z"
    assert headers["ce_myext"].decode() == "café ✓" and headers["ce_other"].decode() == "café"
