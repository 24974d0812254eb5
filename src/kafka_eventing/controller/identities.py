"""Senders' OIDC identities (Knative's ``pkg/auth``): with ingress authentication on, every Trigger and KafkaSource gets
a ServiceAccount of its own in its own namespace (``core.tokens.oidc_service_account``), owned by it (deleted with
it), named in its ``status.auth.serviceAccountName`` and reported by the ``OIDCIdentityCreated`` condition. The
dispatcher sends that account's tokens on the resource's deliveries, replies and dead letters, so an EventPolicy
can name the resource in ``from.ref`` and no one else's token ever leaves the dispatcher.

The dispatchers may request exactly those accounts' tokens: in each namespace with senders a Role
(``core.tokens.TOKEN_ROLE``) grants ``create`` on ``serviceaccounts/token`` for the accounts by name
(``resourceNames``), bound to the dispatchers' ServiceAccount. Its names are the namespace's OIDC accounts (Knative's
label) that a Trigger, a KafkaSource or a Subscription controls — the Subscriptions' made by Knative's Subscription
controller and named in a KafkaChannel's ``spec.subscribers[].auth`` — read again whenever a sender comes or goes or
a channel names an account not granted yet. Kubernetes lets a controller write a Role that grants what it does not
hold itself only with ``escalate`` (and bind it only with ``bind``), both limited by the chart to that one Role's
name; ``escalate`` is checked against the name, which a create does not have yet, so the Role is created empty and
then updated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kafka_eventing.core import tokens
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.settings import Settings

log = logging.getLogger(__name__)

#: The condition a sender reports about its identity (Knative's).
OIDC_IDENTITY_CREATED = "OIDCIdentityCreated"
#: The kinds whose OIDC accounts the dispatchers send as.
SENDER_KINDS = frozenset({"Trigger", "KafkaSource", "Subscription"})
HTTP_NOT_FOUND, HTTP_CONFLICT = 404, 409


class IdentityError(Exception):
    """The identity cannot be set up; the message says which object and why."""


class Identities:
    """Creates senders' OIDC ServiceAccounts and keeps each namespace's token Role listing them."""

    def __init__(self, api_client: Any, settings: Settings) -> None:
        self.core = client.CoreV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.settings = settings
        self._lock = threading.Lock()  # one Role update at a time: reconciles of one namespace share its Role
        self._granted: dict[str, frozenset[str]] = {}  # namespace → the names its Role lists, as last written

    @property
    def enabled(self) -> bool:
        return bool(self.settings.auth_issuer)

    def ensure(self, api_version: str, kind: str, obj: Mapping[str, Any],
               status: dict[str, Any]) -> Condition:
        """Sets ``status["auth"]`` and returns ``OIDCIdentityCreated``; off (no ingress authentication): no identity,
        as upstream without its ``authentication-oidc`` feature."""
        if not self.enabled:
            status["auth"] = None
            return Condition.true(OIDC_IDENTITY_CREATED, "AuthenticationDisabled",
                                  "ingress authentication is off: deliveries carry no token")
        meta = obj["metadata"]
        namespace = str(meta["namespace"])
        name = tokens.oidc_service_account(api_version.rpartition("/")[0], kind, str(meta["name"]))
        try:
            self._account(api_version, kind, meta, name)
            self.grant(namespace, [name])
        except IdentityError as exc:
            status["auth"] = None
            return Condition.false(OIDC_IDENTITY_CREATED, "OIDCIdentityFailed", str(exc))
        status["auth"] = {"serviceAccountName": name}
        return Condition.true(OIDC_IDENTITY_CREATED)

    def forget(self, api_version: str, kind: str, obj: Mapping[str, Any]) -> None:
        """Takes a deleted sender's account off its namespace's token Role (the account goes with its owner)."""
        if not self.enabled:
            return
        meta = obj["metadata"]
        name = tokens.oidc_service_account(api_version.rpartition("/")[0], kind, str(meta["name"]))
        self.sync(str(meta["namespace"]), without=name)

    def grant(self, namespace: str, names: Iterable[str]) -> None:
        """Makes sure the namespace's token Role lists these accounts (a sync when one is not listed yet)."""
        if self.enabled and not set(names) <= self._granted.get(namespace, frozenset()):
            self.sync(namespace)

    def sync(self, namespace: str, *, without: str = "") -> None:
        """The namespace's token Role lists exactly its senders' OIDC accounts (``without`` one being deleted)."""
        try:
            listed = self.core.list_namespaced_service_account(
                namespace, label_selector=f"{tokens.OIDC_LABEL}=enabled", _request_timeout=(5, 15))
        except ApiException as exc:
            raise IdentityError(f"the ServiceAccounts of {namespace} cannot be listed: HTTP {exc.status} "
                                f"{exc.reason}") from None
        names = {sa.metadata.name for sa in listed.items
                 if sa.metadata.name != without and not sa.metadata.deletion_timestamp
                 and any(o.controller and o.kind in SENDER_KINDS for o in sa.metadata.owner_references or ())}
        with self._lock:
            self._write(namespace, names)
            self._granted[namespace] = frozenset(names)

    def _account(self, api_version: str, kind: str, meta: Mapping[str, Any], name: str) -> None:
        namespace = str(meta["namespace"])
        where = f"ServiceAccount {namespace}/{name}"
        try:
            found = self.core.read_namespaced_service_account(name, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise IdentityError(f"{where}: cannot be read: HTTP {exc.status} {exc.reason}") from None
            found = None
        if found is not None:
            owners = found.metadata.owner_references or ()
            if not any(o.controller and o.uid == meta.get("uid") for o in owners):
                raise IdentityError(f"{where} exists and is not owned by {kind} {meta['name']}: delete it or "
                                    "rename the resource")
            return
        body = client.V1ServiceAccount(metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, labels={tokens.OIDC_LABEL: "enabled"},
            annotations={"description": f"Service Account for OIDC Authentication for {kind} {meta['name']!r}"},
            owner_references=[client.V1OwnerReference(api_version=api_version, kind=kind, name=str(meta["name"]),
                                                      uid=str(meta.get("uid")), controller=True,
                                                      block_owner_deletion=False)]))
        try:
            self.core.create_namespaced_service_account(namespace, body, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:  # created meanwhile: its owner is checked on the next reconcile
                raise IdentityError(f"{where}: cannot be created: HTTP {exc.status} {exc.reason}") from None

    def _write(self, namespace: str, names: set[str]) -> None:
        """The namespace's token Role lists ``names``; its RoleBinding names the dispatchers."""
        where = f"Role {namespace}/{tokens.TOKEN_ROLE}"
        try:
            role = self._role(namespace)
            listed = set(role.rules[0].resource_names or ()) if role.rules else set()
            if listed != names:
                role.rules = [client.V1PolicyRule(api_groups=[""], resources=["serviceaccounts/token"],
                                                  verbs=["create"], resource_names=sorted(names))] if names else []
                self.rbac.replace_namespaced_role(tokens.TOKEN_ROLE, namespace, role, _request_timeout=(5, 15))
            if names:
                self._binding(namespace)
        except ApiException as exc:
            raise IdentityError(f"{where}: cannot be written: HTTP {exc.status} {exc.reason} (the controller needs "
                                f"escalate and bind on that Role; see docs/security.md)") from None

    def _role(self, namespace: str) -> Any:
        try:
            return self.rbac.read_namespaced_role(tokens.TOKEN_ROLE, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
        body = client.V1Role(metadata=client.V1ObjectMeta(name=tokens.TOKEN_ROLE, namespace=namespace,
                                                          labels={tokens.OIDC_LABEL: "enabled"}), rules=[])
        try:
            return self.rbac.create_namespaced_role(namespace, body, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_CONFLICT:
                raise
            return self.rbac.read_namespaced_role(tokens.TOKEN_ROLE, namespace, _request_timeout=(5, 15))

    def _binding(self, namespace: str) -> None:
        # The dispatchers of the system namespace; with the KafkaNamespaced class on, also those of this namespace
        # (its Brokers' own dispatchers, which send as this namespace's Triggers).
        where = [self.settings.system_namespace]
        if self.settings.namespaced_brokers and namespace != self.settings.system_namespace:
            where.append(namespace)
        subjects = [client.RbacV1Subject(kind="ServiceAccount", name=tokens.DISPATCHER_SERVICE_ACCOUNT, namespace=ns)
                    for ns in where]
        body = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name=tokens.TOKEN_ROLE, namespace=namespace,
                                         labels={tokens.OIDC_LABEL: "enabled"}),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=tokens.TOKEN_ROLE),
            subjects=subjects)
        try:
            found = self.rbac.read_namespaced_role_binding(tokens.TOKEN_ROLE, namespace, _request_timeout=(5, 15))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            try:
                self.rbac.create_namespaced_role_binding(namespace, body, _request_timeout=(5, 15))
            except ApiException as again:
                if again.status != HTTP_CONFLICT:
                    raise
            return
        if [(s.kind, s.name, s.namespace) for s in found.subjects or ()] != [(s.kind, s.name, s.namespace)
                                                                             for s in subjects]:
            body.metadata.resource_version = found.metadata.resource_version
            self.rbac.replace_namespaced_role_binding(tokens.TOKEN_ROLE, namespace, body, _request_timeout=(5, 15))
