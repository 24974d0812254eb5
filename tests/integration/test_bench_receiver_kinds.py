"""The auth-on and TLS-on rows of ``make bench-receiver`` (bench/receiver.py ``receiver-auth``, ``receiver-tls``)
start as the benchmark starts them and answer one event with 202 on the real broker — and really are auth-on and
TLS-on: no token is a 401, plain HTTP gets no answer. The benchmark itself is not run here."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import httpx
import pytest

from kafka_eventing.localstack.kafka import KafkaNode
from scripts import load_script

pytestmark = [pytest.mark.kafka]

EVENT = {"ce-specversion": "1.0", "ce-id": "smoke-1", "ce-source": "/bench", "ce-type": "bench.event",
         "content-type": "application/octet-stream"}


@pytest.mark.parametrize("kind", ["receiver-auth", "receiver-tls"])
def test_bench_kind_starts_and_answers(kind: str, kafka_running: KafkaNode, tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    bench = load_script("bench/receiver.py", "bench_receiver")
    bench.fresh_topic(AdminClient(kafka_running.client_config()))
    channels = tmp_path / "channels.yaml"
    channels.write_text(bench.CHANNELS)
    # As bench/receiver.py's main() makes it: this environment without KE_* settings, plus the run's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
    env.update({"KE_BOOTSTRAP_SERVERS": kafka_running.bootstrap_servers, "KE_CHANNELS_FILE": str(channels),
                "KE_LOG_LEVEL": "WARNING", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")})
    variant = bench.receiver_variant(kind, env, tmp_path)
    proc, url = bench.start_server("uvicorn", "receiver", variant.env, tmp_path, ca_file=variant.ca_file)
    try:
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(variant.ca_file))
                                         if variant.ca_file else False)
        with httpx.Client(verify=verify, timeout=15) as client:
            resp = client.post(url + "/bench/events", content=b"x" * 1024,
                               headers={**EVENT, **(variant.headers or {})})
            assert resp.status_code == 202, resp.text
            if kind == "receiver-auth":
                assert url.startswith("http://")
                anonymous = client.post(url + "/bench/events", content=b"x", headers=EVENT)
                assert anonymous.status_code == 401, anonymous.text
            else:
                assert url.startswith("https://") and "KE_AUTH_ISSUER" not in variant.env
                with pytest.raises(httpx.HTTPError):
                    httpx.post(url.replace("https://", "http://") + "/bench/events", content=b"x", headers=EVENT,
                               timeout=5)
    finally:
        bench.stop_server(proc)
