"""`kafka-eventing run` (`make run`): the whole data path on this machine, then a round trip to watch
(`--broker`: a Kafka Broker and Triggers; `--source`: a KafkaSource turning plain records into CloudEvents).

Starts a local Kafka node, writes a channels YAML (KafkaChannel ``default/demo``, 3 partitions, one
subscriber), creates its topic with the Admin API, starts the receiver (gunicorn) and the channel's
dispatcher as child processes plus a demo subscriber that prints every CloudEvent it gets, sends a few
events through the receiver and shows them arriving. Then it prints a ``curl`` to send more and stays up
until Ctrl-C (or exits after the round trip with ``--exit-after-demo``). Every child is stopped on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from kafka_eventing.core.binding import event_from_http
from kafka_eventing.core.settings import Settings
from kafka_eventing.localstack import _proc
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tools import cache_dir

NAMESPACE, CHANNEL = "default", "demo"
#: Attributes the demo subscriber prints first; the rest (subject, time, extensions) follow them.
_PRINTED = frozenset(("id", "type", "source", "specversion"))
PARTITIONS = 3


def say(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def progress(what: str, every: float = 10.0) -> Iterator[None]:
    """Say "still waiting for <what>" every ``every`` seconds while the block runs (a first run is slow)."""
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            say(f"  ... still waiting for {what} ({time.monotonic() - started:.0f}s)")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


class DemoSubscriber:
    """A tiny HTTP subscriber on 127.0.0.1 that prints each CloudEvent and answers 200."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._lock = threading.Lock()
        demo = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    event = event_from_http(dict(self.headers.items()), body)
                    data = event.get_data()
                    text = data.decode(errors="replace") if isinstance(data, bytes) else json.dumps(data)
                    line = (f"[subscriber] received CloudEvent id={event.get_id()} type={event.get_type()} "
                            f"source={event.get_source()} data={text}")
                    extra = {k: v for k, v in event.get_attributes().items() if k not in _PRINTED}
                    if extra:
                        line += " " + " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
                    with demo._lock:
                        demo.received.append(event.get_id())
                    status = 200
                except ValueError as exc:
                    line, status = f"[subscriber] not a CloudEvent: {exc}", 400
                say(line)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for a serve_forever loop: one never started would hang
            self.server.shutdown()
        self.server.server_close()

    def got(self, ids: list[str]) -> bool:
        with self._lock:
            return set(ids) <= set(self.received)


