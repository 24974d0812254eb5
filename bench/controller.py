"""Benchmark: time for N KafkaChannels to become Ready, and the controller's memory.

Starts a real control plane (etcd + kube-apiserver + kube-controller-manager) and a real Kafka node on
loopback, runs the controller as its own process (``python -m kafka_eventing.controller``) so its RSS is its
own, creates N channels at once and records when each one's topic is ready and when it is Ready.

There are no nodes, so a stand-in kubelet thread marks every dispatcher Pod Running/Ready as soon as the real
ReplicaSet controller creates it; the real Deployment controller then reports the Deployment available. "Ready"
therefore includes the controller-manager's work; "TopicReady" is the controller's own work alone.

Side by side, measured in the same run: creating the N KafkaChannel objects (the API server's own write
rate, the floor for any controller) vs. the controller getting them all to TopicReady and Ready.

    .venv/bin/python bench/controller.py [--channels 500] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import SECRET_LABEL
from kafka_eventing.controller.crd import install_crd
from kafka_eventing.core.kube import api_client
from kafka_eventing.localstack._proc import free_port
from kafka_eventing.localstack.kafka import KAFKA_VERSION, KafkaNode
from kafka_eventing.localstack.kube import KubeControlPlane

ROOT = Path(__file__).resolve().parents[1]

GROUP, VERSION, PLURAL = "messaging.knative.dev", "v1beta1", "kafkachannels"
SYSTEM, CHANNELS_NS, RECEIVER = "knative-eventing", "bench", "kafka-channel-receiver"
TARGET_SECONDS, TARGET_MIB = 60.0, 150.0


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import confluent_kafka

    versions = {name: metadata.version(name) for name in ("kubernetes", "confluent-kafka", "prometheus-client")}
    versions["librdkafka"] = confluent_kafka.libversion()[0]
    versions["kafka"] = KAFKA_VERSION
    try:
        from kafka_eventing.localstack.tools import tool_path

        out = subprocess.run([str(tool_path("kube-apiserver")), "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
        versions["kube-apiserver"] = out.stdout.strip().split()[-1] if out.stdout.strip() else "unknown"
    except Exception:
        versions["kube-apiserver"] = "unknown"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions, "date": datetime.now(UTC).isoformat(timespec="seconds")}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


class StandInKubelet:
    """Marks Pods of the system namespace Running/Ready as the ReplicaSet controller creates them."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="kubelet")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.marked = 0

    def _mark(self, name: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"phase": "Running", "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
        for _ in range(5):
            try:
                self.core.patch_namespaced_pod_status(name, SYSTEM, {"status": status})
                self.marked += 1
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                time.sleep(0.2)

    def _run(self) -> None:
        seen: set[str] = set()
        rv: str | None = None
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.core.list_namespaced_pod, SYSTEM, timeout_seconds=30,
                                      resource_version=rv, deserialize=False):
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    name = obj["metadata"]["name"]
                    if event["type"] == "ADDED" and name not in seen:
                        seen.add(name)
                        self.pool.submit(self._mark, name)
                    if self.stop.is_set():
                        break
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
            except Exception:
                time.sleep(0.2)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=35)
        self.pool.shutdown(wait=False)


def prepare(api: client.ApiClient, kafka: KafkaNode) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for ns in (SYSTEM, CHANNELS_NS):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(SYSTEM, {"metadata": {"name": res.DISPATCHER_SERVICE_ACCOUNT}})
    core.create_namespaced_secret(SYSTEM, {"metadata": {"name": "kafka-connection", "labels": {SECRET_LABEL: "true"}},
                                           "stringData": kafka.connection_secret()})
    apps.create_namespaced_deployment(SYSTEM, {"metadata": {"name": RECEIVER}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": RECEIVER}},
        "template": {"metadata": {"labels": {"app": RECEIVER, **res.labels("receiver")}},
                     "spec": {"containers": [{"name": "receiver", "image": "receiver:bench"}]}}}})


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def histogram_median(metrics: dict[str, float], name: str) -> float | None:
    buckets = sorted(((float(k.split('le="')[1].split('"')[0]), v) for k, v in metrics.items()
                      if k.startswith(f"{name}_bucket") and "+Inf" not in k), key=lambda kv: kv[0])
    total = metrics.get(f"{name}_count", 0.0)
    for le, count in buckets:
        if count >= total / 2:
            return le
    return None


