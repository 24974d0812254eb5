"""Events arrive as they were sent, proved with a tool nobody here wrote: the CloudEvents conformance tool
(``cloudevents send|listen|diff``, github.com/cloudevents/conformance v0.4.1, built by ``hack/setup/go-tools.sh``).

``cloudevents send`` drives events of every attribute the tool can send — ``time`` with and without a fraction and
in other zones, ``subject``, a ``datacontenttype`` or none, data or none, odd extension names and values — in
binary and structured mode, into the real receiver (gunicorn) → real Kafka → the real dispatcher, through a
KafkaChannel (binary-mode and structured-mode records) and through a Kafka Broker. At each target two
``cloudevents listen`` subscribers (one in binary mode, one with ``delivery.format: json``) and two subscribers of
this test's own take every event; ``cloudevents diff`` finds nothing between what ``send`` says it sent and what
``listen`` got.

What ``diff`` can and cannot judge, and what this test's own subscriber checks instead (the tool's v0.4.1 quirks):

- ``listen`` in binary mode names an extension as Go canonicalises the header (``ce-myext`` → ``Myext``) and keeps a
  value percent-encoded as it arrives (the HTTP binding's encoding of ``café``); in structured mode it appends a
  newline to ``data``, and ``send`` writes a structured event's data compacted. So the binary ``listen`` is compared
  without extensions (its core attributes are all header-safe here), the structured one on events whose data went
  through unchanged by the tool itself (no data, or data sent as compact JSON plus the newline ``listen`` adds).
- The test's own subscribers decode every request with nothing from this project (the HTTP binding by hand:
  ``ce-*`` headers percent-decoded, or the JSON document) and compare every attribute, every extension and the
  data bytes with what was sent, for every event at every target.

The hypothesis property of tests/unit/core/test_fidelity.py (any valid event in, the identical event out) runs here
on the same real parts as well, with the sender and subscriber of tests/events.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support.dispatcher import KAFKA_EXTRA, NS, InProcess, Received, Subscriber
from support.receiver import Receiver, read_topic

from events import assert_arrived_as_sent, request
from events import events as any_events
from kafka_eventing.core.channel_source import FileChannelSource
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher import create_dispatcher
from kafka_eventing.dispatcher.sources import FileSourceSource
from kafka_eventing.dispatcher.triggers import FileTriggerSource
from kafka_eventing.localstack import _proc
from kafka_eventing.localstack._proc import tail, terminate
from kafka_eventing.localstack.kafka import KafkaNode
from kafka_eventing.localstack.tools import ToolNotFoundError, tool_path
from waiting import wait_for

pytestmark = pytest.mark.kafka

BROKER = "fidelity"
CHANNEL = "fidelity"
READER = "fidelity-reader"  # the channel that reads a KafkaSink's topic
JSON_TYPES = ("application/json", None)


@dataclass
class Sent:
    """One event as given to ``cloudevents send``."""

    id: str
    mode: str  # binary | structured
    attrs: dict[str, str]  # source, type, and time / subject / datacontenttype when set
    extensions: dict[str, str] = field(default_factory=dict)
    data: str | None = None
    #: Compared by which ``listen`` (see the module docstring): "binary", "structured", both or neither.
    diff_at: tuple[str, ...] = ("binary",)

    def args(self) -> list[str]:
        out = ["--id", self.id, "--mode", self.mode]
        for name, value in self.attrs.items():
            out += [f"--{name}", value]
        for name, value in self.extensions.items():
            # A string-slice flag: each value is read as a CSV field, so quotes and commas are CSV-quoted.
            out += ["--extension", '"' + f"{name}={value}".replace('"', '""') + '"']
        if self.data is not None:
            out += ["--data", self.data]
        return out

    def expected_attributes(self) -> dict[str, str]:
        return {"specversion": "1.0", "id": self.id, **self.attrs, **self.extensions}

    def expected_data(self) -> bytes:
        """The event's data bytes: a binary body as sent; a structured ``data`` member as the tool wrote it
        (compact JSON), or the text a JSON string stands for when ``datacontenttype`` is not JSON."""
        if self.data is None:
            return b""
        if self.mode == "binary":
            return self.data.encode()
        value = json.loads(self.data)
        if isinstance(value, str) and self.attrs.get("datacontenttype") not in JSON_TYPES:
            return value.encode()
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def tool_events(run: str) -> list[Sent]:
    """Every attribute the tool sends, both modes, with and without data and datacontenttype."""
    base = {"source": "https://example.com/fidelity", "type": "com.example.fidelity"}
    # CloudEvents' types as extension values (String, Integer, Boolean, Binary, URI, URI-reference, Timestamp),
    # odd names (one letter, digits, over the 20 characters the spec advises) and odd values. `send` does not
    # percent-encode binary-mode values, so a "%XX" there would mean the character it encodes (HTTP binding):
    # literal percent escapes are sent in structured mode only (s-nodata).
    odd = {"a1b2c3": "with space", "x": "café ✓", "q": 'say "hi", twice', "n": "-2147483648", "flag": "true",
           "averyveryverylongextensionname": "v", "pct": "100% sure", "bin": "AAEC/w==",
           "uri": "https://example.com/a?b=c&d=~#f", "ref": "../x", "ts": "1985-04-12T23:20:50.52Z"}
    return [
        Sent(f"{run}-b-text", "binary", {**base, "time": "2024-05-01T12:34:56.789Z", "subject": "sub/ject:1",
                                         "datacontenttype": "text/plain"}, odd, "hello, world ✓",
             diff_at=("binary",)),
        Sent(f"{run}-b-json", "binary", {**base, "time": "2024-05-01T12:34:56.5+02:00",
                                         "datacontenttype": "application/json"}, {"e": "1"},
             '{"b": 1.50,  "a": [1e3]}', diff_at=("binary",)),
        Sent(f"{run}-b-nodata", "binary", {**base, "time": "2024-05-01T12:34:56+00:00"}, {"e": "2"},
             diff_at=("binary", "structured")),
        Sent(f"{run}-b-noctype", "binary", {**base, "time": "2024-05-01T12:34:56.123456789Z"}, {}, "raw text, no type",
             diff_at=("binary",)),
        Sent(f"{run}-b-octets", "binary", {**base, "datacontenttype": "application/octet-stream"}, {"e": "3"},
             "\u0001\u0002 bytes", diff_at=("binary",)),
        Sent(f"{run}-s-json", "structured", {**base, "time": "2024-05-01T12:34:56.789Z", "subject": "s1",
                                             "datacontenttype": "application/json"}, odd, '{"a":1,"b":[true,null]}',
             diff_at=("binary",)),
        Sent(f"{run}-s-json-nl", "structured", {**base, "time": "2024-05-01T12:34:56.5-07:30",
                                                "datacontenttype": "application/json"}, odd, '{"a":"✓"}\n',
             diff_at=("structured",)),
        Sent(f"{run}-s-nodata", "structured", {**base, "time": "2024-05-01T12:34:56.000Z"}, {"pct": "%41"},
             diff_at=("binary", "structured")),
        Sent(f"{run}-s-noctype", "structured", base, {"e": "4"}, '{"k":"v"}', diff_at=("binary",)),
        Sent(f"{run}-s-text", "structured", {**base, "datacontenttype": "text/plain"}, {"e": "5"}, '"a text"',
             diff_at=()),
    ]


# -- the tool ---------------------------------------------------------------------------------------------------


@pytest.fixture
def cloudevents() -> Path:
    try:
        return tool_path("cloudevents")
    except ToolNotFoundError as exc:
        # A real tier (kafka): under KAFKA_EVENTING_REQUIRE_REAL_TIERS (make test) this skip fails the run.
        pytest.skip(f"the CloudEvents conformance tool is not built: {exc}")


@dataclass
class Listener:
    """``cloudevents listen`` on a free port; what it prints (YAML, one document per event) goes to ``out``."""

    port: int
    out: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def events(self) -> list[dict[str, Any]]:
        text = self.out.read_text()
        return [d for d in yaml.safe_load_all(text[:text.rfind("---\n") + 4]) if d] if "---\n" in text else []


@pytest.fixture
def listen(cloudevents: Path, tmp_path: Path) -> Iterator[Callable[[str], Listener]]:
    started: list[Listener] = []

    def start(name: str) -> Listener:
        port = _proc.free_port()
        out, err = tmp_path / f"listen-{name}.yaml", tmp_path / f"listen-{name}.log"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen([str(cloudevents), "listen", "-P", str(port)], stdout=stdout, stderr=stderr,
                                    start_new_session=True)
        listener = Listener(port, out, proc)
        started.append(listener)
        wait_for(lambda: proc.poll() is not None or _proc.port_open(port), 20, f"cloudevents listen ({name})")
        assert proc.poll() is None, f"cloudevents listen exited:\n{tail(err)}"
        return listener

    try:
        yield start
    finally:
        for listener in started:
            terminate(listener.proc)


def send(cloudevents: Path, url: str, event: Sent) -> str:
    """``cloudevents send``; returns the YAML the tool prints for what it sent (the ``want`` of ``diff``)."""
    done = subprocess.run([str(cloudevents), "send", url, *event.args(), "--yaml"], capture_output=True,
                          timeout=30, check=False)
    assert done.returncode == 0, f"send {event.id}: {done.stderr.decode(errors='replace')}"
    return done.stdout.decode()


def diff(cloudevents: Path, want: list[dict[str, Any]], got: list[dict[str, Any]], tmp: Path, name: str) -> str:
    a, b = tmp / f"want-{name}.yaml", tmp / f"got-{name}.yaml"
    a.write_text(yaml.safe_dump_all(want, sort_keys=False))
    b.write_text(yaml.safe_dump_all(got, sort_keys=False))
    done = subprocess.run([str(cloudevents), "diff", str(a), str(b), "--match", "id"], capture_output=True, check=False,
                          timeout=30)
    return (done.stdout + done.stderr).decode(errors="replace") + ("" if done.returncode == 0 else "(exit 1)")


def without_extensions(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for doc in docs:
        attrs = {k: v for k, v in (doc.get("ContextAttributes") or {}).items() if k != "Extensions"}
        out.append({**doc, "ContextAttributes": attrs})
    return out


# -- the test's own decoding of what a subscriber got (the HTTP binding by hand) --------------------------------


def decoded(request: Received) -> tuple[dict[str, str], bytes | Any]:
    """(attributes, data): binary mode → the body's bytes; structured mode → the bytes ``data_base64`` or a
    string ``data`` stands for, else (JSON data) the parsed value, checked against the text separately."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    if headers.get("content-type", "").split(";")[0].strip() == "application/cloudevents+json":
        doc = json.loads(request.body)
        attrs = {k: v for k, v in doc.items() if k not in ("data", "data_base64")}
        if "data_base64" in doc:
            return attrs, base64.b64decode(doc["data_base64"])
        if "data" not in doc:
            return attrs, b""
        if isinstance(doc["data"], str) and attrs.get("datacontenttype") not in JSON_TYPES:
            return attrs, doc["data"].encode()
        return attrs, JsonData(doc["data"])
    attrs = {k[3:]: unquote(v) for k, v in headers.items() if k.startswith("ce-")}
    if "content-type" in headers:
        attrs["datacontenttype"] = headers["content-type"]
    return attrs, request.body


