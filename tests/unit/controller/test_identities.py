"""identities: a sender's OIDC ServiceAccount (Knative's name, owned by the sender, labelled), the namespace's token
Role listing exactly the senders' accounts — created empty and then updated, since ``escalate`` is checked against
a name a create does not have — and nothing at all with ingress authentication off. Fakes stand in for the API here;
tests/integration/test_broker_auth.py runs the same on the real API server under the chart's RBAC."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from kafka_eventing.controller.identities import OIDC_IDENTITY_CREATED, Identities
from kafka_eventing.core import tokens
from kafka_eventing.core.settings import Settings

ON = Settings(system_namespace="knative-eventing", auth_issuer="https://issuer.example")
TRIGGER = {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
           "metadata": {"namespace": "shop", "name": "orders", "uid": "u-1"}}


def _missing() -> client.ApiException:
    return client.ApiException(status=404, reason="Not Found")


class Api:
    """The CoreV1 and RbacAuthorizationV1 calls ``Identities`` makes, over dicts; ``calls`` records the writes."""

    def __init__(self) -> None:
        self.accounts: dict[tuple[str, str], client.V1ServiceAccount] = {}
        self.roles: dict[tuple[str, str], client.V1Role] = {}
        self.bindings: dict[tuple[str, str], client.V1RoleBinding] = {}
        self.calls: list[tuple[str, Any]] = []

    def read_namespaced_service_account(self, name: str, namespace: str, **_: Any) -> client.V1ServiceAccount:
        if (namespace, name) not in self.accounts:
            raise _missing()
        return self.accounts[(namespace, name)]

    def create_namespaced_service_account(self, namespace: str, body: client.V1ServiceAccount, **_: Any) -> None:
        self.calls.append(("create account", body.metadata.name))
        self.accounts[(namespace, body.metadata.name)] = body

    def list_namespaced_service_account(self, namespace: str, label_selector: str, **_: Any) -> Any:
        key, _, value = label_selector.partition("=")
        return client.V1ServiceAccountList(items=[a for (ns, _), a in self.accounts.items()
                                                  if ns == namespace and (a.metadata.labels or {}).get(key) == value])

    def read_namespaced_role(self, name: str, namespace: str, **_: Any) -> client.V1Role:
        if (namespace, name) not in self.roles:
            raise _missing()
        return self.roles[(namespace, name)]

    def create_namespaced_role(self, namespace: str, body: client.V1Role, **_: Any) -> client.V1Role:
        self.calls.append(("create role", [r.resource_names for r in body.rules or ()]))
        self.roles[(namespace, body.metadata.name)] = body
        return body

    def replace_namespaced_role(self, name: str, namespace: str, body: client.V1Role, **_: Any) -> None:
        self.calls.append(("update role", [r.resource_names for r in body.rules or ()]))
        self.roles[(namespace, name)] = body

    def read_namespaced_role_binding(self, name: str, namespace: str, **_: Any) -> client.V1RoleBinding:
        if (namespace, name) not in self.bindings:
            raise _missing()
        return self.bindings[(namespace, name)]

    def create_namespaced_role_binding(self, namespace: str, body: client.V1RoleBinding, **_: Any) -> None:
        self.calls.append(("create binding", [(s.namespace, s.name) for s in body.subjects]))
        self.bindings[(namespace, body.metadata.name)] = body


def identities(settings: Settings = ON) -> tuple[Identities, Api]:
    api = Api()
    ids = Identities(client.ApiClient(), settings)
    ids.core = ids.rbac = api  # type: ignore[assignment]
    return ids, api


def account(name: str, owner_kind: str | None, namespace: str = "shop") -> client.V1ServiceAccount:
    owners = [client.V1OwnerReference(api_version="v1", kind=owner_kind, name="x", uid="u", controller=True)
              ] if owner_kind else None
    return client.V1ServiceAccount(metadata=client.V1ObjectMeta(
        name=name, namespace=namespace, labels={tokens.OIDC_LABEL: "enabled"},
        owner_references=owners))


def test_a_trigger_gets_its_account_and_the_dispatchers_exactly_its_token() -> None:
    ids, api = identities()
    status: dict[str, Any] = {}
    condition = ids.ensure("eventing.knative.dev/v1", "Trigger", TRIGGER, status)
    name = "orders-oidc-eventing.knative.dev-trigger"
    assert condition.type == OIDC_IDENTITY_CREATED and condition.is_true
    assert status["auth"] == {"serviceAccountName": name}
    sa = api.accounts[("shop", name)]
    assert sa.metadata.labels == {tokens.OIDC_LABEL: "enabled"}
    (owner,) = sa.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
        "Trigger", "orders", "u-1", True, False)
    # Created empty, then updated: escalate is granted on the Role's name, which a create does not carry.
    assert api.calls == [("create account", name), ("create role", []), ("update role", [[name]]),
                         ("create binding", [("knative-eventing", tokens.DISPATCHER_SERVICE_ACCOUNT)])]
    (rule,) = api.roles[("shop", tokens.TOKEN_ROLE)].rules
    assert (rule.resources, rule.verbs) == (["serviceaccounts/token"], ["create"])

    api.calls.clear()
    assert ids.ensure("eventing.knative.dev/v1", "Trigger", TRIGGER, {}).is_true
    assert api.calls == []  # nothing to write the second time


def test_the_role_lists_only_accounts_a_sender_controls_and_forgets_a_deleted_one() -> None:
    ids, api = identities()
    for sa in (account("a-oidc-eventing.knative.dev-trigger", "Trigger"),
               account("s-oidc-messaging.knative.dev-subscription", "Subscription"),
               account("k-oidc-sources.knative.dev-kafkasource", "KafkaSource"),
               account("unowned", None), account("owned-by-a-pod", "Pod"),
               account("elsewhere-oidc-eventing.knative.dev-trigger", "Trigger", namespace="other")):
        api.accounts[(sa.metadata.namespace, sa.metadata.name)] = sa
    ids.grant("shop", ["s-oidc-messaging.knative.dev-subscription"])
    (rule,) = api.roles[("shop", tokens.TOKEN_ROLE)].rules
    assert rule.resource_names == ["a-oidc-eventing.knative.dev-trigger", "k-oidc-sources.knative.dev-kafkasource",
                                   "s-oidc-messaging.knative.dev-subscription"]
    api.calls.clear()
    ids.grant("shop", ["a-oidc-eventing.knative.dev-trigger"])  # already listed: no API call at all
    assert api.calls == []
    ids.forget("eventing.knative.dev/v1", "Trigger", {"metadata": {"namespace": "shop", "name": "a"}})
    (rule,) = api.roles[("shop", tokens.TOKEN_ROLE)].rules
    assert "a-oidc-eventing.knative.dev-trigger" not in rule.resource_names


def test_an_account_the_trigger_does_not_own_is_refused_not_taken_over() -> None:
    ids, api = identities()
    squatter = account("orders-oidc-eventing.knative.dev-trigger", None)
    api.accounts[("shop", squatter.metadata.name)] = squatter
    status: dict[str, Any] = {}
    condition = ids.ensure("eventing.knative.dev/v1", "Trigger", TRIGGER, status)
    assert (condition.status, condition.reason) == ("False", "OIDCIdentityFailed")
    assert "not owned by Trigger orders" in condition.message and status["auth"] is None
    assert ("shop", tokens.TOKEN_ROLE) not in api.roles


def test_with_ingress_auth_off_there_is_no_identity_and_no_call() -> None:
    ids, api = identities(Settings(system_namespace="knative-eventing"))
    status: dict[str, Any] = {"auth": {"serviceAccountName": "stale"}}
    condition = ids.ensure("eventing.knative.dev/v1", "Trigger", TRIGGER, status)
    assert condition.is_true and condition.reason == "AuthenticationDisabled" and status["auth"] is None
    ids.grant("shop", ["x"])
    ids.forget("eventing.knative.dev/v1", "Trigger", TRIGGER)
    assert api.calls == [] and not api.accounts


def test_with_the_kafkanamespaced_class_on_the_namespaces_own_dispatchers_may_request_its_senders_tokens() -> None:
    ids, api = identities(Settings(system_namespace="knative-eventing", auth_issuer="https://issuer.example",
                                   namespaced_receiver_role="r", namespaced_dispatcher_role="d"))
    assert ids.ensure("eventing.knative.dev/v1", "Trigger", TRIGGER, {}).is_true
    assert api.calls[-1] == ("create binding", [("knative-eventing", tokens.DISPATCHER_SERVICE_ACCOUNT),
                                                ("shop", tokens.DISPATCHER_SERVICE_ACCOUNT)])
