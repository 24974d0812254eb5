"""The shipped images and overlay on a real kubelet, and the chart's auth and TLS (`make test-cluster`, part of `make
e2e`): what kind (tests/e2e/test_kind.py, where users meet the chart) does not run.

The cluster (`kafka_eventing.localstack.cluster`: Kafka, control plane, containerd, kubelet) lives in a network
namespace with no route out, which it checks before it starts; it is the tier's one cluster, shared with
test_cluster_life.py (tests/e2e/conftest.py). Every client here runs inside that namespace too: kubectl and helm
through ``nsenter``, HTTP and Kafka clients in "spawn" processes that join it first (tests/e2e/_netns_clients.py).
The tests fail — they never skip — when the cluster cannot start.

The overlay: `kubectl apply -k` of an overlay on kustomize/base → every pod Running and Ready → a KafkaChannel (3
partitions) with two subscribers, a pod and a process in the namespace → events sent to the receiver pods reach both
through the dispatcher Deployment the controller created (one, annotated with its channel) → channel Ready and every
status.subscribers entry ready → dispatcher scaled to the partition count and back through the overlay's params.env
(a new hashed ConfigMap rolls the controller) → a receiver pod and a dispatcher pod deleted mid-load, and every
accepted event still reaches both subscribers (ledger) → channel deleted: dispatcher Deployment and topic gone →
deleting the overlay's objects leaves none of them, namespaced (pods, Deployments, Services, ConfigMaps, Secrets,
ServiceAccounts, RBAC, PodDisruptionBudgets, NetworkPolicies) or cluster-scoped (ClusterRoles, ClusterRoleBindings,
selected by the instance label). The chart's channel, Broker, KafkaSink/KafkaSource scenario and `helm test` run on
kind (test_kind.py's test_chart_on_kind).

Then the chart with ingress auth (deny-all), an EventPolicy and receiver HTTPS from a Secret: HTTPS probes pass, the
channel's address is https:// with the Secret's CA and its audience, an allowed ServiceAccount's events (real
TokenRequest tokens) get 202 over verified TLS and reach the subscriber as sent, a denied one gets 403 naming the
policy, no token 401, and the topic holds only the allowed events.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e import _netns_clients as clients
from e2e._pod_cluster import Cluster
from e2e._scenario import (
    APP_NS,
    RESTRICTED_POD,
    SYSTEM_NS,
    assert_release_objects,
    assert_uninstalled,
    dispatcher_ready,
    dispatchers,
    kafka_channel,
    pods_ready,
    sink_container,
    sink_events,
    sink_ids,
    wait,
)
from kafka_eventing.localstack import cluster as kc
from kafka_eventing.localstack._proc import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kafka-eventing"
PARTITIONS = 3


# ---------------------------------------------------------------------------------------------- the overlay

INSTANCE = "kafka-eventing"  # the app.kubernetes.io/instance label of every object the overlay installs


def _write_overlay(cl: Cluster, root: Path, dispatcher_replicas: int) -> None:
    """An overlay of kustomize/base for this cluster: the imported images, Kafka on the node address."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.env").write_text(f"KE_BOOTSTRAP_SERVERS={cl.state['bootstrap_servers']}\n"
                                     f"KE_DISPATCHER_REPLICAS={dispatcher_replicas}\nKE_LOG_FORMAT=console\n")
    # The base is rendered from the chart, so its image names are the chart's: registry + each role's repository.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    images = []
    for role in ("receiver", "controller", "dispatcher"):
        name, tag = cl.images[role].rsplit(":", 1)
        chart_name = f"{values['image']['registry']}/{values[role]['image']['repository']}"
        images.append({"name": chart_name, "newName": name, "newTag": tag})
    # JSON (a YAML subset) quotes every string: a git-hash tag like 295e021 written bare by PyYAML (a string under
    # its YAML 1.1 rules) is a number to kustomize's YAML 1.2 parser, which then refuses the image.
    (root / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": SYSTEM_NS,
        "resources": [os.path.relpath(ROOT / "kustomize" / "base", root)],
        "configMapGenerator": [{"name": "kafka-eventing-config", "behavior": "merge", "envs": ["params.env"]}],
        "images": images,
    }, indent=2))