@dataclass
class JsonData:
    value: Any


# -- the system under test ---------------------------------------------------------------------------------------


def new_topic(kafka: KafkaNode) -> str:
    name = f"test.{uuid.uuid4().hex[:12]}"
    admin = AdminClient(kafka.client_config())
    for fut in admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1)]).values():
        fut.result(timeout=30)
    return name


def subscribers(urls: dict[str, str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """name → (URI, delivery): each subscriber in binary mode and with ``delivery.format: json``."""
    return {name: (url, {"format": "json"} if name.endswith("json") else {}) for name, url in urls.items()}


def resources(target: str, topic: str, subs: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The KafkaChannel, or the Broker and its Triggers (no status.address: the listeners send no replies); a
    ``sink-*`` target: a KafkaSink of that content mode writing the topic the channel's dispatcher reads."""
    if target.startswith("sink-"):
        sink = {"apiVersion": "eventing.knative.dev/v1alpha1", "kind": "KafkaSink",
                "metadata": {"name": CHANNEL, "namespace": NS},
                "spec": {"topic": topic, "contentMode": target.removeprefix("sink-")}}
        # The channel reading the topic has another name: /<ns>/fidelity is the sink's alone, so an event the
        # receiver did not route to the sink is refused (404), not written to the same topic another way.
        channel = yaml.safe_load(resources("channel-binary", topic, subs))
        channel["metadata"]["name"] = READER
        return yaml.safe_dump_all([sink, channel])
    if target == "broker":
        docs: list[dict[str, Any]] = [{
            "apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
            "metadata": {"name": BROKER, "namespace": NS, "annotations": {
                "eventing.knative.dev/broker.class": "Kafka", "kafka.eventing.knative.dev/external.topic": topic}}}]
        docs += [{"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
                  "metadata": {"name": name, "namespace": NS},
                  "spec": {"broker": BROKER, "subscriber": {"uri": uri}, **({"delivery": d} if d else {})}}
                 for name, (uri, d) in subs.items()]
        return yaml.safe_dump_all(docs)
    mode = "structured" if target == "channel-structured" else "binary"  # a source run's channel: binary
    return yaml.safe_dump({
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": CHANNEL, "namespace": NS, "annotations": {
            "kafka.eventing.knative.dev/external.topic": topic, "kafka.eventing.knative.dev/content.mode": mode}},
        "spec": {"subscribers": [{"uid": name, "generation": 1, "subscriberUri": uri, **({"delivery": d} if d else {})}
                                 for name, (uri, d) in subs.items()]}})


def start_dispatcher(kafka: KafkaNode, target: str, path: Path,
                     subs: dict[str, tuple[str, dict[str, Any]]] | None = None, topic: str = "") -> Dispatchers:
    """The dispatcher of the target's channel or Broker; for ``source``, one KafkaSource per subscriber (a source
    has one sink), each reading the topic the receiver's channel writes."""
    if target == "source":
        started = Dispatchers([])
        for sub, (uri, delivery) in (subs or {}).items():
            name = f"{CHANNEL}-{sub}"
            doc = {"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource",
                   "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
                   "spec": {"bootstrapServers": ["ignored-in-standalone:9092"], "topics": [topic],
                            "sink": {"uri": uri}, **({"delivery": delivery} if delivery else {})}}
            file = path.with_name(f"{name}.yaml")
            file.write_text(yaml.safe_dump(doc))
            settings = Settings(bootstrap_servers=kafka.bootstrap_servers, source_namespace=NS, source_name=name,
                                log_level="WARNING", kafka_extra=KAFKA_EXTRA)
            files = FileSourceSource(file, settings, NS, name, poll_interval=0.1)
            dispatcher = create_dispatcher(settings, connection_from_settings(settings), files,
                                           registry=CollectorRegistry(), host="127.0.0.1", port=0,
                                           initial_offset="earliest")
            running = InProcess(dispatcher, files).start()  # type: ignore[arg-type]
            started.parts.append(running)
            wait_for(running.ready, 30, f"{name}'s consumer group joined")
        return started
    name = BROKER if target == "broker" else READER if target.startswith("sink-") else CHANNEL
    settings = Settings(bootstrap_servers=kafka.bootstrap_servers, channel_namespace=NS, channel_name=name,
                        log_level="WARNING", kafka_extra=KAFKA_EXTRA,
                        **({"broker_namespace": NS, "broker_name": name} if target == "broker" else {}))
    source: FileChannelSource = (FileTriggerSource(path, settings, NS, name, poll_interval=0.1) if target == "broker"
                                 else FileChannelSource(path, settings, poll_interval=0.1))
    dispatcher = create_dispatcher(settings, connection_from_settings(settings), source,
                                   registry=CollectorRegistry(), host="127.0.0.1", port=0, initial_offset="earliest")
    running = InProcess(dispatcher, source).start()
    wait_for(running.ready, 30, "consumer groups joined")
    return Dispatchers([running])


@dataclass
class Dispatchers:
    parts: list[InProcess]

    def stop(self) -> None:
        for part in self.parts:
            part.stop()


@pytest.mark.parametrize("target", ["channel-binary", "channel-structured", "broker", "sink-binary",
                                    "sink-structured", "source"])
def test_every_event_arrives_as_sent(target: str, cloudevents: Path, listen: Callable[[str], Listener],
                                     kafka_running: KafkaNode, start_receiver: Callable[..., Receiver],
                                     tmp_path: Path) -> None:
    topic = new_topic(kafka_running)
    tool = {"listen-binary": listen("binary"), "listen-json": listen("json")}
    with Subscriber().running() as own:
        subs = subscribers({**{name: lst.url for name, lst in tool.items()},
                            "own-binary": own.url("/binary"), "own-json": own.url("/json")})
        # A KafkaSink is addressed by the Host of the sink ingress Service: here "localhost", the channel of the
        # same name by 127.0.0.1.
        # A ``source`` run: the channel only writes the topic (no subscribers); KafkaSources read it.
        receiver = start_receiver(resources(target, topic, {} if target == "source" else subs),
                                  bootstrap=kafka_running.bootstrap_servers, env={"KE_SINK_SERVICE": "localhost"})
        dispatcher = start_dispatcher(kafka_running, target, receiver.channels_file, subs, topic)
        try:
            sent = tool_events(target)
            address = (f"{receiver.url}/{NS}/{BROKER}" if target == "broker" else f"{receiver.url}/{NS}/{CHANNEL}")
            if target.startswith("sink-"):
                address = address.replace("//127.0.0.1:", "//localhost:")
            want = {e.id: next(d for d in yaml.safe_load_all(send(cloudevents, address, e)) if d) for e in sent}
            ids = {e.id for e in sent}
            for sub in ("/binary", "/json"):
                wait_for(lambda s=sub: ids <= {r.headers.get("ce-id") or json.loads(r.body).get("id")  # type: ignore[misc]
                                                for r in own.at(s)}, 60, f"every event at {target}{sub}")
            for name, lst in tool.items():
                wait_for(lambda lst=lst: ids <= {d["ContextAttributes"]["id"] for d in lst.events()},  # type: ignore[misc]
                         60, f"every event at {target} {name}")
        finally:
            dispatcher.stop()

        # 1. The tool's own verdict.
        got_binary, got_json = tool["listen-binary"].events(), tool["listen-json"].events()
        assert all(d["Mode"] == "binary" for d in got_binary) and all(d["Mode"] == "structured" for d in got_json)
        verdict = diff(cloudevents, without_extensions([want[e.id] for e in sent if "binary" in e.diff_at]),
                       without_extensions(got_binary), tmp_path, "binary")
        assert verdict == "", f"cloudevents diff (binary-mode subscriber, extensions aside):\n{verdict}"
        verdict = diff(cloudevents, [want[e.id] for e in sent if "structured" in e.diff_at], got_json, tmp_path,
                       "structured")
        assert verdict == "", f"cloudevents diff (delivery.format json subscriber):\n{verdict}"

        # 2. Every attribute, extension and data byte, at every subscriber, decoded by hand.
        for sub in ("/binary", "/json"):
            by_id, by_body = {}, {}
            for request in own.at(sub):
                structured = request.headers.get("Content-Type", "").startswith("application/cloudevents+json")
                assert structured == (sub == "/json"), f"{sub}: wrong content mode {request.headers}"
                attrs, data = decoded(request)
                by_id[attrs["id"]], by_body[attrs["id"]] = (attrs, data), request.body
            for event in sent:
                attrs, data = by_id[event.id]
                assert attrs == event.expected_attributes(), f"{target}{sub} {event.id}: attributes"
                expected = event.expected_data()
                if isinstance(data, JsonData):  # JSON data in a document: the same value, the very same text
                    assert data.value == json.loads(expected), f"{target}{sub} {event.id}: data"
                    assert b'"data":' + expected in by_body[event.id], f"{target}{sub} {event.id}: data re-rendered"
                else:
                    assert data == expected, f"{target}{sub} {event.id}: data"

    # 3. Kafka holds what was sent: a binary-mode record's ce_time is the sender's text.
    if target not in ("channel-structured", "sink-structured"):
        records = {dict(m.headers())["ce_id"].decode(): dict(m.headers()) for m in read_topic(kafka_running, topic,
                                                                                              len(sent))}
        for event in sent:
            if "time" in event.attrs:
                assert records[event.id]["ce_time"] == event.attrs["time"].encode()


@pytest.mark.parametrize("target", ["channel-binary", "channel-structured", "broker"])
def test_any_valid_event_arrives_identical_through_the_real_parts(
        target: str, kafka_running: KafkaNode, start_receiver: Callable[..., Receiver]) -> None:
    """The property of tests/unit/core/test_fidelity.py on the real receiver, Kafka and dispatcher: any valid event,
    sent in binary or structured mode, reaches a binary-mode and a ``delivery.format: json`` subscriber identical."""
    topic = new_topic(kafka_running)
    with Subscriber().running() as own:
        subs = subscribers({"own-binary": own.url("/binary"), "own-json": own.url("/json")})
        receiver = start_receiver(resources(target, topic, subs), bootstrap=kafka_running.bootstrap_servers)
        dispatcher = start_dispatcher(kafka_running, target, receiver.channels_file)
        address = f"{receiver.url}/{NS}/{BROKER if target == 'broker' else CHANNEL}"
        seen: dict[str, dict[str, Received]] = {"/binary": {}, "/json": {}}

        def arrived(path: str, event_id: str) -> Received | None:
            for r in own.at(path):
                key = r.headers.get("ce-id")
                if key is None and r.headers.get("Content-Type", "").startswith("application/cloudevents+json"):
                    key = json.loads(r.body).get("id")
                seen[path][unquote(key or "")] = r
            return seen[path].get(event_id)

        # A real server per example: a few dozen examples, no deadline (each waits for Kafka and the dispatcher).
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
        @given(data=st.data(), structured=st.booleans())
        def check(data: st.DataObject, structured: bool) -> None:
            event = data.draw(any_events(structured))
            event.attrs["id"] = f"{uuid.uuid4().hex}-{event.attrs['id']}"  # each example its own id, as generated
            headers, body = request(event, structured)
            answer = httpx.post(address, content=body, headers={k: v.encode() for k, v in headers.items()},
                                timeout=20)
            assert answer.status_code == 202, answer.text
            for path in ("/binary", "/json"):
                got = wait_for(lambda p=path: arrived(p, event.attrs["id"]), 30, f"{event.attrs['id']} at {path}")
                assert_arrived_as_sent(event, got.headers, got.body)

        try:
            check()
        finally:
            dispatcher.stop()
