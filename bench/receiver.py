"""Receiver benchmark (``make bench-receiver``): side by side on one local broker, in one run —

(a) the raw confluent-kafka producer in one process (acks=all),
(b) a bare falcon ASGI endpoint answering 202 without Kafka, under the same gunicorn workers (uvicorn, 2),
(c) the receiver, writing to a KafkaChannel and (``receiver-sink``) to a KafkaSink on the same topic (its own
    ingress Service's Host, ``/<namespace>/<name>``: the same targets as a channel's ingress),
(d) at 1 KB, the peer: Knative's Java receiver (``bench/peer.py``, built by ``make peer``; left out, and said so,
    when it is not built),
(e) at 1 KB, the same receiver with ingress auth on (``receiver-auth``: every request carries a bearer token from
    a loopback OIDC issuer, verified and checked against an EventPolicy, default mode deny-all) and with HTTPS on
    (``receiver-tls``: TLS 1.3, a certificate from a CA made for the run) — the cost of each beside auth off,

for 1 KB and 20 KB binary-mode events, loaded at saturation by ``wrk`` (closed loop, Lua script) and at half of
that rate by ``oha`` (open loop: requests are sent on a fixed schedule whatever the answers' latency, and latency
is counted from each request's scheduled time, so a stall is not hidden by the client waiting).
At 1 KB each server is also loaded by ``oha`` at fixed rates (``FIXED_RATES``: 1,000 and 3,000 events/s), where
latency and CPU per event are compared with the peer's.
Every server run is repeated (``BENCH_REPEATS``, default 3, interleaved) and the median run is reported;
``BENCH_KINDS`` (comma-separated) measures only some servers.
Results: docs/benchmarks/receiver.json and receiver.png (``BENCH_NAME`` names them otherwise, so that a narrowed
run does not replace the whole one). Not a test.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer
from _common import (
    ROOT,
    busy_percent,
    cpu_seconds,
    machine_cpu_ticks,
    machine_facts,
    new_figure,
    percentile,
    process_tree,
    pss_bytes,
    rss_bytes,
    save_png,
    write_json,
)

from kafka_eventing.localstack.oidc import Issuer
from kafka_eventing.receiver.__main__ import WORKER as RECEIVER_WORKER

#: ``BENCH_SIZES`` (bytes, comma list) and ``BENCH_KINDS`` (of KINDS_1KB) narrow a run, e.g. to the receiver against
#: the bare endpoint at 1 KB.
SIZES = tuple(int(x) for x in os.environ.get("BENCH_SIZES", f"1024,{20 * 1024}").split(","))
NAME = os.environ.get("BENCH_NAME", "receiver")
#: open-loop rates (events/s) at which every 1 KB server's latency and CPU per event are measured
FIXED_RATES = (1000, 3000)
#: warm-up at saturation before the measured runs: long enough for the peer's JIT compiler (and our caches)
WARMUP_SECONDS = 4
#: Before each size's first measured round, the receiver writes to the broker this long, unmeasured: the broker's
#: JIT warms on the receiver's pattern of produce requests (many producers, small batches), which the raw producer's
#: big batches leave cold. Without it, whichever receiver run came first met a broker spending 40-120 µs of CPU per
#: event instead of 8-20 (the bare endpoint, which writes nothing, never pays it), and the median moved with the
#: order of the runs.
BROKER_WARMUP_SECONDS = int(os.environ.get("BENCH_BROKER_WARMUP_SECONDS", "30"))
WORKERS = 2
# Enough connections that the servers, not the client, set the pace: a request waits ~tens of ms for Kafka's
# acknowledgement, so by Little's law the rate is capped at connections / latency. 256 left ~20 % of the CPU
# idle under the receiver (vmstat, on a host doing ~20,000 receiver events/s). 512 still left 1-17 % idle once
# the receiver used less CPU per event:
# a closed loop falls into waves — every connection's request lands in the same linger window, all answers
# come back together, and the next wave waits on them. At 1024 the machine is busy (idle < 1 %) under both
# servers, and the bare endpoint's rate is the same as at 512 (medians of 5: 50,018 vs 49,921/s).
SATURATION_CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "1024"))
# Open loop at half rate: enough connections that the client never waits for one (rate x worst latency).
HALF_CONNECTIONS = 256
DURATION = int(os.environ.get("BENCH_SECONDS", "8"))
# Each (server, size) is measured this many times, interleaved with the others, and reported as the median run:
# the machine is shared, so one run can be off by 2x.
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
# The worker model the receiver ships with (gunicorn_conf); gthread workers with a WSGI app measured 5.8x less
# throughput at 5.9x the CPU per event (docs/receiver.md) and are no longer offered.
MODELS = {
    # The receiver's own worker class (uvicorn + slow-client deadlines) for both, so they differ only by the app.
    "uvicorn": {"args": ["-k", RECEIVER_WORKER], "receiver": "kafka_eventing.receiver.app:get_app()",
                "bare": "receiver:bare_asgi()"},
}
#: A KafkaSink's requests name the sink ingress Service (chart value receiver.sinkService.name) by Host.
SINK_HEADERS = {"Host": "kafka-sink-ingress.knative-eventing.svc.cluster.local"}
#: The auth-on row's sender: the subject the channels file's EventPolicy allows, with a token for the channel's
#: audience (Knative's format) from the run's loopback issuer.
SENDER = "system:serviceaccount:bench:sender"
AUDIENCE = "messaging.knative.dev/kafkachannel/bench/events"
#: The targets every receiver run serves (KE_CHANNELS_FILE); the EventPolicy matters only with auth on.
CHANNELS = f"""apiVersion: messaging.knative.dev/v1beta1
kind: KafkaChannel
metadata: {{name: events, namespace: bench}}
---
apiVersion: eventing.knative.dev/v1alpha1
kind: KafkaSink
metadata: {{name: events, namespace: bench}}
spec: {{topic: bench.events}}
---
apiVersion: eventing.knative.dev/v1alpha1
kind: EventPolicy
metadata: {{name: bench-senders, namespace: bench}}
spec:
  to: [{{ref: {{apiVersion: messaging.knative.dev/v1beta1, kind: KafkaChannel, name: events}}}}]
  from: [{{sub: "{SENDER}"}}]