def _apply_overlay(cl: Cluster, overlay: Path, dispatcher_replicas: int = 1) -> None:
    _write_overlay(cl, overlay, dispatcher_replicas)
    # Server-side, so that it takes over a KafkaChannel CRD that a chart install on this cluster kept (crds.keep).
    cl.kubectl("apply", "-k", str(overlay), "--server-side", "--force-conflicts", timeout=300)


def _delete_overlay(cl: Cluster, overlay: Path) -> None:
    # The CRD stays, as with the chart's crds.keep: deleting it would delete every KafkaChannel.
    rendered = cl.kubectl("kustomize", str(overlay)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] not in ("CustomResourceDefinition", "Namespace")]
    cl.kubectl("delete", "-f", "-", "--wait=true", "--timeout=300s", stdin=yaml.safe_dump_all(docs), timeout=360)
    # Earlier generations of the hashed settings ConfigMap (each replicas change made one).
    cl.kubectl("delete", "configmap", "-n", SYSTEM_NS, "-l", f"app.kubernetes.io/instance={INSTANCE}")


# ---------------------------------------------------------------------------------------------- the scenario


def _sink_pod(cl: Cluster) -> str:
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}}, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sink", "namespace": APP_NS},
        "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                 "containers": [sink_container(cl.images["receiver"], "Never")]},
    })
    cl.kubectl("wait", "--for=condition=Ready", "pod/sink", "-n", APP_NS, "--timeout=300s", timeout=360)
    return str(cl.get("pod", "sink", "-n", APP_NS)["status"]["podIP"])


def _ledger_ids(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line}


def _delivered(cl: Cluster, ledger: Path, ids: list[str], timeout: float = 300) -> None:
    want = set(ids)

    def both() -> bool:
        return want <= _ledger_ids(ledger) and want <= sink_ids(cl, "sink")

    try:
        wait("every accepted event at both subscribers", both, timeout=timeout, interval=2)
    except AssertionError as exc:
        missing_loop = want - _ledger_ids(ledger)
        missing_pod = want - sink_ids(cl, "sink")
        raise AssertionError(f"{exc}: {len(missing_loop)} missing at the namespace process, "
                             f"{len(missing_pod)} at the pod (of {len(want)})") from None


def _send(cl: Cluster, ids: list[str], pace: float = 0.0) -> list[str]:
    accepted: list[str] = cl.in_netns(clients.send_events, cl.kubectl_cmd, SYSTEM_NS,
                                      f"orders-kn-channel.{APP_NS}.svc.cluster.local", ids, pace)
    return accepted


