"""``python -m kafka_eventing.receiver``: the gunicorn command line (uvicorn workers, the ASGI app)."""

from __future__ import annotations

import sys
from pathlib import Path

from kafka_eventing.receiver.__main__ import command


def test_uvicorn_workers_and_flags_pass_through() -> None:
    cmd = command(["--bind", "127.0.0.1:9", "--workers", "1"])
    assert cmd[:5] == [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf"]
    assert cmd[5:7] == ["-k", "kafka_eventing.receiver.server.ReceiverWorker"]
    assert cmd[7:11] == ["--bind", "127.0.0.1:9", "--workers", "1"]
    assert cmd[-1] == "kafka_eventing.receiver.app:get_app()"


def test_gunicorn_config_module_loads() -> None:
    from kafka_eventing.receiver import gunicorn_conf

    assert gunicorn_conf.preload_app is False  # the producer must be created after fork
    assert gunicorn_conf.wsgi_app == "kafka_eventing.receiver.app:get_app()"
    assert gunicorn_conf.worker_class == "kafka_eventing.receiver.server.ReceiverWorker"
    assert gunicorn_conf.graceful_timeout > 10  # > default produce timeout: in-flight reports can arrive


def test_help_says_what_the_receiver_serves() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "kafka_eventing.receiver", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "KafkaChannels, Kafka Brokers and KafkaSinks" in out and "usage: gunicorn" in out


def test_a_rotated_certificate_is_loaded_into_the_serving_context(tmp_path: Path) -> None:
    import ssl

    from kafka_eventing.localstack.tls import CertificateAuthority
    from kafka_eventing.receiver.server import CertificateReloader

    ca = CertificateAuthority()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first = ca.issue("a")
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    reloader = CertificateReloader(context, cert, key, 1.0)
    assert not reloader.check()  # unchanged
    second = ca.issue("b")
    cert.write_bytes(second.cert_pem)  # caught mid-rotation: the new certificate with the old key
    assert not reloader.check()  # refused, the old pair still served; tried again next time
    key.write_bytes(second.key_pem)
    assert reloader.check()
    assert not reloader.check()