"""
CE_HEADERS = {"ce-specversion": "1.0", "ce-id": "bench-1", "ce-source": "/bench", "ce-type": "bench.event",
              "content-type": "application/octet-stream"}


# -- the bare endpoints (b): gunicorn imports this file as module `receiver` -------------------------------


def bare_asgi() -> Any:
    import falcon
    import falcon.asgi

    class Accept:
        async def on_post(self, req: Any, resp: Any, **_params: str) -> None:
            await req.stream.read()
            resp.status = falcon.HTTP_202

    app = falcon.asgi.App()
    app.add_route("/{namespace}/{name}", Accept())
    app.add_route("/readyz", Accept())
    return app


# -- load generation ----------------------------------------------------------------------------------------


def oha_version() -> str:
    out = subprocess.run(["oha", "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[-1]


def lua_script(path: Path, size: int, extra: dict[str, str] | None = None) -> Path:
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in {**CE_HEADERS, **(extra or {})}.items())
    path.write_text(f'wrk.method = "POST"\nwrk.body = string.rep("x", {size})\n{headers}\n')
    return path


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"unparsable wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_oha(url: str, body: Path, rate: float, *, connections: int, seconds: int, server_pid: int,
            extra: dict[str, str] | None = None, ca_file: Path | None = None) -> dict[str, Any]:
    """``rate`` requests/s on a fixed schedule (open loop) with latency from the scheduled send time."""
    pids = process_tree(server_pid)
    cpu_before = cpu_seconds(pids)
    machine_before = machine_cpu_ticks()
    headers = [arg for k, v in {**CE_HEADERS, **(extra or {})}.items() for arg in ("-H", f"{k}: {v}")]
    out = subprocess.run(
        ["oha", "-z", f"{seconds}s", "-q", f"{rate:.0f}", "--latency-correction", "-c", str(connections),
         "-m", "POST", *headers, "-D", str(body), *(["--cacert", str(ca_file)] if ca_file else []),
         "--no-tui", "--output-format", "json", url],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout
    cpu = cpu_seconds(pids) - cpu_before
    machine_busy = busy_percent(machine_before)
    report = json.loads(out)
    codes = {int(k): v for k, v in report["statusCodeDistribution"].items()}
    total = sum(codes.values())
    ok = sum(v for k, v in codes.items() if 200 <= k < 300)
    pct = report["latencyPercentiles"]
    if pct.get("p99") is None:  # no request answered at all: say what oha saw instead of a TypeError
        errors = report.get("errorDistribution")
        raise RuntimeError(f"oha got no answers at {rate:.0f}/s: codes {codes}, errors {errors}")
    return {
        "events_per_s": round(report["summary"]["requestsPerSec"], 1), "requests": total, "non_2xx": total - ok,
        "errors": sum(report.get("errorDistribution", {}).values()),
        "p50_ms": round(pct["p50"] * 1000, 2), "p99_ms": round(pct["p99"] * 1000, 2),
        "p99_9_ms": round(pct["p99.9"] * 1000, 2), "cpu_s_per_1000": round(cpu / max(ok, 1) * 1000, 4),
        "server_cpu_s": round(cpu, 2), "machine_busy_percent": machine_busy,
        "load_generator": "oha, open loop, latency corrected",
    }


def run_wrk(url: str, script: Path, connections: int, seconds: int, server_pid: int, *,
            broker_pid: int) -> dict[str, Any]:
    pids = process_tree(server_pid)
    cpu_before = cpu_seconds(pids)
    broker_before = cpu_seconds([broker_pid])
    machine_before = machine_cpu_ticks()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True, timeout=seconds + 30,
    ).stdout
    cpu = cpu_seconds(pids) - cpu_before
    broker = cpu_seconds([broker_pid]) - broker_before
    machine_busy = busy_percent(machine_before)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    pct = {m.group(1): _ms(m.group(2)) for m in re.finditer(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M)}
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    ok = total - (int(non2xx.group(1)) if non2xx else 0)
    return {
        "events_per_s": rate, "requests": total, "non_2xx": total - ok, "socket_errors": errors.group(1) if errors
        else None, "p50_ms": pct.get("50"), "p99_ms": pct.get("99"),
        "cpu_s_per_1000": round(cpu / max(ok, 1) * 1000, 4), "server_cpu_s": round(cpu, 2),
        "server_cores_busy": round(cpu / seconds, 2), "rss_mib": round(rss_bytes(pids) / 2**20, 1),
        "pss_mib": round(pss_bytes(pids) / 2**20, 1),
        # The broker shares the machine's cores with the servers: what it spent meanwhile, per 1,000 answers.
        "broker_cpu_s_per_1000": round(broker / max(ok, 1) * 1000, 4), "machine_busy_percent": machine_busy,
    }


# -- receiver variants --------------------------------------------------------------------------------------


class Variant(NamedTuple):
    """How one receiver row differs from ``receiver``: its environment, extra request headers, and the CA of its
    certificate when it serves HTTPS."""

    env: dict[str, str]
    headers: dict[str, str] | None = None
    ca_file: Path | None = None


@functools.cache
def issuer() -> Issuer:
    """The run's OIDC issuer, started on first use; it serves until the process ends."""
    return Issuer()


