"""EventPolicy (``eventing.knative.dev/v1alpha1``) facts every role shares: who may send to which KafkaChannel,
Broker or KafkaSink, and the cluster default where no policy applies.

Semantics are Knative's (``pkg/auth/verifier.go``), checked only when ingress authentication is on — a policy
names token subjects, so without tokens there is nothing to check (the controller says so on the policy):

- a policy applies to the targets of its own namespace that ``spec.to`` names (a ``ref`` by kind and name, or a
  ``selector`` by kind and labels); an empty ``to`` applies to every target of the namespace;
- a request is allowed when one applying policy names its token's subject in ``from`` (a ``sub`` — exact, or a
  prefix ending in ``*`` — a ServiceAccount ``ref``, or what a controller resolved into ``status.from``) and the
  event passes that policy's ``filters`` (all of them; the Trigger dialects, CESQL included);
- a policy that cannot be used as written (a field the receiver cannot read, filters that do not compile) applies
  to every target of its namespace and allows no one: a mistake closes, it never opens;
- where no policy applies, the default mode decides: ``allow-all`` (any valid token), ``allow-same-namespace``
  (tokens of ServiceAccounts in the target's namespace; Knative's default) or ``deny-all``.

The filters are kept as written here and compiled by the roles that evaluate them (``broker.filters``): core does
not depend on the filter engine.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GROUP = "eventing.knative.dev"
VERSION = "v1alpha1"
KIND = "EventPolicy"
PLURAL = "eventpolicies"
API_VERSION = f"{GROUP}/{VERSION}"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"

# EventPolicy conditions (Knative's).
READY = "Ready"
SUBJECTS_RESOLVED = "SubjectsResolved"
AUTHENTICATION_ENABLED = "AuthenticationEnabled"
#: the condition a target reports about the policies that apply to it (Knative's).
TARGET_POLICIES_READY = "EventPoliciesReady"

Labels = tuple[tuple[str, str], ...]


class DefaultMode(enum.StrEnum):
    """Knative's ``default-authorization-mode`` (``config-features``): what decides where no policy applies."""

    ALLOW_ALL = "allow-all"
    ALLOW_SAME_NAMESPACE = "allow-same-namespace"
    DENY_ALL = "deny-all"


class PolicySpecError(ValueError):
    """An EventPolicy that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Target:
    """An addressable a policy may name: its API group, kind, namespace, name and labels."""

    group: str
    kind: str
    namespace: str
    name: str
    labels: Labels = ()


@dataclass(frozen=True)
class Selector:
    """``to[].selector``: a kind (group + kind; empty: any) and a label selector."""

    group: str
    kind: str
    match_labels: Labels = ()
    #: (key, operator, values): In, NotIn, Exists, DoesNotExist.
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, target: Target) -> bool:
        if self.kind and (self.kind.lower(), self.group) != (target.kind.lower(), target.group):
            return False
        labels = dict(target.labels)
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for key, op, values in self.match_expressions:
            present = key in labels
            if ((op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels[key] in values)
                    or (op == "Exists" and not present) or (op == "DoesNotExist" and present)):
                return False
        return True


@dataclass(frozen=True)
class Policy:
    namespace: str
    name: str
    #: (group, kind lower-case, name) of each ``to[].ref``.
    to_refs: tuple[tuple[str, str, str], ...] = ()
    to_selectors: tuple[Selector, ...] = ()
    #: subject patterns: ``sub`` values, ServiceAccount refs and ``status.from``.
    subjects: tuple[str, ...] = ()
    #: ``from[].ref`` entries that are not ServiceAccounts (``(apiVersion, kind, namespace, name)``): a controller
    #: resolves them into ``status.from``; until it has, they allow no one.
    source_refs: tuple[tuple[str, str, str, str], ...] = ()
    #: ``spec.filters`` as written (compiled where evaluated).
    filters: tuple[Mapping[str, Any], ...] = ()
    generation: int = 0
    #: ``status.from`` as read (the subjects a controller resolved).
    resolved: tuple[str, ...] = field(default=(), compare=False)
    #: the subjects the spec names itself (``sub`` values and ServiceAccount refs), without ``status.from``.
    declared: tuple[str, ...] = field(default=(), compare=False)
    #: why the policy cannot be used as written ("" when it can): such a policy applies to every target of its
    #: namespace and allows no one — a mistake in a policy closes, it never opens.
    problem: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def applies_to(self, target: Target) -> bool:
        if target.namespace != self.namespace:
            return False
        if self.problem or (not self.to_refs and not self.to_selectors):
            return True
        if (target.group, target.kind.lower(), target.name) in self.to_refs:
            return True
        return any(s.matches(target) for s in self.to_selectors)

    def allows_subject(self, subject: str) -> bool:
        return not self.problem and any(subject_matches(pattern, subject) for pattern in self.subjects)


def subject_matches(pattern: str, subject: str) -> bool:
    """Knative's ``SubjectContained``: equal, or a pattern ending in ``*`` whose prefix the subject starts with."""
    if pattern.endswith("*"):
        return subject.startswith(pattern[:-1])
    return pattern == subject