def run(channels: int, workers: int, out_dir: Path, timeout: float) -> dict[str, Any]:
    facts = machine()
    with tempfile.TemporaryDirectory(prefix="bench-controller-") as tmp:
        kube = KubeControlPlane(Path(tmp) / "kube")
        kafka = KafkaNode(Path(tmp) / "kafka")
        kube.start()
        kafka.start()
        proc: subprocess.Popen[bytes] | None = None
        kubelet: StandInKubelet | None = None
        api = api_client(kube.kubeconfig, pool_size=32)
        try:
            install_crd(api)
            prepare(api, kafka)
            kubelet = StandInKubelet(api)
            kubelet.start()
            port = free_port()
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("KE_") or k == "KE_CACHE"},
                   "KE_KUBECONFIG": str(kube.kubeconfig), "KE_SYSTEM_NAMESPACE": SYSTEM,
                   "KE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, "KE_LOG_LEVEL": "WARNING"}
            log_path = Path(tmp) / "controller.log"
            with log_path.open("wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "kafka_eventing.controller", "--workers", str(workers),
                     "--health-port", str(port), "--health-address", "127.0.0.1"],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            result = measure(api, proc, port, channels, timeout)
            result["controller_log_tail"] = log_path.read_text(errors="replace").splitlines()[-5:]
        finally:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if kubelet is not None:
                kubelet.close()
            api.close()
            kafka.stop()
            kube.stop()
    result.update({"machine": facts, "channels": channels, "workers": workers,
                   "targets": {"all_ready_seconds": TARGET_SECONDS, "rss_mib": TARGET_MIB}})
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = result.pop("samples")
    (out_dir / "controller.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, samples, out_dir / "controller.png")
    return result


def measure(api: client.ApiClient, proc: subprocess.Popen[bytes], port: int, n: int,
            timeout: float) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api)
    topic_ready: dict[str, float] = {}
    ready: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Event()
    t0 = 0.0

    def track() -> None:
        w = watch.Watch()
        while not done.is_set():
            for event in w.stream(custom.list_namespaced_custom_object, GROUP, VERSION, CHANNELS_NS, PLURAL,
                                  timeout_seconds=30, deserialize=False):
                obj = event["object"]
                name = obj["metadata"]["name"]
                now = time.monotonic() - t0
                for c in (obj.get("status") or {}).get("conditions") or ():
                    if c["status"] != "True":
                        continue
                    with lock:
                        if c["type"] == "TopicReady":
                            topic_ready.setdefault(name, now)
                        elif c["type"] == "Ready":
                            ready.setdefault(name, now)
                if len(ready) >= n:
                    done.set()
                    break

    # Wait for the controller's caches and lease before the clock starts.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if scrape(port).get("kafkachannel_controller_leader") == 1.0:
                break
        except OSError:
            pass
        time.sleep(0.3)
    tracker = threading.Thread(target=track, daemon=True)
    t0 = time.monotonic()
    tracker.start()

    def create(i: int) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KafkaChannel",
                "metadata": {"name": f"ch-{i:04d}", "namespace": CHANNELS_NS}, "spec": {"numPartitions": 1}}
        custom.create_namespaced_custom_object(GROUP, VERSION, CHANNELS_NS, PLURAL, body)

    samples: list[tuple[float, float, int, int]] = []
    peak = [0.0]
    cpu_start = cpu_seconds(proc.pid)
    load_start = os.getloadavg()[0]

    def sample() -> None:
        while not done.is_set() and time.monotonic() - t0 < timeout and proc.poll() is None:
            rss, hwm = rss_mib(proc.pid)
            peak[0] = max(peak[0], hwm)
            with lock:
                samples.append((time.monotonic() - t0, rss, len(topic_ready), len(ready)))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(n)))
    created = time.monotonic() - t0
    sampler.join(timeout + 5)
    done.set()
    alive = proc.poll() is None
    rss, hwm = rss_mib(proc.pid) if alive else (0.0, peak[0])
    peak_rss = max(peak[0], hwm)
    cpu = cpu_seconds(proc.pid) - cpu_start if alive else None
    metrics = scrape(port) if alive else {}
    all_topic = max(topic_ready.values()) if len(topic_ready) >= n else None
    all_ready = max(ready.values()) if len(ready) >= n else None
    return {
        "create_seconds": round(created, 2),
        "all_topic_ready_seconds": round(all_topic, 2) if all_topic else None,
        "all_ready_seconds": round(all_ready, 2) if all_ready else None,
        "ready_count": len(ready),
        "median_channel_ready_seconds": round(statistics.median(ready.values()), 2) if ready else None,
        "median_channel_topic_ready_seconds": (
            round(statistics.median(topic_ready.values()), 2) if topic_ready else None),
        "ratio_all_ready_to_create": round(all_ready / created, 2) if all_ready else None,
        "channels_per_second": round(n / all_ready, 1) if all_ready else None,
        "controller_rss_mib": round(rss, 1),
        "controller_peak_rss_mib": round(peak_rss, 1),
        "controller_cpu_seconds": round(cpu, 1) if cpu is not None else None,
        "load_average_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "reconciles": {k.split('"')[1]: v for k, v in metrics.items() if k.startswith("kafkachannel_reconcile_total{")},
        "median_reconcile_seconds_bucket": histogram_median(metrics, "kafkachannel_reconcile_duration_seconds"),
        "met_targets": bool(all_ready and all_ready <= TARGET_SECONDS and peak_rss <= TARGET_MIB),
        "samples": samples,
    }


def plot(result: dict[str, Any], samples: list[tuple[float, float, int, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in samples]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(t, [s[2] for s in samples], label="TopicReady")
    left.plot(t, [s[3] for s in samples], label="Ready")
    left.axvline(result["create_seconds"], color="grey", linestyle=":", label="all created")
    left.axvline(TARGET_SECONDS, color="red", linestyle="--", label=f"target {TARGET_SECONDS:.0f}s")
    left.set(xlabel="seconds since first create", ylabel="channels", title=f"{result['channels']} KafkaChannels")
    left.legend()
    right.plot(t, [s[1] for s in samples], color="purple")
    right.axhline(TARGET_MIB, color="red", linestyle="--", label=f"target {TARGET_MIB:.0f} MiB")
    right.set(xlabel="seconds", ylabel="RSS (MiB)", title="controller process RSS")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", type=int, default=500)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = p.parse_args()
    result = run(args.channels, args.workers, args.out, args.timeout)
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "controller_log_tail")}, indent=2))


if __name__ == "__main__":
    main()