def receiver_variant(kind: str, env: dict[str, str], workdir: Path) -> Variant:
    if kind == "receiver-batching":  # the receiver as it was: every record waits out linger.ms
        return Variant({**env, "KE_BATCH_ABOVE_RATE": "0"})
    if kind == "receiver-sink":  # the KafkaSink of the channels file, by its ingress Host
        return Variant(env, SINK_HEADERS)
    if kind == "receiver-auth":  # a verified token and an EventPolicy on every request; deny-all elsewhere
        token = issuer().token(aud=[AUDIENCE], sub=SENDER, exp=int(time.time()) + 3600)
        return Variant({**env, "KE_AUTH_ISSUER": issuer().url, "KE_AUTH_DEFAULT_MODE": "deny-all"},
                       {"Authorization": f"Bearer {token}"})
    if kind == "receiver-tls":  # HTTPS at the default minimum, TLS 1.3
        from kafka_eventing.localstack.tls import CertificateAuthority

        ca = CertificateAuthority("bench receiver CA")
        tls = workdir / "tls"
        tls.mkdir(exist_ok=True)
        (tls / "ca.crt").write_bytes(ca.cert_pem)
        ca.issue("127.0.0.1", ("127.0.0.1",)).write(tls / "tls.crt", tls / "tls.key")
        return Variant({**env, "KE_TLS_CERT_FILE": str(tls / "tls.crt"), "KE_TLS_KEY_FILE": str(tls / "tls.key")},
                       ca_file=tls / "ca.crt")
    raise ValueError(f"no receiver variant {kind!r}")


# -- servers ------------------------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, kind: str, env: dict[str, str], workdir: Path, *,
                 ca_file: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """``ca_file``: the server speaks HTTPS (``KE_TLS_CERT_FILE`` in ``env``), verified with this CA."""
    port = free_port()
    if model == "granian":  # the bare endpoint under a compiled (Rust) HTTP server, same app, same workers
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(WORKERS), "--loop", "uvloop", "--no-ws", "--log-level", "warning",
               "--working-dir", str(Path(__file__).resolve().parent), "--factory", "receiver:bare_asgi"]
    else:
        spec = MODELS[model]
        cmd = [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf",
               "--bind", f"127.0.0.1:{port}", "--workers", str(WORKERS), *spec["args"],
               "--pythonpath", str(Path(__file__).resolve().parent), spec[kind]]
    log = (workdir / f"{model}-{kind}.log").open("ab")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"{'https' if ca_file else 'http'}://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{model}/{kind} exited; see {log.name}")
        try:
            method = "GET" if kind == "receiver" else "POST"
            request = urllib.request.Request(url + "/readyz", method=method)  # noqa: S310 - our loopback URL
            with urllib.request.urlopen(request, timeout=2, context=context) as r:  # noqa: S310
                if r.status < 300:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"{model}/{kind} not ready")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def measure_server(model: str, kind: str, size: int, env: dict[str, str], workdir: Path, *,
                   broker_pid: int) -> dict[str, Any]:
    if kind == "peer":
        port = free_port()
        proc = peer.start_peer_receiver(env["KE_BOOTSTRAP_SERVERS"], "bench.events", port, workdir)
        url, stop = f"http://127.0.0.1:{port}", peer.stop
    elif kind == "granian":
        proc, url = start_server("granian", "bare", env, workdir)
        stop = stop_server
    elif kind.startswith("receiver-"):
        variant = receiver_variant(kind, env, workdir)
        proc, url = start_server(model, "receiver", variant.env, workdir, ca_file=variant.ca_file)
        stop = stop_server
    else:
        proc, url = start_server(model, kind, env, workdir)
        stop = stop_server
    extra = variant.headers if kind.startswith("receiver-") else None
    ca_file = variant.ca_file if kind.startswith("receiver-") else None
    try:
        target = url + "/bench/events"
        full = lua_script(workdir / f"full-{kind}-{size}.lua", size, extra)
        # warm-up: connections, caches, metadata, the peer's JIT
        run_wrk(target, full, SATURATION_CONNECTIONS, WARMUP_SECONDS, proc.pid, broker_pid=broker_pid)
        saturated = run_wrk(target, full, SATURATION_CONNECTIONS, DURATION, proc.pid, broker_pid=broker_pid)
        half_rate = saturated["events_per_s"] / 2
        body = workdir / f"body-{size}"
        body.write_bytes(b"x" * size)
        try:
            half = run_oha(target, body, half_rate, connections=HALF_CONNECTIONS, seconds=DURATION,
                           server_pid=proc.pid, extra=extra, ca_file=ca_file)
        except RuntimeError as exc:  # kept in the results as a failed run rather than losing the whole benchmark
            print(f"half-rate run failed: {exc}", flush=True)
            half = {"failed": str(exc), "p99_ms": None}
        half["target_events_per_s"] = round(half_rate, 1)
        fixed = {str(rate): run_oha(target, body, rate, connections=HALF_CONNECTIONS, seconds=DURATION,
                                    server_pid=proc.pid, extra=extra, ca_file=ca_file)
                 for rate in (FIXED_RATES if size == 1024 else ())}
        return {"saturated": saturated, "half_saturation": half, "fixed_rate": fixed}
    finally:
        stop(proc)