def service_account_subject(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def group_of(api_version: str) -> str:
    """``eventing.knative.dev/v1`` → ``eventing.knative.dev``; ``v1`` (the core group) → ``""``."""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def _labels(value: object, where: str) -> Labels:
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise PolicySpecError(f"{where}: must map label names to strings")
    return tuple(sorted((str(k), v) for k, v in value.items()))


def _selector(value: Mapping[str, Any], where: str) -> Selector:
    expressions = []
    for i, expr in enumerate(value.get("matchExpressions") or ()):
        op, values = expr.get("operator"), tuple(str(v) for v in expr.get("values") or ())
        if op not in ("In", "NotIn", "Exists", "DoesNotExist") or not expr.get("key"):
            raise PolicySpecError(f"{where}.matchExpressions[{i}]: needs a key and an operator of In, NotIn, "
                                  f"Exists, DoesNotExist (got {op!r})")
        if (op in ("In", "NotIn")) != bool(values):
            raise PolicySpecError(f"{where}.matchExpressions[{i}]: {op} "
                                  + ("needs values" if op in ("In", "NotIn") else "takes no values"))
        expressions.append((str(expr["key"]), str(op), values))
    return Selector(group=group_of(str(value.get("apiVersion") or "")), kind=str(value.get("kind") or ""),
                    match_labels=_labels(value.get("matchLabels"), f"{where}.matchLabels"),
                    match_expressions=tuple(expressions))


def policy_from_resource(obj: Mapping[str, Any]) -> Policy:
    """An EventPolicy object (as the API returns it, or read from YAML) → ``Policy``; ``PolicySpecError`` names
    the field that cannot be used."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    spec: Mapping[str, Any] = obj.get("spec") or {}
    status: Mapping[str, Any] = obj.get("status") or {}
    where = f"EventPolicy {namespace}/{name}"
    refs, selectors = [], []
    for i, to in enumerate(spec.get("to") or ()):
        if to.get("ref"):
            ref = to["ref"]
            if not ref.get("kind") or not ref.get("name"):
                raise PolicySpecError(f"{where}: spec.to[{i}].ref needs kind and name")
            refs.append((group_of(str(ref.get("apiVersion") or "")), str(ref["kind"]).lower(), str(ref["name"])))
        elif to.get("selector") is not None:
            selectors.append(_selector(to["selector"], f"{where}: spec.to[{i}].selector"))
        else:
            raise PolicySpecError(f"{where}: spec.to[{i}] needs a ref or a selector")
    subjects: list[str] = []
    sources: list[tuple[str, str, str, str]] = []
    for i, entry in enumerate(spec.get("from") or ()):
        if entry.get("sub"):
            subjects.append(str(entry["sub"]))
        elif entry.get("ref"):
            ref = entry["ref"]
            if not ref.get("kind") or not ref.get("name"):
                raise PolicySpecError(f"{where}: spec.from[{i}].ref needs kind and name")
            ref_ns = str(ref.get("namespace") or namespace)
            api_version = str(ref.get("apiVersion") or "")
            if str(ref["kind"]) == "ServiceAccount" and group_of(api_version) == "":
                subjects.append(service_account_subject(ref_ns, str(ref["name"])))
            else:
                sources.append((api_version, str(ref["kind"]), ref_ns, str(ref["name"])))
        else:
            raise PolicySpecError(f"{where}: spec.from[{i}] needs a sub or a ref")
    filters = spec.get("filters") or ()
    if not isinstance(filters, Sequence) or not all(isinstance(f, Mapping) for f in filters):
        raise PolicySpecError(f"{where}: spec.filters must be a list of filter objects")
    resolved = tuple(str(s) for s in status.get("from") or ())
    # What a controller resolved from the source refs counts too (Knative's controller writes the sub patterns
    # and the refs' identities there).
    merged = tuple(dict.fromkeys([*subjects, *resolved]))
    return Policy(namespace=namespace, name=name, to_refs=tuple(refs), to_selectors=tuple(selectors),
                  subjects=merged, source_refs=tuple(sources), filters=tuple(filters),
                  generation=int(meta.get("generation") or 0), resolved=resolved, declared=tuple(subjects))


def policy_or_invalid(obj: Mapping[str, Any]) -> Policy:
    """``policy_from_resource``, or — for a policy that cannot be used — one that applies to its whole namespace
    and allows no one, carrying the reason."""
    try:
        return policy_from_resource(obj)
    except PolicySpecError as exc:
        meta = obj.get("metadata") or {}
        return Policy(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or ""),
                      generation=int(meta.get("generation") or 0), problem=str(exc))


def applying(policies: Iterable[Policy], target: Target) -> list[Policy]:
    """The policies that apply to ``target``, by name (what its ``status.policies`` lists)."""
    return sorted((p for p in policies if p.applies_to(target)), key=lambda p: p.name)


def default_allows(mode: DefaultMode, subject: str, namespace: str) -> bool:
    """Where no policy applies: Knative's default modes."""
    if mode is DefaultMode.DENY_ALL:
        return False
    if mode is DefaultMode.ALLOW_SAME_NAMESPACE:
        return subject.startswith(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:")
    return True


def parse_documents(docs: Iterable[Any]) -> dict[tuple[str, str], Policy]:
    """The EventPolicies among YAML documents (standalone mode: no controller, so ``status.from`` is as written)."""
    out: dict[tuple[str, str], Policy] = {}
    for doc in docs:
        if not doc:
            continue
        for item in doc.get("items", []) if doc.get("kind") == "List" else [doc]:
            if item.get("kind") == KIND and group_of(str(item.get("apiVersion") or "")) == GROUP:
                policy = policy_or_invalid(item)
                out[policy.key] = policy
    return out

