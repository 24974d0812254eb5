"""The receiver serving HTTPS, on real gunicorn and real Kafka, with certificates a CA made in the test issued: an
event sent over TLS lands in Kafka; a client that does not trust the CA, or offers only TLS 1.2 against the 1.3
minimum, is refused at the handshake (nothing written); a certificate rotated on disk is served to new
connections by the same workers, without a restart, while a connection opened before keeps working."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from support.receiver import REPO, binary_headers, read_all, worker_pids

from kafka_eventing.core.binding import event_from_kafka
from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tls import CertificateAuthority
from waiting import wait_for

pytestmark = [pytest.mark.kafka]


def served_serial(port: int, ca_file: Path) -> int:
    """The serial number of the certificate a new TLS connection to the receiver gets."""
    import socket

    context = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_https_ingress_with_rotation(kafka_running: KafkaNode, topic: str, tmp_path: Path) -> None:
    ca = CertificateAuthority("receiver test CA")
    ca_file, cert_file, key_file = tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key"
    ca_file.write_bytes(ca.cert_pem)
    first = ca.issue("receiver", ("127.0.0.1",))
    cert_file.write_bytes(first.cert_pem)
    key_file.write_bytes(first.key_pem)
    channels = tmp_path / "channels.yaml"
    channels.write_text("apiVersion: messaging.knative.dev/v1beta1\nkind: KafkaChannel\nmetadata:\n  name: orders\n"
                        f"  namespace: shop\n  annotations:\n    kafka.eventing.knative.dev/external.topic: {topic}\n")
    port = _proc.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
    env.update({"KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(channels),
                "KE_BOOTSTRAP_SERVERS": kafka_running.bootstrap_servers, "KE_PRODUCE_TIMEOUT_SECONDS": "5",
                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom"), "KE_TLS_CERT_FILE": str(cert_file),
                "KE_TLS_KEY_FILE": str(key_file), "KE_TLS_RELOAD_SECONDS": "0.5"})
    log = tmp_path / "receiver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kafka_eventing.receiver", "--bind", f"127.0.0.1:{port}",
                                 "--workers", "2"], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"https://127.0.0.1:{port}"
    trusted = ssl.create_default_context(cafile=str(ca_file))
    try:
        try:
            wait_for(lambda: httpx.get(url + "/readyz", verify=trusted, timeout=5).status_code == 200, 60,
                     "HTTPS readiness", tolerate=(httpx.TransportError,))
            wait_for(lambda: len(worker_pids(proc.pid)) == 2, 30, "both workers")
        except AssertionError:
            raise AssertionError(log.read_text()[-4000:]) from None
        workers = set(worker_pids(proc.pid))

        def post(event_id: str, verify: ssl.SSLContext | bool, client: httpx.Client | None = None) -> int:
            send = client.post if client is not None else httpx.post
            kw = {} if client is not None else {"verify": verify}
            return send(url + "/shop/orders", content=b"{}", headers=binary_headers(event_id),
                        timeout=10, **kw).status_code  # type: ignore[arg-type]

        assert post("tls-1", trusted) == 202
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            post("untrusted", True)  # the system's CAs only: the test CA is not among them
        old_client = ssl.create_default_context(cafile=str(ca_file))
        old_client.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(httpx.ConnectError):
            post("tls-1.2", old_client)  # below the minimum (1.3 by default)
        # Plain HTTP on the TLS port is no request at all: the server closes the connection, which the client sees
        # as a close without an answer or, when the close comes as a reset, a read error.
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            httpx.post(f"http://127.0.0.1:{port}/shop/orders", content=b"{}", headers=binary_headers("plain"),
                       timeout=10)

        # Rotation: a new certificate written over the files (as a Secret update) is served without a restart;
        # a keep-alive connection opened before keeps working.
        kept = httpx.Client(verify=trusted)
        assert post("kept-before", trusted, kept) == 202
        before = served_serial(port, ca_file)
        assert before == x509.load_pem_x509_certificate(first.cert_pem).serial_number
        second = ca.issue("receiver-rotated", ("127.0.0.1",))
        key_file.write_bytes(second.key_pem)
        cert_file.write_bytes(second.cert_pem)
        rotated = x509.load_pem_x509_certificate(second.cert_pem).serial_number
        wait_for(lambda: all(served_serial(port, ca_file) == rotated for _ in range(6)), 30,
                 "the rotated certificate served by every worker")
        assert set(worker_pids(proc.pid)) == workers  # the same processes: no restart
        assert post("kept-after", trusted, kept) == 202
        kept.close()
        assert post("tls-2", trusted) == 202

        ids = {event_from_kafka(m.headers(), m.value()).get_id() for m in read_all(kafka_running, topic)}
        assert ids == {"tls-1", "kept-before", "kept-after", "tls-2"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