def warm_broker(size: int, env: dict[str, str], workdir: Path, *, broker_pid: int) -> dict[str, Any]:
    """The receiver at saturation for ``BROKER_WARMUP_SECONDS``, unmeasured: the broker's JIT warm-up."""
    proc, url = start_server("uvicorn", "receiver", env, workdir)
    try:
        script = lua_script(workdir / f"warm-{size}.lua", size)
        return run_wrk(url + "/bench/events", script, SATURATION_CONNECTIONS, BROKER_WARMUP_SECONDS, proc.pid,
                       broker_pid=broker_pid)
    finally:
        stop_server(proc)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median saturated rate (a real run, so its numbers belong together), plus all rates."""
    ordered = sorted(runs, key=lambda r: r["saturated"]["events_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["repeats"] = len(runs)
    chosen["saturated_events_per_s_all"] = [r["saturated"]["events_per_s"] for r in runs]
    chosen["cpu_s_per_1000_all"] = [r["saturated"]["cpu_s_per_1000"] for r in runs]
    chosen["half_saturation_p99_ms_all"] = [r["half_saturation"]["p99_ms"] for r in runs]
    # p99 over a few seconds is decided by whether a stall of the shared machine fell into the window: the
    # median over the repeats, not the p99 of the run chosen for its rate.
    measured = [p for p in chosen["half_saturation_p99_ms_all"] if p is not None]
    chosen["half_saturation_p99_ms_median"] = statistics.median(measured) if measured else None
    chosen["fixed_rate_median"] = {
        rate: {field: statistics.median(r["fixed_rate"][rate][field] for r in runs)
               for field in ("p50_ms", "p99_ms", "cpu_s_per_1000", "machine_busy_percent")}
        for rate in chosen.get("fixed_rate", {})}
    return chosen


# -- (a) the raw producer -----------------------------------------------------------------------------------


def raw_producer(bootstrap: str, topic: str, size: int, seconds: float, rate: float | None = None, *,
                 linger_ms: float = 5) -> dict[str, Any]:
    """Produce flat out (``rate`` None) or paced at ``rate`` events/s; latency = produce() to delivery report."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": linger_ms})
    value = b"x" * size
    headers = [(f"ce_{k[3:]}" if k.startswith("ce-") else k, v.encode()) for k, v in CE_HEADERS.items()]
    # Metadata and the idempotent producer id first: otherwise the first records' latency is that handshake.
    producer.produce(topic, value, headers=headers)
    producer.flush(30)
    latencies: list[float] = []
    errors = [0]

    def report(err: Any, _msg: Any, sent: float) -> None:
        if err is not None:
            errors[0] += 1
        else:
            latencies.append((time.perf_counter() - sent) * 1000)

    machine_before = machine_cpu_ticks()
    cpu0, start = time.process_time(), time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) - start < seconds:
        if rate is not None and (wait := sent / rate - (now - start)) > 0:
            # Until the next send is due (at least librdkafka's 1 ms: a shorter timeout is 0, a busy spin); a
            # report ends the wait early and is timed when it comes.
            producer.poll(max(wait, 0.001))
            continue
        try:
            producer.produce(topic, value, headers=headers, on_delivery=lambda e, m, t=now: report(e, m, t))
            sent += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(30)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    del producer  # closes its connections before the broker stops
    return {
        "events_per_s": round(len(latencies) / elapsed, 1), "requests": sent, "errors": errors[0],
        "p50_ms": round(percentile(latencies, 50), 2), "p99_ms": round(percentile(latencies, 99), 2),
        "cpu_s_per_1000": round(cpu / max(len(latencies), 1) * 1000, 4), "server_cpu_s": round(cpu, 2),
        "rss_mib": round(rss_bytes([os.getpid()]) / 2**20, 1), "machine_busy_percent": busy_percent(machine_before),
    }