def channels_yaml(subscriber_uri: str) -> str:
    channel = {
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": CHANNEL, "namespace": NAMESPACE},
        "spec": {"numPartitions": PARTITIONS, "replicationFactor": 1,
                 "delivery": {"retry": 5, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"},
                 "subscribers": [{"uid": "demo-subscriber", "generation": 1, "subscriberUri": subscriber_uri}]},
    }
    return "# Written by `kafka-eventing run`: the channel the demo's receiver and dispatcher serve.\n" + \
        yaml.safe_dump(channel, sort_keys=False)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # no __all__

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class Children:
    """Child processes in their own process groups, stopped (SIGTERM, then SIGKILL) in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def check(self) -> None:
        for name, proc, log in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log ({log}):\n{_proc.tail(log)}")

    def stop(self) -> None:
        for _name, proc, _log in reversed(self.procs):
            _proc.terminate(proc, timeout=20)
        self.procs.clear()


def wait_http(url: str, children: Children, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children.check()
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http://127.0.0.1 only
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready within {timeout:.0f}s ({url})")


def send_event(port: int, event_id: str, number: int) -> int:
    body = json.dumps({"message": f"hello from kafka-eventing #{number}"}).encode()
    return post_event(f"http://127.0.0.1:{port}/{NAMESPACE}/{CHANNEL}", body,
                      {"ce-id": event_id, "ce-type": "dev.example.demo"})


def post_event(url: str, body: bytes, attributes: dict[str, str]) -> int:
    """POST one binary-mode CloudEvent; the HTTP status."""
    request = urllib.request.Request(url, data=body, method="POST", headers={  # noqa: S310 - http://127.0.0.1
        "ce-specversion": "1.0", "ce-source": "/kafka-eventing/demo", "content-type": "application/json",
        **attributes})
    try:
        with urllib.request.urlopen(request, timeout=15) as resp:  # noqa: S310 - http://127.0.0.1 only
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def start_roles(port: int, workdir: Path, node: KafkaNode, children: Children, config: Path, *,
                dispatcher_env: dict[str, str]) -> int:
    """The receiver and one dispatcher as child processes on ``config`` (file mode); waits for the receiver and
    returns the dispatcher's probe port."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
           "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(config),
           "KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_LOG_FORMAT": "json",
           "PROMETHEUS_MULTIPROC_DIR": str(workdir / "prometheus")}
    if os.environ.get("KE_CACHE"):
        env["KE_CACHE"] = os.environ["KE_CACHE"]
    children.start("receiver", [sys.executable, "-m", "kafka_eventing.receiver",
                                "--bind", f"127.0.0.1:{port}", "--workers", "1"],
                   env, workdir / "receiver.log")
    dispatcher_port = _proc.free_port()
    # One process with its own registry, as in its pods: the receiver's multiprocess directory is the receiver's
    # (it empties it when it starts, and creates it — possibly after the dispatcher would have written there).
    dispatcher = {k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    children.start("dispatcher", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                   {**dispatcher, **dispatcher_env, "KE_METRICS_PORT": str(dispatcher_port)},
                   workdir / "dispatcher.log")
    with progress("the receiver"):
        wait_http(f"http://127.0.0.1:{port}/readyz", children, 60, "receiver")
    return dispatcher_port


def stay_up(args: argparse.Namespace, children: Children) -> int:
    """After the demo: exit (``--exit-after-demo``) or keep serving until Ctrl-C (or a child dies)."""
    if args.exit_after_demo:
        return 0
    say("\nrunning; press Ctrl-C to stop")
    while True:
        children.check()
        time.sleep(0.5)


class _Interrupted(Exception):
    pass


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM both end the demo through the same cleanup path."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise _Interrupted

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kafka-eventing run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8080, help="receiver port on 127.0.0.1 (default 8080)")
    parser.add_argument("--events", type=int, default=3, help="events sent in the demo round trip")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds allowed for the round trip")
    parser.add_argument("--exit-after-demo", action="store_true", help="exit after the round trip (0 = delivered)")
    parser.add_argument("--workdir", type=Path, default=cache_dir() / "run", help="state and logs (wiped first)")
    parser.add_argument("--broker", action="store_true",
                        help="the Kafka Broker instead: one Broker, three Triggers with different filters, fan-out")
    parser.add_argument("--source", action="store_true",
                        help="a KafkaSource instead: plain (non-CloudEvent) records written to a topic arrive at "
                             "the subscriber as CloudEvents")
    args = parser.parse_args(argv)

    workdir: Path = args.workdir
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    node = KafkaNode(workdir / "kafka")
    subscriber = DemoSubscriber()
    children = Children()
    try:
        with _signals():
            if args.broker:
                return _run_broker(args, workdir, node, children)
            if args.source:
                return _run_source(args, workdir, node, subscriber, children)
            return _run(args, workdir, node, subscriber, children)
    except _Interrupted:
        say("\nstopping (interrupted)...")
        return 0 if not args.exit_after_demo else 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        say(f"demo failed: {exc}")
        return 1
    finally:
        with _signals(), contextlib.suppress(_Interrupted):  # a second Ctrl-C must not skip the cleanup
            children.stop()
            subscriber.stop()
            node.stop()
        say(f"all stopped; logs are in {workdir}")


