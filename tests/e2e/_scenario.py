"""What the cluster tiers share: the namespaces, the restricted pod settings, the subscriber pod, the objects a
scenario creates, and the checks it makes through kubectl (tests/e2e/test_cluster.py on this machine's real pods,
tests/e2e/test_kind.py on kind). How a tier reaches its cluster — nsenter, a kind kubeconfig — stays in its module,
behind the small ``Kube`` interface below. Nothing here imports pytest.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any, Protocol

from kafka_eventing.core import brokers as kb
from kafka_eventing.core import kafkasources as ksrc

SYSTEM_NS = "knative-eventing"
APP_NS = "e2e"
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
# The subscriber pod: a stdlib HTTP server run from the receiver image (no sink image to pull), one JSON line per
# event on stdout: its id, type and data as text for the scenario's checks, and the request as it came (path, the
# CloudEvent headers, the body in base64) for checks that compare whole events.
SINK = """
import base64, http.server, json, sys, threading
lock = threading.Lock()
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()
                   if k.lower().startswith("ce-") or k.lower() == "content-type"}
        line = json.dumps({"id": self.headers.get("ce-id"), "type": self.headers.get("ce-type"),
                           "data": body.decode(errors="replace"), "path": self.path, "headers": headers,
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
DISPATCHER_SELECTOR = "app.kubernetes.io/name=kafka-channel-dispatcher"
BROKER_OWNER = "kafka.eventing.knative.dev/broker"
# What an uninstall must leave none of: in the system namespace, everything but what Kubernetes itself puts there;
# cluster-wide, what carries the release's instance label (CRDs stay on purpose: crds.keep).
NAMESPACED_KINDS = ("pods,deployments,replicasets,services,configmaps,secrets,serviceaccounts,roles,rolebindings,"
                    "poddisruptionbudgets,networkpolicies")
CLUSTER_KINDS = "clusterroles,clusterrolebindings"
#: What marks every object of the chart and of the overlay, cluster-wide ones included.
PART_OF = "app.kubernetes.io/part-of=kafka-eventing"


class Kube(Protocol):
    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess[str]: ...


def role_images(refs: list[str]) -> dict[str, str]:
    """Role → image reference among the references of `make cluster-images`' archive (``curl``: the OS base with
    curl that the chart's ``helm test`` Pod runs)."""
    roles = {}
    for ref in refs:
        repo = ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        if repo.startswith("kafka-eventing-debian"):
            roles["curl"] = ref
        else:
            roles[repo.removeprefix("kafka-eventing-")] = ref
    missing = {"receiver", "dispatcher", "controller", "curl"} - roles.keys()
    assert not missing, f"no image for {sorted(missing)} among {refs}: run `make cluster-images`"
    return roles


def get(kube: Kube, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def wait(what: str, check: Callable[[], Any], timeout: float = 300, interval: float = 1.0) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` and the last answer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not reached in {timeout:.0f}s (last: {last!r})")


def pods_ready(kube: Kube, namespace: str, timeout: float = 600) -> None:
    """Every pod in ``namespace`` Running and Ready, and none terminating. Polled, not ``kubectl wait --all``: that
    waits on the pods it listed first, and a pod a rollout is replacing never becomes Ready again (it goes away),
    so it would hang to its timeout."""

    def not_ready() -> list[str]:
        pods = get(kube, "pods", "-n", namespace)["items"]
        if not pods:
            return ["(no pods yet)"]
        return [pod["metadata"]["name"] for pod in pods
                if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running"
                or not any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))]

    last: list[str] = []

    def ready() -> bool:
        last[:] = not_ready()
        return not last

    try:
        wait(f"every pod in {namespace} Running and Ready", ready, timeout=timeout, interval=2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; not ready: {last}") from None


def sink_container(image: str, pull_policy: str) -> dict[str, Any]:
    return {"name": "sink", "image": image, "imagePullPolicy": pull_policy, "command": ["python", "-c", SINK],
            "securityContext": RESTRICTED_CONTAINER, "ports": [{"containerPort": 8080}],
            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
            "resources": {"limits": {"memory": "64Mi"}}}


def sink_events(kube: Kube, resource: str, namespace: str = APP_NS) -> list[dict[str, Any]]:
    """The events the sink of ``resource`` (``sink`` for the pod, ``deployment/sink``) logged, in order."""
    logs = kube.kubectl("logs", resource, "-n", namespace, check=False).stdout
    return [json.loads(line) for line in logs.splitlines() if line.startswith("{")]


def sink_ids(kube: Kube, resource: str, namespace: str = APP_NS) -> set[str]:
    return {event["id"] for event in sink_events(kube, resource, namespace)}


def kafka_channel(name: str, subscribers: dict[str, str], partitions: int,
                  delivery: dict[str, Any] | None = None) -> dict[str, Any]:
    """A KafkaChannel whose subscribers (uid → URI) are written into spec.subscribers directly, as Knative's
    Subscription controller would: neither cluster runs Knative core."""
    return {
        "apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {"numPartitions": partitions, "replicationFactor": 1, "subscribers": [
            {"uid": uid, "generation": 1, "subscriberUri": uri, **({"delivery": delivery} if delivery else {})}
            for uid, uri in subscribers.items()]},
    }


def dispatchers(kube: Kube) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(kube, "deployments", "-n", SYSTEM_NS, "-l", DISPATCHER_SELECTOR)["items"]
    return items


def dispatcher_ready(kube: Kube, replicas: int) -> bool:
    deps = dispatchers(kube)
    return (len(deps) == 1 and deps[0]["spec"].get("replicas") == replicas
            and deps[0]["status"].get("readyReplicas") == replicas
            and deps[0]["status"].get("updatedReplicas") == replicas
            and deps[0]["status"].get("replicas") == replicas)


# ---------------------------------------------------------------------------------------------- the Broker

BROKER = "default"
CREATED, SHIPPED, AUDIT = "com.example.order.created", "com.example.order.shipped", "com.example.audit"


def broker_with_triggers(pod_sink: str, other_sink: str) -> list[dict[str, Any]]:
    """A Kafka Broker (2 partitions, from its own ConfigMap) and two Triggers whose filters differ: ``created``
    (``filter.attributes``) takes order.created events to ``pod_sink``; ``orders`` (``filters``, prefix) every
    order event to ``other_sink``. An audit event matches neither."""
    api = f"{kb.GROUP}/{kb.VERSION}"
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "broker-config", "namespace": APP_NS},
         "data": {kb.KEY_PARTITIONS: "2", kb.KEY_REPLICATION: "1"}},
        {"apiVersion": api, "kind": "Broker",
         "metadata": {"name": BROKER, "namespace": APP_NS,
                      "annotations": {kb.ANNOTATION_BROKER_CLASS: kb.BROKER_CLASS}},
         "spec": {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "broker-config"}}},
        {"apiVersion": api, "kind": "Trigger", "metadata": {"name": "created", "namespace": APP_NS},
         "spec": {"broker": BROKER, "filter": {"attributes": {"type": CREATED}}, "subscriber": {"uri": pod_sink}}},
        {"apiVersion": api, "kind": "Trigger", "metadata": {"name": "orders", "namespace": APP_NS},
         "spec": {"broker": BROKER, "filters": [{"prefix": {"type": "com.example.order."}}],
                  "subscriber": {"uri": other_sink}}},
    ]


def broker_ready(kube: Kube) -> None:
    """Broker and both Triggers Ready, its address the receiver's /<namespace>/<broker>, and the dispatcher
    Deployment the controller made for it Ready."""
    kube.kubectl("wait", "--for=condition=Ready", f"broker/{BROKER}", "trigger/created", "trigger/orders",
                 "-n", APP_NS, "--timeout=600s", timeout=660)
    broker = get(kube, "broker", BROKER, "-n", APP_NS)
    assert broker["status"]["address"]["url"].endswith(f"/{APP_NS}/{BROKER}"), broker["status"]
    wait("Broker dispatcher ready", lambda: [d for d in broker_dispatcher(kube)
                                             if d["status"].get("readyReplicas") == d["spec"].get("replicas")],
         timeout=600, interval=2)


def broker_dispatcher(kube: Kube) -> list[dict[str, Any]]:
    return [d for d in dispatchers(kube)
            if (d["metadata"].get("annotations") or {}).get(BROKER_OWNER) == f"{APP_NS}/{BROKER}"]


# ---------------------------------------------------------------------------------------------- KafkaSink, KafkaSource

KAFKA_SINK, KAFKA_SOURCE = "orders-sink", "orders-source"
SINK_TOPIC = "e2e-orders-sink"
#: The sink ingress Service's name (chart value receiver.sinkService.name): a request to it names only KafkaSinks.
SINK_HOST = f"kafka-sink-ingress.{SYSTEM_NS}.svc.cluster.local"
SOURCE_OWNER = "kafka.eventing.knative.dev/kafkasource"


def kafka_sink(bootstrap_servers: str) -> dict[str, Any]:
    """A KafkaSink that creates its topic (2 partitions)."""
    return {"apiVersion": "eventing.knative.dev/v1alpha1", "kind": "KafkaSink",
            "metadata": {"name": KAFKA_SINK, "namespace": APP_NS},
            "spec": {"topic": SINK_TOPIC, "numPartitions": 2, "replicationFactor": 1,
                     "bootstrapServers": [bootstrap_servers]}}


def kafka_source(bootstrap_servers: str, subscriber: str) -> dict[str, Any]:
    """A KafkaSource reading the sink's topic from the start into ``subscriber``, on two dispatcher pods."""
    return {"apiVersion": f"{ksrc.GROUP}/{ksrc.VERSION}", "kind": ksrc.KIND,
            "metadata": {"name": KAFKA_SOURCE, "namespace": APP_NS},
            "spec": {"bootstrapServers": [bootstrap_servers], "topics": [SINK_TOPIC], "initialOffset": "earliest",
                     "consumers": 2, "sink": {"uri": subscriber}}}


def source_dispatcher(kube: Kube) -> list[dict[str, Any]]:
    return [d for d in dispatchers(kube)
            if (d["metadata"].get("annotations") or {}).get(SOURCE_OWNER) == f"{APP_NS}/{KAFKA_SOURCE}"]


# ---------------------------------------------------------------------------------------------- uninstall


def assert_release_objects(kube: Kube, instance: str) -> None:
    """Before an uninstall: the instance label selects the release's cluster-scoped objects, so that
    ``assert_uninstalled`` proves something."""
    release = f"app.kubernetes.io/instance={instance}"
    assert get(kube, CLUSTER_KINDS, "-l", release)["items"], f"no {CLUSTER_KINDS} labelled {release}"


def assert_uninstalled(kube: Kube, instance: str, what: str) -> None:
    """After an uninstall: no object of the release in the system namespace, none cluster-wide by its label."""
    # Deleted Deployments' pods terminate gracefully (the receiver's grace period is 30 s): wait them out.
    kube.kubectl("wait", "--for=delete", "pod", "--all", "-n", SYSTEM_NS, "--timeout=300s", timeout=360)
    left = [f"{i['kind']}/{i['metadata']['name']}" for i in get(kube, NAMESPACED_KINDS, "-n", SYSTEM_NS)["items"]
            if i["metadata"]["name"] not in ("kube-root-ca.crt", "default")]
    left += [f"{i['kind']}/{i['metadata']['name']}"
             for i in get(kube, CLUSTER_KINDS, "-l", f"app.kubernetes.io/instance={instance}")["items"]]
    assert left == [], f"{what} uninstall left {left}"
