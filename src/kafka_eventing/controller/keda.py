"""KEDA objects for one dispatcher: a ScaledObject scaling it on its consumer groups' lag, and the
TriggerAuthentication that hands KEDA's kafka scaler the dispatcher's own connection Secret.

Pure functions, like ``resources``. KEDA reads Secret keys verbatim, so only keys whose *values* already have
KEDA's format are referenced from the Secret (credentials and PEMs); the settings whose values differ in format
(``protocol`` → ``tls``, ``sasl.mechanism`` → ``sasl``) are derived from the resolved connection and written into
the trigger metadata, which KEDA's kafka scaler reads before the auth parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka_eventing.controller import resources as res
from kafka_eventing.controller.connection import KedaConfig, ResolvedConnection
from kafka_eventing.core.settings import Settings

GROUP = "keda.sh"
VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
TRIGGER_AUTHENTICATIONS = "triggerauthentications"

#: Our ``sasl.mechanism`` → KEDA's ``sasl`` mode.
SASL_MODES = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512",
              "OAUTHBEARER": "oauthbearer"}
#: KEDA auth parameter → our Secret keys that hold its value, first present wins (both Secret formats).
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "username": ("user", "username"),
    "password": ("password",),
    "ca": ("ca.crt",),
    "cert": ("user.crt",),
    "key": ("user.key",),
}


class KedaAuthError(ValueError):
    """The connection cannot be expressed as KEDA auth; the message says what to add to the Secret."""


@dataclass(frozen=True)
class KedaAuth:
    """Trigger metadata derived from the connection, plus what the TriggerAuthentication carries."""

    metadata: Mapping[str, str]
    secret_refs: Sequence[Mapping[str, str]] = ()  # [{parameter, name, key}]
    pod_identity: Mapping[str, str] | None = None

    @property
    def needs_trigger_authentication(self) -> bool:
        return bool(self.secret_refs) or self.pod_identity is not None


def keda_auth(connection: ResolvedConnection) -> KedaAuth:
    """Map the dispatcher's connection to KEDA's kafka scaler parameters. Raises ``KedaAuthError``."""
    cfg = connection.connection.config
    protocol = str(cfg.get("security.protocol", "PLAINTEXT"))
    metadata = {"tls": "enable" if protocol.endswith("SSL") else "disable"}
    wanted: list[str] = []
    pod_identity: dict[str, str] | None = None
    if protocol.startswith("SASL"):
        mechanism = str(cfg.get("sasl.mechanism", "PLAIN"))
        metadata["sasl"] = SASL_MODES[mechanism]
        if mechanism == "OAUTHBEARER":
            # AWS MSK IAM (the only OAUTHBEARER we support): KEDA signs tokens with its own AWS identity.
            if not connection.aws_region:
                raise KedaAuthError("AWS MSK IAM under KEDA needs the region in the connection Secret (`aws.region`)")
            metadata.update({"saslTokenProvider": "aws_msk_iam", "awsRegion": connection.aws_region})
            pod_identity = {"provider": "aws"}
        else:
            wanted += ["username", "password"]
    if protocol.endswith("SSL"):
        # Without `ca.crt` both we and KEDA trust the system's public CAs.
        wanted += ["ca", "cert", "key"]
    refs: list[dict[str, str]] = []
    for parameter in wanted:
        key = next((k for k in SECRET_KEYS[parameter] if k in connection.secret_keys), None)
        if key is None:
            if parameter in ("username", "password"):
                # A provider preset may supply the user (Event Hubs' `$ConnectionString`); KEDA reads it only
                # from a Secret, and the controller does not write Secrets.
                raise KedaAuthError(f"KEDA's kafka scaler needs `{SECRET_KEYS[parameter][0]}` in the connection "
                                    f"Secret {connection.secret_name or '(none)'}")
            continue
        refs.append({"parameter": parameter, "name": str(connection.secret_name), "key": key})
    return KedaAuth(metadata=metadata, secret_refs=refs, pod_identity=pod_identity)


def replica_bounds(config: KedaConfig, num_partitions: int) -> tuple[int, int]:
    """(min, max): max is capped at the partition count — consumers beyond it idle in the group."""
    most = max(1, min(config.max_replicas, num_partitions))
    return min(config.min_replicas, most), most


def subscriber_uids(spec: Mapping[str, Any]) -> list[str]:
    return sorted({str(s["uid"]) for s in spec.get("subscribers") or () if isinstance(s, Mapping) and s.get("uid")})


def trigger_authentication(ref: res.ChannelRef, settings: Settings, auth: KedaAuth) -> dict[str, Any]:
    name = res.dispatcher_name(ref.namespace, ref.name)
    spec: dict[str, Any] = {}
    if auth.secret_refs:
        spec["secretTargetRef"] = [dict(r) for r in auth.secret_refs]
    if auth.pod_identity is not None:
        spec["podIdentity"] = dict(auth.pod_identity)
    metadata = {"name": name, "namespace": settings.system_namespace, "labels": res.labels("dispatcher", name),
                "annotations": {res.ANNOTATION_CHANNEL: ref.key}}
    return res.stamp({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TriggerAuthentication",
                       "metadata": metadata, "spec": spec}, spec)


def scaled_object(ref: res.ChannelRef, settings: Settings, connection: ResolvedConnection, auth: KedaAuth, *,
                  topic: str, subscribers: Sequence[str], num_partitions: int) -> dict[str, Any]:
    """One ``kafka`` trigger per subscription: the HPA scales on the most-lagging consumer group."""
    name = res.dispatcher_name(ref.namespace, ref.name)
    config = connection.keda
    low, high = replica_bounds(config, num_partitions)
    triggers = []
    for uid in subscribers:
        trigger: dict[str, Any] = {"type": "kafka", "metadata": {
            "bootstrapServers": str(connection.connection.config["bootstrap.servers"]),
            "consumerGroup": settings.consumer_group_for(ref.namespace, ref.name, uid),
            "topic": topic,
            "lagThreshold": str(config.lag_threshold),
            **auth.metadata,
        }}
        if auth.needs_trigger_authentication:
            trigger["authenticationRef"] = {"name": name}
        triggers.append(trigger)
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": low,
        "maxReplicaCount": high,
        "pollingInterval": config.polling_interval,
        "cooldownPeriod": config.cooldown_period,
        "triggers": triggers,
    }
    metadata = {"name": name, "namespace": settings.system_namespace, "labels": res.labels("dispatcher", name),
                "annotations": {res.ANNOTATION_CHANNEL: ref.key}}
    return res.stamp({"apiVersion": f"{GROUP}/{VERSION}", "kind": "ScaledObject",
                       "metadata": metadata, "spec": spec}, spec)
