"""Test clients that run inside the cluster's network namespace (tests/e2e/test_cluster.py).

Each entry point first moves its fresh "spawn" process into the namespace (``enter_netns``), so every socket it
opens — HTTP to pods, Kafka on the node address — stays inside it. Nothing here imports pytest.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
from collections.abc import Callable
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


def run_service(pid: int, host: str, port: int, kubectl: list[str], namespace: str, stop_after: float) -> None:
    """What a Service and kube-proxy would be for the receiver pods, which this cluster has neither of: a TCP relay
    on the node address that sends each new connection to a ready, not terminating receiver pod (the endpoints
    re-read every second). A connection stays with its pod until either side closes it, as with kube-proxy, so a
    client sees a pod's going as a closed connection and reconnects to another."""
    enter_netns(pid)
    endpoints: list[str] = []
    stop = threading.Event()

    def refresh() -> None:
        while not stop.is_set():
            try:
                endpoints[:] = receiver_ips(kubectl, namespace)
            except (subprocess.SubprocessError, ValueError, KeyError):
                pass  # the apiserver answers again in a moment; keep the last endpoints until then
            stop.wait(1)

    threading.Thread(target=refresh, daemon=True).start()
    try:
        relay(host, port, lambda: list(endpoints), 8080, stop_after)
    finally:
        stop.set()


def relay(host: str, port: int, endpoints: Callable[[], list[str]], target_port: int, stop_after: float) -> None:
    """Serve ``host:port`` for ``stop_after`` seconds, relaying each connection to one of ``endpoints()`` (in turn)
    on ``target_port``; a connection that finds no endpoint within 10 s is closed."""
    import asyncio
    import itertools

    turn = itertools.count()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def connect(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        for _ in range(40):
            ips = endpoints()
            if ips:
                try:
                    pod_r, pod_w = await asyncio.wait_for(
                        asyncio.open_connection(ips[next(turn) % len(ips)], target_port), 2)
                except (OSError, TimeoutError):
                    pass
                else:
                    await asyncio.gather(pipe(client_r, pod_w), pipe(pod_r, client_w))
                    return
            await asyncio.sleep(0.25)
        client_w.close()

    async def serve() -> None:
        server = await asyncio.start_server(connect, host, port)
        async with server:
            await asyncio.sleep(stop_after)

    asyncio.run(serve())


def get_json(url: str) -> object:
    with httpx.Client(timeout=10) as client:
        return client.get(url).json()


def consumer_groups(bootstrap_servers: str) -> list[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    return sorted(g.group_id for g in admin.list_consumer_groups().result(15).valid)


def produce_plain(bootstrap_servers: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """(key, value) records that are not CloudEvents, written to partition 0 of ``topic``."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0, "records not acknowledged"


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
