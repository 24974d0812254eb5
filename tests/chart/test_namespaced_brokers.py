"""``broker.namespaced.enabled``: the KafkaNamespaced class's settings and the controller's rights for it — exactly
the objects the namespaced reconcile (``controller/namespaced.py``) writes, by the names it writes them under, and
nothing of it while the value is off."""

from __future__ import annotations

from typing import Any

from kafka_eventing.controller.namespaced import DISPATCHER_BINDING, NAMESPACED_RECEIVER, referenced
from kafka_eventing.controller.resources import DISPATCHER_SERVICE_ACCOUNT

from .render import RELEASE, helm, of_kind, one

ON = "broker.namespaced.enabled=true"
#: the receiver mounts a connection Secret, serves HTTPS and pulls from a private registry: each Secret is copied
FULL = ("kafka.existingSecret=team-kafka", "receiver.tls.enabled=true", "imagePullSecrets={registry}")
CONTROLLER, RECEIVER, DISPATCHER = (f"{RELEASE}-{c}" for c in ("controller", "receiver", "dispatcher"))


def rules(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return list(one(docs, "ClusterRole", CONTROLLER)["rules"])


def config(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    return dict(one(docs, "ConfigMap", f"{RELEASE}-config")["data"])


def test_off_the_controller_gets_nothing_of_the_namespaced_data_plane() -> None:
    off, on = helm(sets=FULL), helm(sets=(*FULL, ON))
    assert not {k for k in config(off) if k.startswith("KE_NAMESPACED_")}
    extra = [r for r in rules(on) if r not in rules(off)]
    assert extra and all(r not in rules(off) for r in extra)
    assert not [r for r in rules(off) if "deployments" in r["resources"] or "clusterroles" in r["resources"]]
    assert not [r for r in rules(off) if {"configmaps", "secrets"} & set(r["resources"])
                and set(r["verbs"]) - {"get", "list", "watch"}]


def test_on_the_controller_may_do_exactly_what_the_namespaced_reconcile_does() -> None:
    off, on = helm(sets=FULL), helm(sets=(*FULL, ON))
    assert {k: v for k, v in config(on).items() if k.startswith("KE_NAMESPACED_")} == {
        "KE_NAMESPACED_RECEIVER_ROLE": RECEIVER, "KE_NAMESPACED_DISPATCHER_ROLE": DISPATCHER}
    # The ClusterRoles it binds are the shared data plane's own.
    bound = {b["roleRef"]["name"]: b["subjects"][0]["name"] for b in of_kind(on, "ClusterRoleBinding")}
    assert bound[RECEIVER] == RECEIVER and bound[DISPATCHER] == DISPATCHER_SERVICE_ACCOUNT
    config_maps, secrets = referenced(one(on, "Deployment", RECEIVER)["spec"]["template"])
    assert secrets == {"team-kafka", f"{RELEASE}-receiver-tls", "registry"}

    extra = [r for r in rules(on) if r not in rules(off)]
    granted = {(group, resource, verb, tuple(sorted(r.get("resourceNames") or ())))
               for r in extra for group in r["apiGroups"] for resource in r["resources"] for verb in r["verbs"]}
    assert granted == {
        # its dispatcher and the namespace's receiver: cached by label (list, watch), created, patched, deleted
        *(("apps", "deployments", verb, ()) for verb in ("list", "watch", "create", "patch", "delete")),
        ("", "serviceaccounts", "update", tuple(sorted((NAMESPACED_RECEIVER, DISPATCHER_SERVICE_ACCOUNT)))),
        *(("rbac.authorization.k8s.io", "rolebindings", verb, tuple(sorted((NAMESPACED_RECEIVER,
                                                                            DISPATCHER_BINDING))))
          for verb in ("get", "update")),
        ("rbac.authorization.k8s.io", "clusterroles", "bind", (DISPATCHER, RECEIVER)),
        ("", "configmaps", "create", ()), ("", "secrets", "create", ()),
        ("", "configmaps", "update", tuple(sorted(config_maps))),
        ("", "secrets", "update", tuple(sorted(secrets))),
    }
    # What the controller held already and the reconcile also uses: Services everywhere, ServiceAccounts read and
    # created, RoleBindings created, ConfigMaps read.
    held = {(g, res, v) for r in rules(off) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
            if not r.get("resourceNames")}
    assert {("", "services", v) for v in ("create", "patch")} <= held
    assert {("", "serviceaccounts", "get"), ("", "serviceaccounts", "create"), ("", "configmaps", "get"),
            ("rbac.authorization.k8s.io", "rolebindings", "create")} <= held
    assert ("", "secrets", "get") not in held  # Secret copies are written, never read

