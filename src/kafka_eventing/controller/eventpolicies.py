"""EventPolicies (``core/eventpolicies.py``) as the controller sees them: the status of each policy, and what every
KafkaChannel, Broker and KafkaSink reports about the policies that apply to it (``status.policies`` and the
``EventPoliciesReady`` condition, Knative's fields). The receiver enforces the policies itself, from the same
objects; nothing here is on the request path.

A policy's status (``status.from`` and Ready, from SubjectsResolved and AuthenticationEnabled) is written only
where the controller was told it owns the EventPolicy type (``KE_EVENT_POLICY_STATUS``, set by the chart with
``crds.eventPolicies``): where Knative Eventing is installed its own controller writes that status, and two writers
would fight over it. The targets' status is always ours.

Refused, with Ready False and a reason: a spec the receiver cannot use (InvalidSpec), filters that do not compile
(InvalidFilter), a ``from`` ref that cannot be resolved to the identity it sends with (SubjectsNotResolved: the
object is missing, has no ``status.auth.serviceAccountName``, or may not be read — ``controller.rbac.readableKinds``
names what may). Authentication off: AuthenticationEnabled False — the policy is not enforced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from kafka_eventing.controller.api import CustomObjects
from kafka_eventing.controller.host import Host, Kind, enqueue_object
from kafka_eventing.controller.policies import problem
from kafka_eventing.controller.reconciler import Reconciler, Result
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.conditions import Condition
from kafka_eventing.core.informer import Store

log = logging.getLogger(__name__)

POLICY_API = (ep.GROUP, ep.VERSION, ep.PLURAL)
#: Reads one object (group, version, plural, namespace, name); None when it does not exist.
Reader = Callable[[str, str, str, str, str], Mapping[str, Any] | None]


class SubjectError(Exception):
    """A ``from`` ref that cannot be resolved; the message says which and why."""


class EventPolicyReconciler:
    """Shares the channel ``Reconciler``'s API clients, leadership check and status writer."""

    def __init__(self, base: Reconciler, policies: Store, *, write_status: bool, read: Reader | None = None) -> None:
        self.base, self.settings, self.policies = base, base.settings, policies
        self.write_status = write_status
        self._custom = base.custom
        self._read = read or self._get

    def _get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return CustomObjects(self._custom, group, version, plural).get(namespace, name)

    def reconcile(self, namespace: str, name: str) -> Result:
        obj = self.policies.get(namespace, name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp") or not self.write_status:
            return Result()
        status, conditions = self.evaluate(obj)
        self.base.patch_status(obj, status, conditions, POLICY_API)
        return Result()

    def evaluate(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[Condition]]:
        """The policy's status fields and conditions (Ready last)."""
        meta = obj.get("metadata") or {}
        status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
        conditions = [Condition.true(ep.AUTHENTICATION_ENABLED) if self.settings.auth_issuer else Condition.false(
            ep.AUTHENTICATION_ENABLED, "OIDCAuthenticationDisabled",
            "ingress authentication is off (receiver.auth.enabled): senders have no identity, so nothing is enforced")]
        found = problem(obj)
        if found is not None:
            reason, message = found
            conditions.append(Condition.false(ep.SUBJECTS_RESOLVED, reason, message))
            status["from"] = None
        else:
            policy = ep.policy_from_resource(obj)
            try:
                subjects = [*policy.declared, *self._resolve(policy)]
                status["from"] = list(dict.fromkeys(subjects))
                conditions.append(Condition.true(ep.SUBJECTS_RESOLVED))
            except SubjectError as exc:
                status["from"] = None
                conditions.append(Condition.false(ep.SUBJECTS_RESOLVED, "SubjectsNotResolved", str(exc)))
        failing = next((c for c in conditions if not c.is_true), None)
        conditions.append(Condition.true(ep.READY) if failing is None else Condition.false(
            ep.READY, failing.reason, failing.message))
        return status, conditions

    def _resolve(self, policy: ep.Policy) -> list[str]:
        """The ServiceAccounts the ``from`` refs send as: Knative's ``status.auth.serviceAccountName(s)``."""
        out: list[str] = []
        for api_version, kind, namespace, name in policy.source_refs:
            group, _, version = api_version.rpartition("/")
            plural = kind.lower() + "s"  # every Knative source kind's plural
            where = f"{kind} {namespace}/{name}"
            if not version:
                raise SubjectError(f"spec.from ref {where} needs an apiVersion")
            try:
                obj = self._read(group, version, plural, namespace, name)
            except ApiException as exc:
                if exc.status == 403:
                    raise SubjectError(f"the controller may not read {where}: add {plural} of {group} to "
                                       "controller.rbac.readableKinds") from None
                raise
            if obj is None:
                raise SubjectError(f"spec.from ref {where} does not exist")
            auth = (obj.get("status") or {}).get("auth") or {}
            accounts = [*([auth["serviceAccountName"]] if auth.get("serviceAccountName") else []),
                        *(auth.get("serviceAccountNames") or ())]
            if not accounts:
                raise SubjectError(f"{where} reports no identity (status.auth.serviceAccountName): it sends "
                                   "without OIDC, or is not reconciled yet")
            out.extend(ep.service_account_subject(namespace, str(a)) for a in accounts)
        return out


def setup(host: Host) -> None:
    """Cache EventPolicies (Knative's CRD or the chart's): their own status, and the targets' (each target kind
    enqueues its objects on a policy's change, ``host.on_policies``)."""
    policies = host.informer(ep.KIND, host.base.custom.list_cluster_custom_object, group=ep.GROUP,
                             version=ep.VERSION, plural=ep.PLURAL)
    host.base.stores.policies = policies
    reconciler = EventPolicyReconciler(host.base, policies, write_status=host.settings.event_policy_status)
    host.reconciles(ep.KIND, reconciler.reconcile)
    host.on(ep.KIND, enqueue_object(host, ep.KIND))


KIND_POLICY = Kind(ep.KIND, "eventpolicies", ep.GROUP, ep.VERSION, frozenset({ep.PLURAL}), setup)