def _run(args: argparse.Namespace, workdir: Path, node: KafkaNode, subscriber: DemoSubscriber,
         children: Children) -> int:
    say(f"starting a local Kafka node (logs: {node.log_path})...")
    with progress("the Kafka node"):
        node.start()
    topic = Settings().topic_for(NAMESPACE, CHANNEL)
    create_topic(node.bootstrap_servers, topic)
    say(f"kafka ready at {node.bootstrap_servers}; topic {topic} ({PARTITIONS} partitions) created")

    subscriber.start()
    sub_uri = f"http://127.0.0.1:{subscriber.port}/"
    channels = workdir / "channels.yaml"
    channels.write_text(channels_yaml(sub_uri))
    say(f"channels file: {channels} (KafkaChannel {NAMESPACE}/{CHANNEL}, subscriber {sub_uri})")

    dispatcher_port = start_roles(args.port, workdir, node, children, channels,
                                  dispatcher_env={"KE_CHANNEL_NAMESPACE": NAMESPACE, "KE_CHANNEL_NAME": CHANNEL})
    say(f"receiver listening on http://127.0.0.1:{args.port} (logs: {workdir / 'receiver.log'})")
    # The subscription starts at the latest offset: send only once its consumer group has joined.
    with progress("the dispatcher"):
        wait_http(f"http://127.0.0.1:{dispatcher_port}/readyz", children, 60, "dispatcher")
    say(f"dispatcher ready; status at http://127.0.0.1:{dispatcher_port}/status "
        f"(logs: {workdir / 'dispatcher.log'})")

    ids = [f"demo-{i}-{int(time.time())}" for i in range(1, args.events + 1)]
    for number, event_id in enumerate(ids, 1):
        code = send_event(args.port, event_id, number)
        say(f"[sender] POST /{NAMESPACE}/{CHANNEL} ce-id={event_id} -> {code}")
        if code != 202:
            raise RuntimeError(f"the receiver answered {code} for {event_id}; see {workdir / 'receiver.log'}")
    deadline = time.monotonic() + args.deadline
    while not subscriber.got(ids):
        children.check()
        if time.monotonic() > deadline:
            say(f"NOT DELIVERED within {args.deadline:.0f}s: {sorted(set(ids) - set(subscriber.received))}")
            return 1
        time.sleep(0.05)
    say(f"round trip complete: {len(ids)} events went receiver -> Kafka -> dispatcher -> subscriber")
    say("\nsend more with:\n"
        f"  curl -i -X POST http://127.0.0.1:{args.port}/{NAMESPACE}/{CHANNEL} \\\n"
        "    -H 'ce-specversion: 1.0' -H 'ce-id: my-1' -H 'ce-type: dev.example.demo' \\\n"
        "    -H 'ce-source: /curl' -H 'content-type: application/json' -d '{\"hello\": \"world\"}'")
    return stay_up(args, children)


# -- `kafka-eventing run --broker` ---------------------------------------------------------------------------
BROKER = "demo"
#: (Trigger, what its filter says, the filter): three dialects, three different selections of the same events.
DEMO_TRIGGERS = (
    ("all-orders", "prefix type=com.example.order.", [{"prefix": {"type": "com.example.order."}}]),
    ("eu-orders", "cesql: type LIKE 'com.example.order.%' AND region = 'eu'",
     [{"cesql": "type LIKE 'com.example.order.%' AND region = 'eu'"}]),
    ("not-orders", "not prefix type=com.example.order.", [{"not": {"prefix": {"type": "com.example.order."}}}]),
)
DEMO_EVENTS = (
    ("com.example.order.created", "eu"), ("com.example.order.created", "us"), ("com.example.user.created", "eu"),
    ("com.example.order.shipped", "eu"), ("com.example.user.deleted", "us"),
)


def broker_yaml(ingress: str, subscribers: dict[str, str]) -> str:
    docs: list[dict[str, Any]] = [{
        "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
        "metadata": {"name": BROKER, "namespace": NAMESPACE,
                     "annotations": {"eventing.knative.dev/broker.class": "Kafka"}},
        # Standalone: no controller resolves the address, so it is written here (replies go to it).
        "status": {"address": {"url": ingress}},
    }]
    for name, _, filters in DEMO_TRIGGERS:
        docs.append({"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
                     "metadata": {"name": name, "namespace": NAMESPACE},
                     "spec": {"broker": BROKER, "filters": filters, "subscriber": {"uri": subscribers[name]}}})
    return "# Written by `kafka-eventing run --broker`: the Broker and Triggers the demo serves.\n" + \
        yaml.safe_dump_all(docs, sort_keys=False)


def send_broker_event(port: int, event_id: str, event_type: str, region: str) -> int:
    return post_event(f"http://127.0.0.1:{port}/{NAMESPACE}/{BROKER}", json.dumps({"id": event_id}).encode(),
                      {"ce-id": event_id, "ce-type": event_type, "ce-region": region})