def test_overlay_on_real_pods(cluster: Cluster, tmp_path: Path) -> None:
    cl = cluster
    overlay = tmp_path / "overlay"
    _apply_overlay(cl, overlay)
    pods_ready(cl, SYSTEM_NS)

    pod_ip = _sink_pod(cl)
    port = free_port()  # a free port in the namespace is free: nothing else listens in it but the cluster
    ledger = tmp_path / "ledger.jsonl"
    sink = multiprocessing.get_context("spawn").Process(
        target=clients.run_sink, args=(cl.pid, kc.NODE_IP, port, str(ledger), 1800), daemon=True)
    sink.start()
    try:
        cl.apply(kafka_channel("orders", {"sub-pod": f"http://{pod_ip}:8080/",
                                          "sub-ns": f"http://{kc.NODE_IP}:{port}/"}, PARTITIONS))
        cl.kubectl("wait", "--for=condition=Ready", "kafkachannel/orders", "-n", APP_NS, "--timeout=600s",
                   timeout=660)

        def subscribers_ready() -> bool:
            subs = cl.get("kafkachannel", "orders", "-n", APP_NS).get("status", {}).get("subscribers") or []
            return {s.get("uid") for s in subs if s.get("ready") == "True"} == {"sub-pod", "sub-ns"}

        wait("status.subscribers ready", subscribers_ready)
        deps = dispatchers(cl)
        assert len(deps) == 1, [d["metadata"]["name"] for d in deps]
        assert deps[0]["metadata"]["annotations"]["kafka.eventing.knative.dev/channel"] == f"{APP_NS}/orders"
        wait("dispatcher pod ready", lambda: dispatcher_ready(cl, 1))

        # Events to the receiver pods reach both subscribers through the controller-made dispatcher.
        first = [f"first-{uuid.uuid4()}" for _ in range(20)]
        assert _send(cl, first) == first
        _delivered(cl, ledger, first)

        # Dispatcher up to the partition count and back; delivery goes on at each size. A new KE_DISPATCHER_REPLICAS
        # makes a new hashed ConfigMap, which rolls the controller, which rescales.
        for replicas in (PARTITIONS, 1):
            _apply_overlay(cl, overlay, replicas)
            wait(f"dispatcher at {replicas} ready replicas", lambda r=replicas: dispatcher_ready(cl, r),
                  timeout=600, interval=2)
            batch = [f"scale{replicas}-{uuid.uuid4()}" for _ in range(10)]
            assert _send(cl, batch) == batch
            _delivered(cl, ledger, batch)
        pods_ready(cl, SYSTEM_NS)  # the scaled-down dispatcher pods gone: the one deleted below is the live one

        # Mid-load: a receiver pod and the dispatcher pod are deleted; whatever got a 202 must arrive.
        load = [f"load-{uuid.uuid4()}" for _ in range(300)]
        pending = cl.pool.apply_async(clients.send_events, (cl.kubectl_cmd, SYSTEM_NS,
                                                            f"orders-kn-channel.{APP_NS}.svc.cluster.local",
                                                            load, 0.02, 600))
        time.sleep(2)
        receiver = cl.get("pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=receiver")["items"][0]
        dispatcher = cl.get("pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=kafka-channel-dispatcher")
        cl.kubectl("delete", "pod", "-n", SYSTEM_NS, receiver["metadata"]["name"], "--wait=false")
        time.sleep(1)
        cl.kubectl("delete", "pod", "-n", SYSTEM_NS, dispatcher["items"][0]["metadata"]["name"], "--wait=false")
        accepted = pending.get(900)
        assert len(accepted) == len(load), f"only {len(accepted)} of {len(load)} events were accepted"
        _delivered(cl, ledger, accepted, timeout=600)
        pods_ready(cl, SYSTEM_NS)

        # Deleting the channel removes its dispatcher and its topic.
        cl.kubectl("delete", "kafkachannel", "orders", "-n", APP_NS, "--timeout=300s", timeout=360)
        wait("dispatcher Deployment gone", lambda: not dispatchers(cl))
        wait("topic gone", lambda: f"{APP_NS}.orders" not in cl.in_netns(clients.topics,
                                                                           cl.state["bootstrap_servers"]))
    finally:
        sink.terminate()
        sink.join(10)
        cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)

    assert_release_objects(cl, INSTANCE)
    _delete_overlay(cl, overlay)
    assert_uninstalled(cl, INSTANCE, "kustomize")
    cl.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=300s", timeout=360)

# ---------------------------------------------------------------------------------------------- auth and TLS

# The subscriber of the secure channel: logs every header and the body (base64) of each event, to check them
# against what was sent.
RECORDING_SINK = """
import base64, http.server, json, sys, threading
lock = threading.Lock()
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        line = json.dumps({"id": self.headers.get("ce-id"), "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": base64.b64encode(body).decode()})
        with lock:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8080), Sink).serve_forever()
"""
SECURE = "secure"
SECURE_HOST = f"{SECURE}-kn-channel.{APP_NS}.svc.cluster.local"
TLS_SECRET = "receiver-tls"
POLICY = "secure-senders"


def _secure_install(cl: Cluster, ca_pem: str, cert: Any) -> None:
    """The chart with ingress auth (deny-all, the cluster's issuer), its EventPolicy CRD and receiver HTTPS from a
    Secret made here (no cert-manager in this cluster)."""
    cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}}, {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET, "namespace": SYSTEM_NS},
        "stringData": {"tls.crt": cert.cert_pem.decode(), "tls.key": cert.key_pem.decode(), "ca.crt": ca_pem}})
    cl.helm("install", "ke", str(CHART), "-n", SYSTEM_NS, "-f", str(CHART / "ci" / "cluster-values.yaml"),
            "--set-string", f"image.tag={cl.images['receiver'].rsplit(':', 1)[1]}",
            "--set", f"kafka.bootstrapServers={cl.state['bootstrap_servers']}",
            "--set", "crds.eventPolicies=true", "--set", "receiver.auth.enabled=true",
            # The cluster's token issuer: the `kubernetes` Service IP, which pods reach (no cluster DNS here).
            "--set", f"receiver.auth.issuer=https://{kc.SERVICE_IP}", "--set", "receiver.auth.defaultMode=deny-all",
            "--set", "receiver.tls.enabled=true", "--set", f"receiver.tls.secretName={TLS_SECRET}",
            "--wait", "--timeout=10m")


