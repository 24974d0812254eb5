"""Clients of the Spark-on-pods test (tests/e2e/test_cluster_spark.py) that run inside the cluster's network
namespace: a producer of CloudEvents and a replay target that records every request. Each "spawn" process joins the
namespace first (``enter_netns``), so its sockets stay inside it. Nothing here imports pytest.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from datetime import UTC, datetime
from pathlib import Path

from kafka_eventing.core.binding import CloudEvent, ContentMode, event_to_kafka
from kafka_eventing.localstack.cluster import enter_netns


def produce_events(bootstrap_servers: str, topic: str, count: int, partitions: int) -> list[str]:
    """``count`` CloudEvents on a new topic of ``partitions`` partitions, binary and (every third) structured, JSON
    and binary data, some with a subject: what the archive and the replay must carry unchanged. Returns the ids."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    ids = []
    for i in range(count):
        attrs: dict[str, object] = {
            "id": f"ev-{i}", "source": "/e2e/spark", "type": f"com.example.t{i % 2}", "specversion": "1.0",
            "time": datetime(2026, 11, 1 + i % 3, 10, 0, i % 60, tzinfo=UTC), "traceid": f"trace-{i}"}
        if i % 4 == 1:
            attrs["subject"] = f"subject-{i}"
        if i % 2:
            attrs["datacontenttype"] = "application/json"
            event = CloudEvent(attrs, {"n": i, "text": "é"})
        else:
            event = CloudEvent(attrs, bytes([i % 256]) * 17 + b"\x00\xff")
        record = event_to_kafka(event, ContentMode.STRUCTURED if i % 3 == 2 else ContentMode.BINARY)
        producer.produce(topic, record.value, record.key, headers=record.headers, partition=i % partitions)
        ids.append(f"ev-{i}")
    assert producer.flush(30) == 0, "records not acknowledged"
    return ids


def run_sink(pid: int, host: str, port: int, ledger: str, stop_after: float) -> None:
    """A replay target on the namespace's node address: appends each request's path, CloudEvent headers and body
    (base64) to ``ledger`` as a JSON line; answers 200."""
    enter_netns(pid)
    lock = threading.Lock()

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()
                       if k.lower().startswith("ce-") or k.lower() == "content-type"}
            with lock, Path(ledger).open("a") as out:
                out.write(json.dumps({"path": self.path, "headers": headers,
                                      "body": base64.b64encode(body).decode()}) + "\n")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, port), Sink)
    threading.Timer(stop_after, server.shutdown).start()
    server.serve_forever()