def _run_broker(args: argparse.Namespace, workdir: Path, node: KafkaNode, children: Children) -> int:
    from kafka_eventing.core.brokers import broker_topic

    say(f"starting a local Kafka node (logs: {node.log_path})...")
    node.start()
    topic = broker_topic(NAMESPACE, BROKER)
    create_topic(node.bootstrap_servers, topic)
    say(f"kafka ready at {node.bootstrap_servers}; Broker topic {topic} ({PARTITIONS} partitions) created")
    subscribers = {name: DemoSubscriber() for name, _, _ in DEMO_TRIGGERS}
    try:
        for sub in subscribers.values():
            sub.start()
        ingress = f"http://127.0.0.1:{args.port}/{NAMESPACE}/{BROKER}"
        config = workdir / "broker.yaml"
        config.write_text(broker_yaml(ingress, {n: f"http://127.0.0.1:{s.port}/" for n, s in subscribers.items()}))
        say(f"broker file: {config} (Broker {NAMESPACE}/{BROKER}, {len(DEMO_TRIGGERS)} Triggers)")
        for name, what, _ in DEMO_TRIGGERS:
            say(f"  Trigger {name:<11} {what}")
        dispatcher_port = start_roles(args.port, workdir, node, children, config,
                                      dispatcher_env={"KE_BROKER_NAMESPACE": NAMESPACE, "KE_BROKER_NAME": BROKER})
        # Each Trigger's consumer group starts at the latest offset: send once every group has joined.
        with progress("the dispatcher"):
            wait_http(f"http://127.0.0.1:{dispatcher_port}/readyz", children, 60, "dispatcher")
        say(f"receiver on {ingress}; dispatcher status at http://127.0.0.1:{dispatcher_port}/status")

        stamp = int(time.time())
        sent = []
        for number, (event_type, region) in enumerate(DEMO_EVENTS, 1):
            event_id = f"ev-{number}-{stamp}"
            code = send_broker_event(args.port, event_id, event_type, region)
            say(f"[sender] POST /{NAMESPACE}/{BROKER} {event_id} type={event_type} region={region} -> {code}")
            if code != 202:
                raise RuntimeError(f"the receiver answered {code}; see {workdir / 'receiver.log'}")
            sent.append((event_id, event_type, region))
        expected = {name: [eid for eid, t, r in sent if _demo_match(name, t, r)] for name, _, _ in DEMO_TRIGGERS}
        deadline = time.monotonic() + args.deadline
        while not all(subscribers[n].got(ids) for n, ids in expected.items()):
            children.check()
            if time.monotonic() > deadline:
                say("NOT DELIVERED in time: " + ", ".join(
                    f"{n}: {sorted(set(ids) - set(subscribers[n].received))}" for n, ids in expected.items()))
                return 1
            time.sleep(0.05)
        time.sleep(0.5)  # a wrong extra delivery would arrive by now
        say("\nwhich subscriber got what:")
        wrong = False
        for name, what, _ in DEMO_TRIGGERS:
            got = sorted(set(subscribers[name].received))
            wrong = wrong or got != sorted(expected[name])
            say(f"  {name:<11} ({what}): {', '.join(got) or '-'}")
        if wrong:
            say("a subscriber got an event its filter does not select")
            return 1
        say(f"\nfan-out complete: {len(sent)} events in, each delivered to every Trigger whose filter matches")
        return stay_up(args, children)
    finally:
        for sub in subscribers.values():
            sub.stop()


def _demo_match(trigger: str, event_type: str, region: str) -> bool:
    """What each demo Trigger's filter selects, said independently of the filter engine (checks the output)."""
    order = event_type.startswith("com.example.order.")
    return {"all-orders": order, "eu-orders": order and region == "eu", "not-orders": not order}[trigger]


# -- `kafka-eventing run --source` ---------------------------------------------------------------------------
SOURCE, SOURCE_TOPIC = "demo", "demo-orders"
#: What the demo writes to the topic: (key, headers, value) — records no CloudEvents SDK wrote.
DEMO_RECORDS: tuple[tuple[bytes | None, list[tuple[str, str | bytes | None]], bytes], ...] = (
    (b"order-1", [("content-type", b"application/json"), ("X-Shop", b"eu-1")], b'{"order": 1, "total": 9.5}'),
    (b"order-2", [], b"plain text, no headers"),
    (None, [("trace-id", b"abc123")], b"a record without a key"),
)


