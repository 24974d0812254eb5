"""Test clients that run inside the real-pod cluster's network namespace (tests/e2e/test_cluster.py,
test_cluster_life.py).

Each entry point first moves its fresh "spawn" process into the namespace (``enter_netns``), so every socket it
opens — HTTP to pods, Kafka on the node address — stays inside it. Nothing here imports pytest.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
from pathlib import Path

import httpx

from kafka_eventing.localstack.cluster import enter_netns


def init(pid: int) -> None:
    """Pool initializer: join the namespace held by ``pid``."""
    enter_netns(pid)


def run_sink(pid: int, host: str, port: int, ledger: str, stop_after: float) -> None:
    """A subscriber on the namespace's node address: appends each CloudEvent's id to ``ledger``; answers 200."""
    enter_netns(pid)
    lock = threading.Lock()

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock, Path(ledger).open("a") as out:
                out.write(json.dumps({"id": self.headers.get("ce-id")}) + "\n")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, port), Sink)
    threading.Timer(stop_after, server.shutdown).start()
    server.serve_forever()


def receiver_ips(kubectl: list[str], namespace: str) -> list[str]:
    out = subprocess.run([*kubectl, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=receiver",
                          "-o", "json"], check=True, capture_output=True, text=True, timeout=60).stdout
    return [p["status"]["podIP"] for p in json.loads(out)["items"]
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ())]


def send_events(kubectl: list[str], namespace: str, channel_host: str, ids: list[str], pace: float = 0.0,
                deadline: float = 300.0, path: str = "/", event_type: str = "dev.kafka-eventing.e2e") -> list[str]:
    """POST each id as a binary CloudEvent of ``event_type`` to ``path`` on a ready receiver pod, as a client would:
    an event that gets no 202 (pod gone, 503) is sent again, to a receiver found afresh. Returns the ids that were
    accepted (202). A channel is addressed by ``channel_host`` (the Host header), a Broker by ``path``."""
    accepted: list[str] = []
    ips: list[str] = []
    end = time.monotonic() + deadline
    with httpx.Client(timeout=10) as client:
        for n, event_id in enumerate(ids):
            while time.monotonic() < end:
                if not ips:
                    ips = receiver_ips(kubectl, namespace)
                    if not ips:
                        time.sleep(0.5)
                        continue
                url = f"http://{ips[n % len(ips)]}:8080{path}"
                try:
                    resp = client.post(url, content=json.dumps({"n": n}).encode(), headers={
                        "host": channel_host, "ce-specversion": "1.0", "ce-id": event_id,
                        "ce-source": "e2e/cluster", "ce-type": event_type,
                        "content-type": "application/json"})
                    if resp.status_code == 202:
                        accepted.append(event_id)
                        break
                except httpx.HTTPError:
                    pass
                ips = []
                time.sleep(0.2)
            time.sleep(pace)
    return accepted


def topics(bootstrap_servers: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    return sorted(admin.list_topics(timeout=15).topics)


def consumer_groups(bootstrap_servers: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    return sorted(g.group_id for g in admin.list_consumer_groups().result(15).valid)


def post_tls(ip: str, port: int, server_name: str, path: str, headers: dict[str, str], body: bytes,
             ca_pem: str) -> tuple[int, str]:
    """One POST over HTTPS to a pod address, verified as a client of ``server_name`` would verify it (SNI and
    host name check against the certificate, trusting only ``ca_pem``) — there is no cluster DNS to resolve it."""
    import ssl

    context = ssl.create_default_context(cadata=ca_pem)
    with httpx.Client(verify=context, timeout=10) as client:
        resp = client.post(f"https://{ip}:{port}{path}", content=body, headers={"host": server_name, **headers},
                           extensions={"sni_hostname": server_name})
        return resp.status_code, resp.text


def topic_event_ids(bootstrap_servers: str, topic: str, timeout: float = 30.0) -> list[str]:
    """The ``ce_id`` header of every record in ``topic``, read from the start to the end of each partition."""
    import uuid

    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"e2e-read-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        partitions = consumer.list_topics(topic, timeout=15).topics[topic].partitions
        consumer.subscribe([topic])
        ids: list[str] = []
        at_end: set[int] = set()
        end = time.monotonic() + timeout
        while len(at_end) < len(partitions):
            assert time.monotonic() < end, f"{topic}: not read to its end in {timeout:.0f}s"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end.add(msg.partition())
                continue
            headers = dict(msg.headers() or ())
            ids.append(headers["ce_id"].decode())
        return ids
    finally:
        consumer.close()
