"""KEDA objects for one dispatcher: a ScaledObject scaling it on its consumer groups' lag, and the
TriggerAuthentication that hands KEDA's kafka scaler the dispatcher's own connection Secret — for a
KafkaChannel's dispatcher (``dispatcher.keda.*`` of config-kafka) and a KafkaSource's (its autoscaling
annotations, the Secret keys its ``net`` names).

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
from kafka_eventing.core import kafkasources as ks
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


def _keda_object(kind: str, name: str, settings: Settings, owner: tuple[str, str],
                 spec: dict[str, Any]) -> dict[str, Any]:
    """``owner``: (annotation, "<namespace>/<name>") naming the resource the dispatcher serves."""
    metadata = {"name": name, "namespace": settings.system_namespace, "labels": res.labels("dispatcher", name),
                "annotations": {owner[0]: owner[1]}}
    return res.stamp({"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata, "spec": spec}, spec)


def _trigger_authentication(name: str, settings: Settings, owner: tuple[str, str], auth: KedaAuth) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if auth.secret_refs:
        spec["secretTargetRef"] = [dict(r) for r in auth.secret_refs]
    if auth.pod_identity is not None:
        spec["podIdentity"] = dict(auth.pod_identity)
    return _keda_object("TriggerAuthentication", name, settings, owner, spec)


def _scaled_object(name: str, settings: Settings, owner: tuple[str, str], auth: KedaAuth, *,
                   triggers: Sequence[Mapping[str, str]], bounds: tuple[int, int], polling_interval: int,
                   cooldown_period: int) -> dict[str, Any]:
    """One ``kafka`` trigger per metadata given: the HPA scales on the most-lagging one."""
    out = []
    for metadata in triggers:
        trigger: dict[str, Any] = {"type": "kafka", "metadata": {**metadata, **auth.metadata}}
        if auth.needs_trigger_authentication:
            trigger["authenticationRef"] = {"name": name}
        out.append(trigger)
    spec = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicaCount": bounds[0],
        "maxReplicaCount": bounds[1],
        "pollingInterval": polling_interval,
        "cooldownPeriod": cooldown_period,
        "triggers": out,
    }
    return _keda_object("ScaledObject", name, settings, owner, spec)


def trigger_authentication(ref: res.ChannelRef, settings: Settings, auth: KedaAuth) -> dict[str, Any]:
    name = res.dispatcher_name(ref.namespace, ref.name)
    return _trigger_authentication(name, settings, (res.ANNOTATION_CHANNEL, ref.key), auth)


def scaled_object(ref: res.ChannelRef, settings: Settings, connection: ResolvedConnection, auth: KedaAuth, *,
                  topic: str, subscribers: Sequence[str], num_partitions: int) -> dict[str, Any]:
    """One ``kafka`` trigger per subscription: the HPA scales on the most-lagging consumer group."""
    name = res.dispatcher_name(ref.namespace, ref.name)
    config = connection.keda
    triggers = [{"bootstrapServers": str(connection.connection.config["bootstrap.servers"]),
                 "consumerGroup": settings.consumer_group_for(ref.namespace, ref.name, uid),
                 "topic": topic, "lagThreshold": str(config.lag_threshold)} for uid in subscribers]
    return _scaled_object(name, settings, (res.ANNOTATION_CHANNEL, ref.key), auth, triggers=triggers,
                          bounds=replica_bounds(config, num_partitions), polling_interval=config.polling_interval,
                          cooldown_period=config.cooldown_period)


# -- KafkaSources ---------------------------------------------------------------------------------------------
def source_auth(spec: ks.SourceSpec, mechanism: str | None, secret: str) -> KedaAuth:
    """KEDA's view of the source's ``net``: ``mechanism`` is the value of ``net.sasl.type`` (PLAIN when unset);
    every credential is read from ``secret``, the system namespace's copy of the source's keys (beside the
    ScaledObject; ``resources.secret_copy_name``), under the file names the dispatcher reads."""
    metadata = {"tls": "enable" if spec.tls is not None else "disable"}
    refs: list[tuple[str, str, ks.SecretKeyRef | None]] = []
    if spec.sasl is not None:
        metadata["sasl"] = SASL_MODES[(mechanism or "PLAIN").strip().upper()]
        refs += [("username", "user", spec.sasl.user), ("password", "password", spec.sasl.password)]
    if spec.tls is not None:
        refs += [("ca", "ca.crt", spec.tls.ca_cert), ("cert", "user.crt", spec.tls.cert),
                 ("key", "user.key", spec.tls.key)]
    return KedaAuth(metadata=metadata, secret_refs=[{"parameter": p, "name": secret, "key": key}
                                                    for p, key, r in refs if r is not None])


def source_bounds(scaling: ks.Autoscaling, num_partitions: int) -> tuple[int, int]:
    return replica_bounds(KedaConfig(enabled=True, min_replicas=scaling.min_replicas,
                                     max_replicas=scaling.max_replicas), num_partitions)


def source_scaled_object(spec: ks.SourceSpec, scaling: ks.Autoscaling, settings: Settings, auth: KedaAuth, *,
                         name: str, owner: tuple[str, str], num_partitions: int) -> dict[str, Any]:
    """One ``kafka`` trigger per topic (KEDA's scaler reads one topic each) on the source's consumer group.
    ``offsetResetPolicy`` is the source's ``initialOffset``, so KEDA counts the lag of a partition without a
    commit as the dispatcher will read it."""
    triggers = [{"bootstrapServers": ",".join(spec.bootstrap_servers), "consumerGroup": spec.consumer_group,
                 "topic": topic, "lagThreshold": str(scaling.lag_threshold),
                 "activationLagThreshold": str(scaling.activation_lag_threshold),
                 "offsetResetPolicy": spec.initial_offset} for topic in spec.topics]
    return _scaled_object(name, settings, owner, auth, triggers=triggers,
                          bounds=source_bounds(scaling, num_partitions), polling_interval=scaling.polling_interval,
                          cooldown_period=scaling.cooldown_period)


def source_trigger_authentication(name: str, settings: Settings, owner: tuple[str, str],
                                  auth: KedaAuth) -> dict[str, Any]:
    return _trigger_authentication(name, settings, owner, auth)