def test_auth_policy_and_tls_on_real_pods(cluster: Cluster) -> None:
    """Ingress auth, an EventPolicy and receiver HTTPS on the receiver pods: the controller publishes the https://
    address with the CA and audience; an allowed ServiceAccount's events get 202 over verified TLS and reach the
    subscriber as sent; a denied ServiceAccount gets 403 naming the policy, no token 401, and neither is on the
    topic."""
    from kafka_eventing.core.settings import Settings
    from kafka_eventing.localstack.tls import CertificateAuthority

    cl = cluster
    ca = CertificateAuthority("e2e receiver CA")
    ca_pem = ca.cert_pem.decode()
    cert = ca.issue("kafka-channel-receiver", (
        f"kafka-channel-receiver.{SYSTEM_NS}.svc", f"kafka-channel-receiver.{SYSTEM_NS}.svc.cluster.local",
        f"*.{APP_NS}.svc.cluster.local"))
    _secure_install(cl, ca_pem, cert)
    try:
        pods_ready(cl, SYSTEM_NS)  # the HTTPS probes pass
        receiver = cl.get("deployment", "ke-kafka-eventing-receiver", "-n", SYSTEM_NS)["spec"]["template"]["spec"]
        (port,) = [p["containerPort"] for p in receiver["containers"][0]["ports"] if p["name"] == "https"]

        cl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NS}},
                 *({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": APP_NS}}
                   for n in ("allowed", "denied")),
                 {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sink", "namespace": APP_NS},
                  "spec": {"securityContext": RESTRICTED_POD, "automountServiceAccountToken": False,
                           "containers": [{**sink_container(cl.images["receiver"], "Never"),
                                           "command": ["python", "-c", RECORDING_SINK]}]}})
        cl.kubectl("wait", "--for=condition=Ready", "pod/sink", "-n", APP_NS, "--timeout=300s", timeout=360)
        sink_ip = cl.get("pod", "sink", "-n", APP_NS)["status"]["podIP"]
        channel_ref = {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel", "name": SECURE}
        cl.apply(kafka_channel(SECURE, {"sub": f"http://{sink_ip}:8080/"}, 1), {
            "apiVersion": "eventing.knative.dev/v1alpha1", "kind": "EventPolicy",
            "metadata": {"name": POLICY, "namespace": APP_NS},
            "spec": {"to": [{"ref": channel_ref}],
                     "from": [{"ref": {"apiVersion": "v1", "kind": "ServiceAccount", "name": "allowed",
                                       "namespace": APP_NS}}]}})
        cl.kubectl("wait", "--for=condition=Ready", f"kafkachannel/{SECURE}", "-n", APP_NS, "--timeout=600s",
                   timeout=660)
        wait("dispatcher pod ready", lambda: dispatcher_ready(cl, 1), timeout=600, interval=2)
        # The subscription's consumer group has joined (it starts at the latest offset): what is sent now arrives.
        wait("status.subscribers ready", lambda: [
            s for s in cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"].get("subscribers") or ()
            if s.get("uid") == "sub" and s.get("ready") == "True"], timeout=300, interval=2)

        # The controller learnt the receiver serves HTTPS: the address is https:// with the Secret's CA.
        address = cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"]["address"]
        assert address["url"] == f"https://{SECURE_HOST}", address
        assert address["CACerts"].strip() == ca_pem.strip()
        audience = address["audience"]
        assert audience == f"messaging.knative.dev/kafkachannel/{APP_NS}/{SECURE}", address
        wait("the channel's status.policies names the policy", lambda: [
            p for p in cl.get("kafkachannel", SECURE, "-n", APP_NS)["status"].get("policies") or ()
            if p.get("name") == POLICY], timeout=120, interval=2)

        def token(account: str) -> str:
            return cl.kubectl("create", "token", account, "-n", APP_NS, f"--audience={audience}",
                              "--duration=10m").stdout.strip()

        allowed, denied = token("allowed"), token("denied")

        def post(ip: str, event_id: str, bearer: str | None, extra: dict[str, str] | None = None,
                 body: bytes = b'{"order": 1}') -> tuple[int, str]:
            headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/e2e/secure",
                       "ce-type": "com.example.secure", "content-type": "application/json", **(extra or {})}
            if bearer:
                headers["authorization"] = f"Bearer {bearer}"
            try:
                status_text: tuple[int, str] = cl.in_netns(clients.post_tls, ip, port, SECURE_HOST, "/", headers,
                                                           body, ca_pem)
            except httpx.TransportError as exc:
                # A receiver pod replaced since it was listed (evicted, restarted elsewhere) has no address any more;
                # 0 makes the caller list the pods again, and what the pods were doing is kept for the failure text.
                pods = cl.kubectl("get", "pods", "-n", SYSTEM_NS, "-o", "wide", check=False).stdout
                return 0, f"{exc!r}\n{pods}"
            return status_text

        # Every receiver pod has read the policy once the allowed sender gets through (deny-all before that). The
        # pods are listed afresh each round, so one replaced meanwhile is checked at its new address.
        sent: dict[str, tuple[dict[str, str], bytes]] = {}
        accepted: set[str] = set()
        pending: list[str] = []

        def every_receiver_accepts() -> bool:
            receivers = cl.in_netns(clients.receiver_ips, cl.kubectl_cmd, SYSTEM_NS)
            pending[:] = [] if len(receivers) == 2 else [f"ready receiver pods: {receivers}"]
            for ip in set(receivers) - accepted:
                event_id = f"allowed-{len(sent)}-{uuid.uuid4()}"
                extra = {"ce-subject": "order/1", "ce-time": "2026-11-27T05:00:00.123456789+02:00",
                         "ce-shopregion": "eu-west", "ce-dataschema": "https://example.com/order.json"}
                body = json.dumps({"n": len(sent), "name": "café"}).encode()
                status, text = post(ip, event_id, allowed, extra, body)
                if status == 202:
                    accepted.add(ip)
                    sent[event_id] = (extra, body)
                else:
                    pending.append(f"{ip}: {status} {text[:2000]}")
            return not pending and accepted >= set(receivers)

        try:
            wait("the allowed sender accepted by every receiver pod", every_receiver_accepts, timeout=180, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(pending)) from None

        receivers = cl.in_netns(clients.receiver_ips, cl.kubectl_cmd, SYSTEM_NS)
        refused = []
        for n, ip in enumerate(receivers):
            status, text = post(ip, f"denied-{n}-{uuid.uuid4()}", denied)
            assert status == 403 and POLICY in text, (ip, status, text)
            status, text = post(ip, f"anonymous-{n}-{uuid.uuid4()}", None)
            assert status == 401, (ip, status, text)
            refused.append(n)

        # The allowed events arrive at the subscriber as sent: every attribute, extension and data byte.
        def arrived() -> dict[str, Any]:
            return {e["id"]: e for e in sink_events(cl, "sink") if e["id"] in sent}

        try:
            got = wait("the allowed events at the subscriber", lambda: len(arrived()) == len(sent) and arrived(),
                       timeout=300, interval=2)
        except AssertionError as exc:
            logs = cl.kubectl("logs", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/name=kafka-channel-dispatcher",
                              "--tail=40", check=False)
            raise AssertionError(f"{exc}\ndispatcher logs:\n{logs.stdout}{logs.stderr}") from None
        for event_id, (extra, body) in sent.items():
            headers = got[event_id]["headers"]
            want = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": "/e2e/secure",
                    "ce-type": "com.example.secure", **extra}
            assert {k: v for k, v in headers.items() if k.startswith("ce-")} == want, headers
            assert headers["content-type"] == "application/json", headers
            assert "authorization" not in headers  # the sender's token is not passed on
            assert base64.b64decode(got[event_id]["body"]) == body

        # Refused requests wrote nothing: the topic holds exactly the allowed events.
        topic = Settings().topic_for(APP_NS, SECURE)
        on_topic = cl.in_netns(clients.topic_event_ids, cl.state["bootstrap_servers"], topic)
        assert sorted(on_topic) == sorted(sent), on_topic
        assert len(refused) == len(receivers)
    finally:
        cl.kubectl("delete", "namespace", APP_NS, "--ignore-not-found", "--timeout=300s", check=False, timeout=360)
        cl.helm("uninstall", "ke", "-n", SYSTEM_NS, "--wait", "--timeout=5m")
        cl.kubectl("delete", "namespace", SYSTEM_NS, "--ignore-not-found", "--timeout=300s", timeout=360)
