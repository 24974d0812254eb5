"""TLS to destinations with real certificates: the dispatcher's sender (``PooledSender``, https through aiohttp)
against an HTTPS server on loopback whose certificate a self-signed CA of the test issued (``cryptography``).

A destination whose ``CACerts`` name that CA gets the event; without them, with a certificate for another host,
or from a server below the minimum TLS version, the attempt fails with the reason (an ``Attempt`` — retried and
dead-lettered like any failure, counted in the delivery metrics by its code), never an exception. ``CACerts`` are
parsed from KafkaChannel subscribers, dead-letter sinks and Triggers."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kafka_eventing.broker.filters import TriggerFilters
from kafka_eventing.core.channels import channel_from_resource
from kafka_eventing.core.http_delivery import Attempt
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tls import TlsVersion
from kafka_eventing.dispatcher.http_client import PooledSender
from kafka_eventing.dispatcher.triggers import trigger_subscriber
from kafka_eventing.localstack.tls import CertificateAuthority


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received += 1  # type: ignore[attr-defined]
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


class HttpsSubscriber:
    """A loopback HTTPS server with a certificate for ``hosts``, issued by ``ca``; at most ``maximum`` TLS."""

    def __init__(self, ca: CertificateAuthority, tmp: Path, hosts: tuple[str, ...] = ("127.0.0.1",),
                 maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> None:
        issued = ca.issue("subscriber", hosts)
        cert, key = tmp / f"cert-{id(self)}.pem", tmp / f"key-{id(self)}.pem"
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.maximum_version = maximum
        context.load_cert_chain(cert, key)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.received = 0  # type: ignore[attr-defined]
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/events"

    @property
    def received(self) -> int:
        return int(self.server.received)  # type: ignore[attr-defined]

    def __enter__(self) -> HttpsSubscriber:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority("kafka-eventing test CA")


@pytest.fixture
def subscriber(ca: CertificateAuthority, tmp_path: Path) -> Iterator[HttpsSubscriber]:
    with HttpsSubscriber(ca, tmp_path) as sub:
        yield sub


def post(url: str, ca_certs: str | None, minimum: TlsVersion = TlsVersion.TLS_1_3) -> Attempt:
    async def go() -> Attempt:
        async with aiohttp.ClientSession() as session:
            return await PooledSender(session, minimum).post(
                url, {"ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-specversion": "1.0"}, b"{}", 5.0,
                ca_certs=ca_certs)

    return asyncio.run(go())


def test_a_subscriber_whose_ca_certs_name_its_ca_gets_the_event(ca: CertificateAuthority,
                                                                 subscriber: HttpsSubscriber) -> None:
    attempt = post(subscriber.url, ca.cert_pem.decode())
    assert (attempt.status, attempt.ok) == (202, True), attempt.error
    assert subscriber.received == 1


def test_without_ca_certs_the_self_signed_subscriber_is_refused(subscriber: HttpsSubscriber) -> None:
    attempt = post(subscriber.url, None)
    assert attempt.status is None and "CERTIFICATE_VERIFY_FAILED" in (attempt.error or ""), attempt.error
    assert subscriber.received == 0


def test_another_cas_certs_do_not_verify_it(subscriber: HttpsSubscriber) -> None:
    other = CertificateAuthority("someone else")
    attempt = post(subscriber.url, other.cert_pem.decode())
    assert attempt.status is None and "CERTIFICATE_VERIFY_FAILED" in (attempt.error or ""), attempt.error
    assert subscriber.received == 0


def test_a_certificate_for_another_host_is_refused(ca: CertificateAuthority, tmp_path: Path) -> None:
    with HttpsSubscriber(ca, tmp_path, hosts=("orders.example",)) as wrong:
        attempt = post(wrong.url, ca.cert_pem.decode())
        assert attempt.status is None and "IP address mismatch" in (attempt.error or ""), attempt.error
        assert wrong.received == 0


def test_tls_1_3_is_the_minimum_unless_lowered(ca: CertificateAuthority, tmp_path: Path) -> None:
    with HttpsSubscriber(ca, tmp_path, maximum=ssl.TLSVersion.TLSv1_2) as old:
        refused = post(old.url, ca.cert_pem.decode())
        assert refused.status is None and old.received == 0, refused
        assert post(old.url, ca.cert_pem.decode(), TlsVersion.TLS_1_2).status == 202
        assert old.received == 1


def test_ca_certs_that_are_not_pem_fail_the_attempt_with_the_reason(subscriber: HttpsSubscriber) -> None:
    attempt = post(subscriber.url, "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    assert attempt.status is None and "CACerts are not PEM certificates" in (attempt.error or "")
    assert subscriber.received == 0


def test_ca_certs_are_read_from_channels_and_triggers() -> None:
    channel = channel_from_resource({
        "kind": "KafkaChannel", "metadata": {"name": "c", "namespace": "n"},
        "spec": {"delivery": {"deadLetterSink": {"uri": "https://dls", "CACerts": "DLS-CA"}},
                 "subscribers": [{"uid": "a", "subscriberUri": "https://a", "subscriberCACerts": "A-CA",
                                  "replyUri": "https://r", "replyCACerts": "R-CA"},
                                 {"uid": "b", "subscriberUri": "http://b"}]}}, Settings())
    a, b = channel.subscribers
    assert (a.subscriber_ca_certs, a.reply_ca_certs, a.delivery.dead_letter_ca_certs) == ("A-CA", "R-CA", "DLS-CA")
    assert (b.subscriber_ca_certs, b.reply_ca_certs, b.delivery.dead_letter_ca_certs) == (None, None, "DLS-CA")
    trigger = {"metadata": {"name": "t", "namespace": "n"},
               "spec": {"broker": "b", "subscriber": {"uri": "https://s", "CACerts": "T-CA"},
                        "delivery": {"deadLetterSink": {"uri": "https://d"}}},
               "status": {"deadLetterSinkCACerts": "TD-CA"}}
    sub = trigger_subscriber(trigger, {}, TriggerFilters(), None, standalone=True)
    assert (sub.subscriber_ca_certs, sub.delivery.dead_letter_ca_certs) == ("T-CA", "TD-CA")