def source_yaml(subscriber_uri: str) -> str:
    source = {
        "apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource",
        "metadata": {"name": SOURCE, "namespace": NAMESPACE, "uid": "demo-source"},
        "spec": {"bootstrapServers": ["(the dispatcher's KE_BOOTSTRAP_SERVERS)"], "topics": [SOURCE_TOPIC],
                 "initialOffset": "earliest", "ordering": "ordered",
                 "ceOverrides": {"extensions": {"demo": "true"}},
                 "delivery": {"retry": 5, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"},
                 "sink": {"uri": subscriber_uri}},
    }
    return "# Written by `kafka-eventing run --source`: the KafkaSource the demo's dispatcher serves.\n" + \
        yaml.safe_dump(source, sort_keys=False)


def _run_source(args: argparse.Namespace, workdir: Path, node: KafkaNode, subscriber: DemoSubscriber,
                children: Children) -> int:
    from confluent_kafka import Producer

    say(f"starting a local Kafka node (logs: {node.log_path})...")
    with progress("the Kafka node"):
        node.start()
    create_topic(node.bootstrap_servers, SOURCE_TOPIC)
    say(f"kafka ready at {node.bootstrap_servers}; topic {SOURCE_TOPIC} ({PARTITIONS} partitions) created")
    subscriber.start()
    sub_uri = f"http://127.0.0.1:{subscriber.port}/"
    config = workdir / "source.yaml"
    config.write_text(source_yaml(sub_uri))
    say(f"source file: {config} (KafkaSource {NAMESPACE}/{SOURCE}, topic {SOURCE_TOPIC}, sink {sub_uri})")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_")},
           "KE_CHANNEL_SOURCE": "file", "KE_CHANNELS_FILE": str(config),
           "KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_LOG_FORMAT": "json",
           "KE_SOURCE_NAMESPACE": NAMESPACE, "KE_SOURCE_NAME": SOURCE, "KE_DISPATCHER_INITIAL_OFFSET": "earliest"}
    dispatcher_port = _proc.free_port()
    children.start("dispatcher", [sys.executable, "-m", "kafka_eventing.dispatcher", "--host", "127.0.0.1"],
                   {**env, "KE_METRICS_PORT": str(dispatcher_port)}, workdir / "dispatcher.log")
    with progress("the dispatcher"):
        wait_http(f"http://127.0.0.1:{dispatcher_port}/readyz", children, 60, "dispatcher")
    say(f"dispatcher ready; status at http://127.0.0.1:{dispatcher_port}/status (logs: {workdir / 'dispatcher.log'})")

    producer = Producer({"bootstrap.servers": node.bootstrap_servers})
    ids: list[str] = []

    def written(err: Any, msg: Any) -> None:
        if err is None:
            ids.append(f"partition:{msg.partition()}/offset:{msg.offset()}")

    for key, headers, value in DEMO_RECORDS:
        producer.produce(SOURCE_TOPIC, value=value, key=key, headers=headers, partition=0, on_delivery=written)
        say(f"[producer] plain record key={key!r} headers={[h for h, _ in headers]} value={value!r}")
    if producer.flush(30) or len(ids) != len(DEMO_RECORDS):
        raise RuntimeError("the demo records were not written to Kafka")
    deadline = time.monotonic() + args.deadline
    while not subscriber.got(ids):
        children.check()
        if time.monotonic() > deadline:
            say(f"NOT DELIVERED within {args.deadline:.0f}s: {sorted(set(ids) - set(subscriber.received))}")
            return 1
        time.sleep(0.05)
    say(f"source complete: {len(ids)} plain records went Kafka -> dispatcher -> subscriber as CloudEvents "
        "(type dev.knative.kafka.event, the key and headers as extensions)")
    say("\nwrite more with any Kafka client, e.g.:\n"
        f"  echo 'hello' | kafka-console-producer.sh --bootstrap-server {node.bootstrap_servers} "
        f"--topic {SOURCE_TOPIC}")
    return stay_up(args, children)
