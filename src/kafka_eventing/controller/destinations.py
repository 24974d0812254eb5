"""Resolve a Knative Destination (``{ref, uri, audience, CACerts}``) to an address: a core Service by its cluster DNS
name, any other Addressable (a Knative Service, a Broker, a channel) by its ``status.address`` — its url, and the
audience and CA certificates it publishes unless the destination sets its own (Knative's resolver)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
#: the chart value that lists what the controller may read (rendered into its ClusterRole)
READABLE_KINDS_VALUE = "controller.rbac.readableKinds"


class Unresolved(Exception):
    """``reason`` for a condition; the message says which object and why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def not_readable(kind: str, api_version: str) -> str:
    """What to grant when a read of ``kind`` is forbidden: the chart value's entry and the RBAC rule it renders."""
    group, _, _ = api_version.rpartition("/")
    plural = f"{kind.lower()}s"
    return (f"the controller may not read {plural}.{group or 'core'}: add {plural} under {group or '(core)'} in the "
            f"chart value {READABLE_KINDS_VALUE} (ClusterRole rule apiGroups: [\"{group}\"], resources: [{plural}], "
            "verbs: [get, list, watch])")


@dataclass(frozen=True)
class Address:
    url: str
    #: the audience a token for it must name (the destination's ``audience``, else the ref's published one)
    audience: str | None = None
    #: PEM CA certificates it is verified with (the destination's ``CACerts``, else the ref's ``CACerts``)
    ca_certs: str | None = None


def resolve_destination(core: client.CoreV1Api, custom: client.CustomObjectsApi, destination: Mapping[str, Any],
                        default_namespace: str, what: str = "destination") -> str:
    return resolve_address(core, custom, destination, default_namespace, what).url


def resolve_address(core: client.CoreV1Api, custom: client.CustomObjectsApi, destination: Mapping[str, Any],
                    default_namespace: str, what: str = "destination") -> Address:
    uri, target = destination.get("uri"), destination.get("ref")
    audience, ca_certs = destination.get("audience") or None, destination.get("CACerts") or None
    if not target:
        if not uri:
            raise Unresolved("DestinationMissing", f"{what} sets neither ref nor uri")
        return Address(str(uri), audience, ca_certs)
    kind, name = target.get("kind"), target.get("name")
    namespace = target.get("namespace") or default_namespace
    api_version = str(target.get("apiVersion") or "v1")
    if not kind or not name:
        raise Unresolved("DestinationInvalid", f"{what} ref needs kind and name")
    try:
        if kind == "Service" and api_version == "v1":
            core.read_namespaced_service(name, namespace, _request_timeout=(5, 15))
            base = f"http://{name}.{namespace}.svc.cluster.local"
        else:
            group, _, version = api_version.rpartition("/")
            plural = f"{str(kind).lower()}s"
            obj = custom.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                      _request_timeout=(5, 15))
            address = (obj.get("status") or {}).get("address") or {}
            found = address.get("url")
            audience = audience or address.get("audience") or None
            ca_certs = ca_certs or address.get("CACerts") or None
            if not found:
                raise Unresolved("DestinationNotAddressable",
                                 f"{what} {kind} {namespace}/{name} has no status.address.url yet")
            base = str(found)
    except ApiException as exc:
        ref = f"{what} {kind} ({api_version}) {namespace}/{name}"
        if exc.status == HTTP_FORBIDDEN:
            hint = not_readable(str(kind), api_version)
            raise Unresolved("DestinationForbidden", f"{ref} cannot be read: {hint}") from None
        why = "does not exist" if exc.status == HTTP_NOT_FOUND else f"cannot be read ({exc.status} {exc.reason})"
        raise Unresolved("DestinationNotFound", f"{ref} {why}") from None
    if uri:
        base = base.rstrip("/") + "/" + str(uri).lstrip("/")
    return Address(base, audience, ca_certs)
