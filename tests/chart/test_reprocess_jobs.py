"""The reprocessing CronJob/Job values and the SparkApplication example."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from kafka_eventing.core.settings import Settings

from .render import (
    CHART,
    NAMESPACE,
    RELEASE,
    REPROCESS_ON,
    ROOT,
    SETTINGS_ENV,
    helm,
    merged_values,
    of_kind,
    one,
    parse,
    pod_spec,
    rbac_problems,
    restricted_violations,
    run,
    scenario,
    tool,
)


def job_env(docs: tuple[dict[str, Any], ...], doc: dict[str, Any]) -> dict[str, Any]:
    by_name = {d["metadata"]["name"]: d for d in of_kind(docs, "ConfigMap")}
    (container,) = pod_spec(doc)["containers"]
    env: dict[str, Any] = {}
    for source in container["envFrom"]:
        env.update(by_name[source["configMapRef"]["name"]]["data"])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


@pytest.mark.parametrize("name", ["ci/all-optins-values.yaml", "ci/strimzi-sasl-scram-values.yaml"])
def test_reprocess_jobs(name: str) -> None:
    from kafka_eventing.reprocess.cli import build_parser

    # all-optins enables the jobs itself (without a connection Secret); strimzi gets them switched on here.
    docs = scenario(name) if "all-optins" in name else helm(name, sets=REPROCESS_ON)
    values = merged_values(name)
    (cron,) = of_kind(docs, "CronJob")
    (job,) = of_kind(docs, "Job")
    assert cron["metadata"]["name"] == "kafka-eventing-archive"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"  # two runs must not share a checkpoint
    assert cron["spec"]["schedule"] == values["reprocess"]["archive"]["schedule"]
    (sa,) = [d for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"] == "kafka-eventing-reprocess"]
    secret_name = one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"]
    assert bool(secret_name) == ("strimzi" in name)
    for doc, job_name in ((cron, "archive"), (job, "replay")):
        spec = pod_spec(doc)
        (c,) = spec["containers"]
        assert c["image"].endswith("/kafka-eventing-spark:" + yaml.safe_load((CHART / "Chart.yaml").read_text())[
            "appVersion"])
        assert "command" not in c  # the image's entrypoint is `python -m kafka_eventing.reprocess`
        args = build_parser().parse_args(c["args"])  # the real CLI accepts them
        assert args.job == job_name
        assert spec["restartPolicy"] == "Never"
        assert spec["serviceAccountName"] == sa["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == 185 and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = c["securityContext"]
        assert sc["runAsUser"] == 185 and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        # Settings.from_env must accept the env, and read the connection Secret where it is mounted.
        env = job_env(docs, doc)
        assert not {k for k in env if k.startswith("KE_")} - SETTINGS_ENV
        settings = Settings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
        assert settings.bootstrap_servers == values["kafka"]["bootstrapServers"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        if secret_name:
            assert volumes[mounts[str(settings.kafka_secret_dir)]]["secret"]["secretName"] == secret_name
        else:
            assert settings.kafka_secret_dir is None and "kafka-secret" not in volumes
        assert "emptyDir" in volumes[mounts["/tmp"]]  # Spark's scratch space on a read-only root filesystem
    # No Kubernetes API access: nothing binds a role to the jobs' ServiceAccount.
    for b in of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding"):
        assert all(s["name"] != sa["metadata"]["name"] for s in b["subjects"])


def test_reprocess_job_name_follows_its_spec() -> None:
    name = of_kind(helm(sets=REPROCESS_ON), "Job")[0]["metadata"]["name"]
    assert re.fullmatch(r"kafka-eventing-replay-[0-9a-f]{8}", name)
    # Same spec, same Job: an upgrade that changes other settings does not replace (and re-run) it, and the pod
    # template carries no chart-version labels that a chart upgrade would change.
    assert of_kind(helm(sets=(*REPROCESS_ON, "logLevel=DEBUG")), "Job")[0]["metadata"]["name"] == name
    template_labels = of_kind(helm(sets=REPROCESS_ON), "Job")[0]["spec"]["template"]["metadata"]["labels"]
    assert "helm.sh/chart" not in template_labels and "app.kubernetes.io/version" not in template_labels
    # A changed spec is a new Job: the pod template of an existing Job is immutable.
    other = helm(sets=(*REPROCESS_ON, "reprocess.replay.args={replay,--topic,u,--to-topic,u,--dry-run}"))
    assert of_kind(other, "Job")[0]["metadata"]["name"] != name
    other = helm(sets=(*REPROCESS_ON, "image.tag=abc1234"))
    assert of_kind(other, "Job")[0]["metadata"]["name"] != name


@pytest.mark.parametrize(("sets", "message"), [
    (("reprocess.archive.enabled=true",), "reprocess.archive.args is required"),
    (("reprocess.replay.enabled=true",), "reprocess.replay.args is required"),
    (("reprocess.replay.enabled=true", "reprocess.replay.args={archive,--topic,t}"), "schema"),
    (("reprocess.archive.enabled=true", "reprocess.archive.args={replay,--topic,t}"), "schema"),
    (("reprocess.archive.concurrencyPolicy=Allow",), "schema"),
])
def test_reprocess_values_are_checked(sets: tuple[str, ...], message: str) -> None:
    args = [tool("helm"), "template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run(args, ok=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_sparkapplication_example() -> None:
    from kafka_eventing.reprocess.cli import build_parser

    (app,) = parse((CHART / "examples" / "sparkapplication-archive.yaml").read_text())
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    spec = app["spec"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    main = spec["mainApplicationFile"].split("/site-packages/", 1)[1]
    assert (ROOT / "src" / main).is_file()
    args = build_parser().parse_args(spec["arguments"])
    assert args.job == "archive" and args.master.startswith("k8s://")
    docs = helm("values-strimzi.yaml")
    config = one(docs, "ConfigMap", "kafka-eventing-config")["metadata"]["name"]
    secret = one(docs, "ConfigMap", "config-kafka")["data"]["auth.secret.ref.name"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for role in ("driver", "executor"):
        pod = spec[role]
        assert pod["envFrom"] == [{"configMapRef": {"name": config}}]
        secret_dir = {e["name"]: e["value"] for e in pod["env"]}["KE_KAFKA_SECRET_DIR"]
        mounts = {m["mountPath"]: m["name"] for m in pod["volumeMounts"]}
        assert volumes[mounts[secret_dir]]["secret"]["secretName"] == secret
        assert "emptyDir" in volumes[mounts["/tmp"]]
        assert pod["podSecurityContext"]["runAsUser"] == 185 and pod["podSecurityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# The archive's --output (/out) on a volume every pod mounts, as cluster mode requires.
SHARED_OUT = ("reprocess.extraVolumes[0].name=out", "reprocess.extraVolumes[0].persistentVolumeClaim.claimName=archive",
              "reprocess.extraVolumeMounts[0].name=out", "reprocess.extraVolumeMounts[0].mountPath=/out")
CLUSTER_ON = (*REPROCESS_ON, *SHARED_OUT, "reprocess.cluster.enabled=true", "reprocess.cluster.executors=3",
              "reprocess.cluster.executorCores=2", "reprocess.cluster.executorMemory=2g")


def _conf(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--conf=").split("=", 1) for a in args if a.startswith("--conf="))


def test_local_mode_is_the_default_and_needs_no_api() -> None:
    docs = helm(sets=REPROCESS_ON)
    for doc in (*of_kind(docs, "CronJob"), *of_kind(docs, "Job")):
        spec = pod_spec(doc)
        assert spec["automountServiceAccountToken"] is False
        assert not any(a.startswith("--conf=spark.kubernetes") for a in spec["containers"][0]["args"])
    assert not [d for d in of_kind(docs, "Role") if d["metadata"]["name"].endswith("-reprocess")]
    assert not [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-reprocess-executor")]


def test_cluster_mode_master_is_a_value_for_clusters_without_dns() -> None:
    from kafka_eventing.reprocess.cli import build_parser

    master = "k8s://https://10.96.0.1:443"
    docs = helm(sets=(*CLUSTER_ON, f"reprocess.cluster.master={master}"))
    jobs = (*of_kind(docs, "CronJob"), *of_kind(docs, "Job"))
    assert jobs
    for doc in jobs:
        (c,) = pod_spec(doc)["containers"]
        assert build_parser().parse_args(c["args"]).master == master
    with pytest.raises(Exception, match="reprocess.cluster.master"):
        helm(sets=(*CLUSTER_ON, "reprocess.cluster.master=https://10.96.0.1"))  # not a k8s:// master


def test_cluster_mode_runs_executor_pods_with_least_rbac_and_restricted_pods() -> None:
    from kafka_eventing.reprocess.cli import build_parser

    docs = helm(sets=CLUSTER_ON)
    sa = "kafka-eventing-reprocess"
    image = None
    for doc in (*of_kind(docs, "CronJob"), *of_kind(docs, "Job")):
        spec = pod_spec(doc)
        (c,) = spec["containers"]
        image = c["image"]
        assert spec["serviceAccountName"] == sa and spec["automountServiceAccountToken"] is True
        parsed = build_parser().parse_args(c["args"])  # the CLI takes them; the chart's --master wins
        assert parsed.master == "k8s://https://kubernetes.default.svc"
        conf = _conf(c["args"])
        assert conf["spark.kubernetes.namespace"] == NAMESPACE
        assert conf["spark.kubernetes.container.image"] == c["image"]  # executors run the project's image
        assert (conf["spark.executor.instances"], conf["spark.executor.cores"], conf["spark.executor.memory"]) == (
            "3", "2", "2g")
        assert conf["spark.kubernetes.executor.deleteOnTermination"] == "true"
        # No Service or PersistentVolumeClaim of the driver to delete at the end: the Role has neither.
        assert (conf["spark.kubernetes.driver.service.deleteOnTermination"],
                conf["spark.kubernetes.driver.ownPersistentVolumeClaim"],
                conf["spark.kubernetes.driver.reusePersistentVolumeClaim"]) == ("false", "false", "false")
        # Executors reach the driver at its pod IP and are owned by its pod (deleted with it).
        assert conf["spark.driver.host"] == "$(POD_IP)" and conf["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
        assert env["POD_IP"] == "status.podIP" and env["POD_NAME"] == "metadata.name"
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        template_dir = conf["spark.kubernetes.executor.podTemplateFile"].rsplit("/", 1)[0]
        assert mounts[template_dir] == "executor-template"
        assert not restricted_violations(spec)

    (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-reprocess-executor")]
    executor = yaml.safe_load(cm["data"]["executor.yaml"])
    assert executor["kind"] == "Pod"
    assert executor["spec"]["automountServiceAccountToken"] is False  # executors call no API
    assert [c["name"] for c in executor["spec"]["containers"]] == ["executor"]
    assert not restricted_violations(executor["spec"]), restricted_violations(executor["spec"])
    assert image is not None

    (role,) = [d for d in of_kind(docs, "Role") if d["metadata"]["name"] == sa]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert {r["resources"][0]: set(r["verbs"]) for r in role["rules"]} == {
        "pods": {"get", "list", "watch", "create", "patch", "delete", "deletecollection"},
        "configmaps": {"get", "list", "create", "delete", "deletecollection"},
    }
    assert all(r["apiGroups"] == [""] and len(r["resources"]) == 1 for r in role["rules"])
    assert not [d for d in of_kind(docs, "ClusterRoleBinding") if sa in str(d.get("subjects"))]
    (binding,) = [d for d in of_kind(docs, "RoleBinding") if d["metadata"]["name"] == sa]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    assert not rbac_problems(docs)


@pytest.mark.parametrize("args", [
    "reprocess.replay.args={replay,--topic,t,--to-topic,u,--run-dir,/runs/r1}",
    "reprocess.replay.args={replay,--topic,t,--to-topic,u,--run-dir=/runs/r1}",
    "reprocess.replay.args={replay,--topic,t,--to-topic,u,--run-dir,/output/r1}",  # /out's sibling, not under it
    "reprocess.archive.args={archive,--topic,t,--output,/archive}",
])
def test_cluster_mode_refuses_a_path_the_executors_cannot_share(args: str) -> None:
    proc = run([tool("helm"), "template", RELEASE, str(CHART), *(a for s in (*CLUSTER_ON, args) for a in ("--set", s))],
               ok=False)
    assert proc.returncode != 0 and "is not on a volume of reprocess.extraVolumeMounts" in proc.stderr, proc.stderr
    # In local mode one pod does everything: its own disk will do.
    assert helm(sets=tuple(s for s in (*CLUSTER_ON, args) if not s.startswith("reprocess.cluster.enabled")))
    # A URI (s3a://, gs://) is reachable from every executor.
    remote = re.sub(r"(/runs/r1|/output/r1|/archive)", "s3a://bucket/x", args)
    assert helm(sets=(*CLUSTER_ON, remote))


def test_cluster_conf_is_checked_by_the_schema() -> None:
    bad = run([tool("helm"), "template", RELEASE, str(CHART), "--set", "reprocess.cluster.executors=0"], ok=False)
    assert bad.returncode != 0 and "executors" in bad.stderr
    bad = run([tool("helm"), "template", RELEASE, str(CHART), "--set-string", "reprocess.cluster.conf.foo=1"],
              ok=False)
    assert bad.returncode != 0 and "'foo' does not match pattern" in bad.stderr


def test_cluster_conf_adds_settings_and_the_charts_own_win() -> None:
    docs = helm(sets=(*CLUSTER_ON, "reprocess.cluster.conf.spark\\.kubernetes\\.executor\\.request\\.cores=250m",
                      "reprocess.cluster.conf.spark\\.kubernetes\\.namespace=elsewhere"))
    for doc in (*of_kind(docs, "CronJob"), *of_kind(docs, "Job")):
        (c,) = pod_spec(doc)["containers"]
        conf = _conf(c["args"])
        assert conf["spark.kubernetes.executor.request.cores"] == "250m"
        assert conf["spark.kubernetes.namespace"] == NAMESPACE  # as values.yaml says: the chart's settings win
