"""Smoke test of the peer (Knative's Java data plane, bench/peer.py), run by hand after hack/peer/build.sh:

    PYTHONPATH=src .venv/bin/python bench/peer_smoke.py [--workdir DIR]

Starts a local Kafka 3.9.1 (KafkaNode, loopback), a 4-partition topic, the peer receiver; POSTs a 1 KB binary-mode
CloudEvent to /bench/events (expects 202 and the record in the topic); then, for ordered and unordered, starts the
peer dispatcher on that topic towards a tiny HTTP sink on 127.0.0.1 and checks that the event already in the topic
and one more posted while it runs both arrive. Stops everything it started; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import http.server
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import peer

from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KafkaNode

TOPIC = "peer-smoke"


class Sink:
    """HTTP/1.1 sink on 127.0.0.1 recording (ce-id, body length) of every POST, answering 202."""

    def __init__(self) -> None:
        self.got: list[tuple[str, int]] = []
        self.cond = threading.Condition()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with sink.cond:
                    sink.got.append((self.headers.get("ce-id") or "", len(body)))
                    sink.cond.notify_all()
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def wait_for(self, ids: set[str], timeout: float) -> set[str]:
        """The ids of ``ids`` seen within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not ids <= {i for i, _ in self.got} and time.monotonic() < deadline:
                self.cond.wait(0.2)
            return ids & {i for i, _ in self.got}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def post_event(port: int, event_id: str, size: int = 1024) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/bench/events", data=b"x" * size, method="POST",
        headers={"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/peer-smoke", "ce-type": "bench.peer",
                 "content-type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def find_record(bootstrap: str, event_id: str, timeout: float = 20.0) -> tuple[int, int] | None:
    """(partition, value length) of the record whose ce_id header is ``event_id``."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-smoke-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0})
    try:
        c.subscribe([TOPIC])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            hs = m.headers() or []
            pairs = list(hs.items()) if isinstance(hs, dict) else hs
            headers = {k: v.encode() if isinstance(v, str) else (v or b"") for k, v in pairs}
            if headers.get("ce_id") == event_id.encode():
                return int(m.partition() or 0), len(m.value() or b"")
        return None
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    reason = peer.peer_available()
    if reason:
        print(f"SKIP: {reason}")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peer-smoke-"))
    print(f"peer: {peer.build_info().get('source')}; workdir {workdir}")
    failures: list[str] = []
    node = KafkaNode(workdir / "kafka")
    receiver = None
    sink = Sink()
    try:
        node.start()
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": node.bootstrap_servers, "log_level": 0})
        for fut in admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)]).values():
            fut.result(30)
        port = free_port()
        t0 = time.monotonic()
        receiver = peer.start_peer_receiver(node.bootstrap_servers, TOPIC, port, workdir)
        print(f"receiver ready in {time.monotonic() - t0:.1f}s on 127.0.0.1:{port} (pid {receiver.pid})")
        first = f"smoke-{uuid.uuid4()}"
        status = post_event(port, first)
        rec = find_record(node.bootstrap_servers, first)
        print(f"POST /bench/events -> {status}; record in topic: {rec and f'partition {rec[0]}, {rec[1]} bytes'}")
        if status != 202:
            failures.append(f"receiver answered {status}, not 202")
        if rec is None or rec[1] != 1024:
            failures.append(f"record for {first} not found in {TOPIC} (or wrong size): {rec}")
        for ordered in (True, False):
            mode = "ordered" if ordered else "unordered"
            t0 = time.monotonic()
            disp = peer.start_peer_dispatcher(node.bootstrap_servers, TOPIC, sink.url, workdir, ordered=ordered,
                                              group=f"bench-peer-{mode}")
            try:
                print(f"dispatcher ({mode}) ready in {time.monotonic() - t0:.1f}s (pid {disp.pid})")
                second = f"smoke-{mode}-{uuid.uuid4()}"
                status = post_event(port, second)
                got = sink.wait_for({first, second}, 30)
                sizes = sorted({n for i, n in sink.got if i in got})
                print(f"dispatcher ({mode}): backlog event {'delivered' if first in got else 'MISSING'}, "
                      f"new event (POST {status}) {'delivered' if second in got else 'MISSING'}, body sizes {sizes}")
                if got != {first, second}:
                    failures.append(f"{mode}: missing at the sink: {sorted({first, second} - got)}")
            finally:
                peer.stop(disp)
            with sink.cond:
                sink.got.clear()
    finally:
        peer.stop(receiver)
        sink.stop()
        node.stop()
    print("PASS" if not failures else "FAIL:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