def measure_raw_producer(bootstrap: str, topic: str, size: int) -> dict[str, Any]:
    saturated = raw_producer(bootstrap, topic, size, DURATION)
    saturated["latency_note"] = "flat out: the latency is mostly time queued in librdkafka"
    half = raw_producer(bootstrap, topic, size, DURATION, rate=saturated["events_per_s"] / 2)
    half["target_events_per_s"] = round(saturated["events_per_s"] / 2, 1)
    return {"saturated": saturated, "half_saturation": half}


# -- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    from confluent_kafka.admin import AdminClient

    from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode

    # `make bench-tools` builds oha into the project cache; find it there when run without make.
    os.environ["PATH"] = f"{Path(os.environ.get('KE_CACHE', ROOT / '.cache')) / 'bin'}{os.pathsep}{os.environ['PATH']}"
    for tool in ("wrk", "oha"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: `make bench-tools` installs it")
    generator = (f"saturation: wrk (Debian), 1 thread, Lua script; half: oha {oha_version()}, open loop, "
                 "--latency-correction")
    missing = peer.peer_available()
    if missing:
        print(f"Java peer not measured: {missing}", flush=True)
        KINDS_1KB.remove("peer")
    if importlib.util.find_spec("granian") is None:
        print("granian not measured: `make bench-tools` installs it", flush=True)
        KINDS_1KB.remove("granian")
    facts = machine_facts(["confluent-kafka", "falcon", "gunicorn", "uvicorn", "uvloop", "httptools", "granian",
                           "cloudevents"], kafka=KAFKA_VERSION, load_generator=generator,
                          peer=None if missing else peer.build_info())
    results: dict[str, Any] = {"machine": facts, "config": {
        "workers": WORKERS, "saturation_connections": SATURATION_CONNECTIONS,
        "broker_warmup_s": BROKER_WARMUP_SECONDS,
        "half_connections": HALF_CONNECTIONS, "duration_s": DURATION, "sizes": list(SIZES), "repeats": REPEATS,
        "producer": "acks=all, idempotent, linger.ms=5, compression none",
        "topic": f"3 partitions, segment.bytes {SEGMENT_BYTES} (recreated before each run that writes)"},
        "fixed_rates": list(FIXED_RATES), "peer_missing": missing,
        "runs": {}, "raw_producer_at_receiver_half_rate": {}, "raw_producer_linger0_at_fixed_rate": {}}
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-receiver-") as tmp:
        workdir = Path(tmp)
        # 2 GiB, not 768 MiB: at 20 KB × ~6,500 events/s (130 MB/s) the smaller heap made the broker's young GC
        # run every second or two with pauses up to 50-130 ms, and those were the receiver's p99 at half rate
        # (3 runs each on the 2-core Xeon VM: p99 104-185 ms at 768 MiB, 17-36 ms at 2 GiB). Production brokers run
        # 4-6 GiB.
        node = KafkaNode(workdir / "kafka", heap="2g")
        node.start()
        try:
            admin = AdminClient(node.client_config())
            fresh_topic(admin)
            channels = workdir / "channels.yaml"
            channels.write_text(CHANNELS)
            env = {k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"}
            env.update({"KE_BOOTSTRAP_SERVERS": node.bootstrap_servers, "KE_CHANNELS_FILE": str(channels),
                        "KE_LOG_LEVEL": "WARNING", "PROMETHEUS_MULTIPROC_DIR": str(workdir / "prom")})
            for size in SIZES:
                label = f"{size // 1024}KB"
                print(f"[{time.monotonic() - began:5.0f}s] raw producer {label}", flush=True)
                fresh_topic(admin)
                results["runs"][f"raw_producer/{label}"] = measure_raw_producer(node.bootstrap_servers,
                                                                                  "bench.events", size)
                repeats: dict[str, list[dict[str, Any]]] = {}
                floors: list[dict[str, Any]] = []
                fixed_floors: dict[str, list[dict[str, Any]]] = {}
                if BROKER_WARMUP_SECONDS and any(k.startswith("receiver") or k == "peer" for k in kinds_for(size)):
                    print(f"[{time.monotonic() - began:5.0f}s] broker warm-up {label}", flush=True)
                    fresh_topic(admin)
                    warm = warm_broker(size, env, workdir, broker_pid=node.pid)
                    results.setdefault("broker_warmup", {})[label] = {
                        k: warm[k] for k in ("events_per_s", "cpu_s_per_1000", "broker_cpu_s_per_1000")}
                for rep in range(REPEATS):
                    for model in MODELS:
                        for kind in kinds_for(size, rep):
                            print(f"[{time.monotonic() - began:5.0f}s] {model} {kind} {label} #{rep + 1}", flush=True)
                            if kind.startswith("receiver") or kind == "peer":
                                fresh_topic(admin)
                            run = measure_server(model, kind, size, env, workdir, broker_pid=node.pid)
                            repeats.setdefault(run_name(model, kind, label), []).append(run)
                            if model == "uvicorn" and kind == "receiver":
                                # Kafka's own latency at the receiver's half rate, on the same broker right after:
                                # the floor under the receiver's p99 (it cannot answer before Kafka does).
                                fresh_topic(admin)
                                floors.append(raw_producer(node.bootstrap_servers, "bench.events", size, DURATION,
                                                           rate=run["half_saturation"]["target_events_per_s"]))
                    if size == 1024:  # Kafka's floor at the fixed rates: the raw producer sending at once
                        for rate in FIXED_RATES:
                            fresh_topic(admin)
                            fixed_floors.setdefault(str(rate), []).append(raw_producer(
                                node.bootstrap_servers, "bench.events", size, DURATION, rate=rate, linger_ms=0))
                for name, runs in repeats.items():
                    results["runs"][name] = median_run(runs)
                for rate, runs_at in fixed_floors.items():
                    results["raw_producer_linger0_at_fixed_rate"][rate] = {
                        "runs": runs_at, "p50_ms_median": statistics.median(f["p50_ms"] for f in runs_at),
                        "p99_ms_median": statistics.median(f["p99_ms"] for f in runs_at),
                        "cpu_us_per_event_median": round(
                            statistics.median(f["cpu_s_per_1000"] for f in runs_at) * 1000)}
                if floors:
                    results["raw_producer_at_receiver_half_rate"][label] = {
                        "runs": floors, "p99_ms_all": [f["p99_ms"] for f in floors],
                        "p99_ms_median": statistics.median(f["p99_ms"] for f in floors)}
        finally:
            node.stop()
    results["machine"]["load_average_at_end"] = list(os.getloadavg())
    results["summary"] = summarize(results["runs"], results["raw_producer_at_receiver_half_rate"])
    results["summary"]["kafka_floor_1KB_linger0"] = {
        rate: {k: v for k, v in floor.items() if k != "runs"}
        for rate, floor in results["raw_producer_linger0_at_fixed_rate"].items()}
    stack_floor(results)
    results["elapsed_s"] = round(time.monotonic() - began)
    path = write_json(NAME, results)
    plot(results)
    print_table(results)
    print(f"wrote {path} and {NAME}.png in {results['elapsed_s']} s")


# Segments that do not roll within a run: with Kafka's 1 GiB default each 20 KB run rolled the partitions'
# segments, and a roll (with its flush of the old segment) stalled the broker on this VM's disk: receiver p99s at
# half rate of 227 and 255 ms in two of three 20 KB runs with rolls, 26-45 ms in four runs without.
# The topic is recreated before each run, so no run writes more than one segment per partition.
SEGMENT_BYTES = 2**31 - 1


def fresh_topic(admin: Any, topic: str = "bench.events") -> None:
    """Delete and recreate the topic before each run that writes to it: the whole benchmark writes ~20 GB, more
    than a development machine may have free (a full disk once stopped the broker mid-run)."""
    from confluent_kafka.admin import NewTopic

    if topic in admin.list_topics(timeout=10).topics:
        for fut in admin.delete_topics([topic]).values():
            fut.result(30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
            time.sleep(0.2)
    deadline = time.monotonic() + 30
    while True:  # the broker may still be deleting the old one
        try:
            new = NewTopic(topic, 3, 1, config={"segment.bytes": str(SEGMENT_BYTES)})
            for fut in admin.create_topics([new]).values():
                fut.result(30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


#: at 1 KB also the peer, the bare endpoint under granian (``make bench-tools`` installs it), and the receiver with
#: one batching producer only (``KE_BATCH_ABOVE_RATE=0``: what the immediate producer changes)
KINDS_1KB = ["bare", "granian", "receiver", "receiver-sink", "receiver-batching", "receiver-auth", "receiver-tls",
             "peer"]


#: ``BENCH_KINDS=bare,receiver,receiver-sink``: only those servers (bare and receiver are always kept: the summary
#: is set against them).
_KINDS = {k for k in os.environ.get("BENCH_KINDS", "").split(",") if k}
ONLY = _KINDS | {"bare", "receiver"} if _KINDS else set()


def kinds_for(size: int, rep: int = 0) -> list[str]:
    """The servers of one round, in reversed order on odd rounds: none always runs first (or on a JIT-warm
    Kafka broker, or on a machine whose neighbours have just gone quiet)."""
    kinds = KINDS_1KB if size == 1024 else ["bare", "receiver", "receiver-sink"]
    kinds = [k for k in kinds if k in ONLY] if ONLY else kinds
    return kinds if rep % 2 == 0 else kinds[::-1]


def run_name(model: str, kind: str, label: str) -> str:
    return {"peer": f"java-peer/{label}", "granian": f"granian/bare/{label}"}.get(kind, f"{model}/{kind}/{label}")


def versus_peer(runs: dict[str, Any]) -> dict[str, Any]:
    """Ours over the peer's, at 1 KB: the ratios the receiver's targets are set in."""
    ours, java = runs.get("uvicorn/receiver/1KB"), runs.get("java-peer/1KB")
    if not ours or not java:
        return {}
    sat_a, sat_b = ours["saturated"], java["saturated"]
    out: dict[str, Any] = {
        "saturated_rate": round(sat_a["events_per_s"] / sat_b["events_per_s"], 3),
        "cpu_per_event_at_saturation": round(sat_a["cpu_s_per_1000"] / sat_b["cpu_s_per_1000"], 3),
        "pss": round(sat_a["pss_mib"] / sat_b["pss_mib"], 3),
    }
    for rate in FIXED_RATES:
        a, b = ours["fixed_rate_median"][str(rate)], java["fixed_rate_median"][str(rate)]
        out[str(rate)] = {
            "ours_p50_ms": a["p50_ms"], "peer_p50_ms": b["p50_ms"],
            "ours_p99_ms": a["p99_ms"], "peer_p99_ms": b["p99_ms"], "p99_ratio": round(a["p99_ms"] / b["p99_ms"], 3),
            "ours_cpu_us_per_event": round(a["cpu_s_per_1000"] * 1000),
            "peer_cpu_us_per_event": round(b["cpu_s_per_1000"] * 1000),
            "cpu_ratio": round(a["cpu_s_per_1000"] / b["cpu_s_per_1000"], 3)}
        batching = runs.get("uvicorn/receiver-batching/1KB")
        if batching:  # the same receiver with every record waiting out linger.ms
            c = batching["fixed_rate_median"][str(rate)]
            out[str(rate)].update({"always_batching_p50_ms": c["p50_ms"], "always_batching_p99_ms": c["p99_ms"],
                                   "always_batching_cpu_us_per_event": round(c["cpu_s_per_1000"] * 1000)})
    return out


def stack_floor(results: dict[str, Any]) -> None:
    """At each fixed rate, the CPU per event of the bare HTTP app (uvicorn + falcon, no Kafka) plus the raw
    producer sending at once (linger.ms 0): what the receiver's two halves cost apart, beside the receiver's and
    the peer's whole request path (``vs_peer_1KB``)."""
    bare = results["runs"].get("uvicorn/bare/1KB")
    vs_peer = results["summary"]["vs_peer_1KB"]
    for rate, floor in results["raw_producer_linger0_at_fixed_rate"].items():
        if bare is None or rate not in vs_peer:
            continue
        http = round(bare["fixed_rate_median"][rate]["cpu_s_per_1000"] * 1000)
        vs_peer[rate].update({"bare_http_cpu_us_per_event": http,
                              "raw_producer_cpu_us_per_event": floor["cpu_us_per_event_median"],
                              "stack_floor_cpu_us_per_event": http + floor["cpu_us_per_event_median"]})


def summarize(runs: dict[str, Any], floors: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"vs_peer_1KB": versus_peer(runs)}
    uv, gr = runs.get("uvicorn/bare/1KB"), runs.get("granian/bare/1KB")
    if uv and gr:  # the HTTP floor under each server: what a compiled server would save the receiver
        out["bare_1KB_granian_vs_uvicorn"] = {
            "rate": round(gr["saturated"]["events_per_s"] / uv["saturated"]["events_per_s"], 3),
            "cpu_per_event": round(gr["saturated"]["cpu_s_per_1000"] / uv["saturated"]["cpu_s_per_1000"], 3)}
    for model in MODELS:
        for size in SIZES:
            label = f"{size // 1024}KB"
            rec = runs[f"{model}/receiver/{label}"]
            bare = runs[f"{model}/bare/{label}"]
            cores = rec["saturated"]["server_cores_busy"] or 1
            out[f"{model}/{label}"] = {
                "receiver_vs_bare_rate": round(rec["saturated"]["events_per_s"] / bare["saturated"]["events_per_s"], 3),
                "receiver_vs_raw_producer_rate": round(
                    rec["saturated"]["events_per_s"] / runs[f"raw_producer/{label}"]["saturated"]["events_per_s"], 3),
                "receiver_events_per_s_per_busy_core": round(rec["saturated"]["events_per_s"] / cores, 1),
                "receiver_events_per_cpu_second": round(1000 / rec["saturated"]["cpu_s_per_1000"], 1),
                "bare_events_per_cpu_second": round(1000 / bare["saturated"]["cpu_s_per_1000"], 1),
                # CPU cost per event, bare over receiver: the rate ratio without the broker's share of the cores.
                "receiver_vs_bare_cpu_efficiency": round(
                    bare["saturated"]["cpu_s_per_1000"] / rec["saturated"]["cpu_s_per_1000"], 3),
                "receiver_p99_ms_at_half_saturation": rec["half_saturation_p99_ms_median"],
                # The raw producer paced at the receiver's half rate (uvicorn only): Kafka's own p99 there.
                "raw_producer_p99_ms_at_receiver_half_rate": floors.get(label, {}).get("p99_ms_median")
                if model == "uvicorn" else None,
                "bare_p99_ms_at_half_saturation": bare["half_saturation_p99_ms_median"],
                # The tail at half rate follows how busy the whole machine was (servers, broker, oha together).
                "receiver_machine_busy_percent_at_half": rec["half_saturation"].get("machine_busy_percent"),
                "bare_machine_busy_percent_at_half": bare["half_saturation"].get("machine_busy_percent"),
            }
            sink = runs.get(f"{model}/receiver-sink/{label}")
            if sink:  # a KafkaSink's ingress is held to a channel's: its rate and CPU per event beside them
                out[f"{model}/{label}"].update({
                    "sink_vs_channel_rate": round(sink["saturated"]["events_per_s"] / rec["saturated"]["events_per_s"],
                                                  3),
                    "sink_vs_bare_rate": round(sink["saturated"]["events_per_s"] / bare["saturated"]["events_per_s"],
                                               3),
                    "sink_events_per_cpu_second": round(1000 / sink["saturated"]["cpu_s_per_1000"], 1),
                    "sink_p99_ms_at_half_saturation": sink["half_saturation_p99_ms_median"]})
            for on in ("auth", "tls"):  # what turning auth or TLS on costs, against the same receiver with it off
                row = runs.get(f"{model}/receiver-{on}/{label}")
                if row:
                    out[f"{model}/{label}"].update({
                        f"{on}_vs_off_rate": round(row["saturated"]["events_per_s"] / rec["saturated"]["events_per_s"],
                                                   3),
                        f"{on}_vs_off_cpu_per_event": round(
                            row["saturated"]["cpu_s_per_1000"] / rec["saturated"]["cpu_s_per_1000"], 3),
                        f"{on}_p99_ms_at_half_saturation": row["half_saturation_p99_ms_median"]})
    return out


def print_table(results: dict[str, Any]) -> None:
    print(f"{'run':34} {'ev/s':>9} {'p50ms':>7} {'p99ms':>7} {'cpu/1k':>7} {'rss':>7} {'half p99':>9} {'non2xx':>7}")
    for name, run in results["runs"].items():
        sat, half = run["saturated"], run.get("half_saturation", {})
        print(f"{name:34} {sat['events_per_s']:9.0f} {sat['p50_ms']:7.2f} {sat['p99_ms']:7.2f} "
              f"{sat['cpu_s_per_1000']:7.3f} {sat['rss_mib']:7.0f} {half.get('p99_ms') or float('nan'):9.2f} "
              f"{sat.get('non_2xx', 0):7}")
    for name, row in results["summary"].items():
        print(name, row)


def plot(results: dict[str, Any]) -> None:
    runs = results["runs"]
    fig, axes = new_figure(ncols=3, width=5.2, height=4.2)
    names = ["raw_producer", *(f"{m}/{k}" for m in MODELS
                               for k in ("bare", "receiver", "receiver-sink", "receiver-auth", "receiver-tls")),
             "granian/bare", "java-peer"]
    p99_title = "p99 at half saturation, open loop (ms, median);\nraw producer: at the receiver's half rate"
    for col, (metric, title) in enumerate([("events_per_s", "events/s at saturation"),
                                           ("cpu_s_per_1000", "server CPU s per 1,000 events"),
                                           ("p99_ms", p99_title)]):
        ax = axes[0][col]
        width = 0.8 / len(SIZES)
        for i, size in enumerate(SIZES):
            label = f"{size // 1024}KB"
            values = []
            for name in names:
                run = runs.get(f"{name}/{label}")
                if run is None:  # the peer runs at 1 KB only
                    values.append(0)
                    continue
                floor = results["raw_producer_at_receiver_half_rate"].get(label)
                if metric == "p99_ms" and name == "raw_producer" and floor:
                    values.append(floor["p99_ms_median"])  # paced at the receiver's half rate, not its own
                elif metric == "p99_ms":  # the median over the repeats, as in the summary
                    values.append(run.get("half_saturation_p99_ms_median") or run["half_saturation"].get("p99_ms") or 0)
                else:
                    values.append(run["saturated"].get(metric) or 0)
            ax.bar([x + i * width for x in range(len(names))], values, width, label=label)
        ax.set_xticks([x + width / 2 for x in range(len(names))], names, rotation=35, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"receiver benchmark — {results['machine']['cpu_model']}, {results['machine']['cores']} cores",
                 fontsize=10)
    save_png(fig, NAME)


if __name__ == "__main__":
    main()
