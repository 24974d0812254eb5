"""Receiver HTTPS (``receiver.tls``): the certificate Secret mounted read-only into the receiver pods, HTTPS-only
ports and probes, the controller told the CA (so it publishes ``https://`` addresses with ``CACerts``), the
cert-manager ``Certificate`` when asked, restricted Pod Security kept; and none of it when off."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_eventing.core.settings import Settings

from .render import (
    CHART,
    NAMESPACE,
    OPTIONAL_APIS,
    RELEASE,
    container_env,
    helm,
    of_kind,
    one,
    restricted_violations,
    run,
    tool,
    validate,
)

RECEIVER = f"{RELEASE}-receiver"
CONTROLLER = f"{RELEASE}-controller"
SECRET = f"{RELEASE}-receiver-tls"
ON = ("receiver.tls.enabled=true",)
OPTINS = (*ON, "networkPolicy.enabled=true", "metrics.serviceMonitor.enabled=true")
CERT_MANAGER = (*ON, "receiver.tls.certManager.enabled=true", "receiver.tls.certManager.issuerRef.name=ca",
                "receiver.tls.certManager.issuerRef.kind=ClusterIssuer",
                "receiver.tls.extraDnsNames[0]=*.team-a.svc.cluster.local")


def pod(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def test_off_by_default_plain_http_everywhere() -> None:
    docs = helm(apis=OPTIONAL_APIS)
    assert not of_kind(docs, "Certificate")
    spec = pod(docs, RECEIVER)
    (c,) = spec["containers"]
    assert [p["name"] for p in c["ports"]] == ["http"] and c["ports"][0]["containerPort"] == 8080
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert not any(v.get("secret", {}).get("secretName") == SECRET for v in spec["volumes"])
    settings = Settings.from_env(container_env(docs, RECEIVER))
    assert settings.tls_cert_file is None and settings.tls_key_file is None
    assert Settings.from_env(container_env(docs, CONTROLLER)).ingress_ca_file is None
    for svc in of_kind(docs, "Service"):
        if svc["metadata"]["name"] in ("kafka-channel-receiver", "kafka-sink-ingress"):
            assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("http", 80)]


def test_on_the_receiver_serves_https_from_the_mounted_secret() -> None:
    docs = helm(sets=OPTINS, apis=OPTIONAL_APIS)
    spec = pod(docs, RECEIVER)
    (c,) = spec["containers"]
    env = container_env(docs, RECEIVER)
    settings = Settings.from_env(env)
    # The files the receiver loads are the Secret's, in a read-only whole-directory mount (a subPath mount would
    # never see a rotated Secret).
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True and "subPath" not in mount
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    assert str(settings.tls_cert_file) == mount["mountPath"] + "/tls.crt"
    assert str(settings.tls_key_file) == mount["mountPath"] + "/tls.key"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == SECRET
    assert {i["key"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    # HTTPS only: one port, which gunicorn binds (PORT), probed over HTTPS.
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("https", int(env["PORT"]))]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "https" and c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert restricted_violations(spec) == []
    # Both receiver Services answer on 443, the port of an https:// address without one.
    for name in ("kafka-channel-receiver", "kafka-sink-ingress"):
        ports = one(docs, "Service", name)["spec"]["ports"]
        assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [("https", 443, "https")], name
    netpol = one(docs, "NetworkPolicy", RECEIVER)
    assert [p["port"] for r in netpol["spec"]["ingress"] for p in r["ports"]] == ["https"]
    monitor = one(docs, "ServiceMonitor", RECEIVER)["spec"]["endpoints"][0]
    assert monitor["port"] == "https" and monitor["scheme"] == "https"
    assert monitor["tlsConfig"]["ca"]["secret"] == {"name": SECRET, "key": "ca.crt"}
    for d in docs:
        if d["kind"] in ("Deployment", "Service", "NetworkPolicy"):
            validate(d)


def test_on_the_controller_publishes_https_addresses_with_the_secrets_ca() -> None:
    docs = helm(sets=ON)
    spec = pod(docs, CONTROLLER)
    (c,) = spec["containers"]
    ca_file = Settings.from_env(container_env(docs, CONTROLLER)).ingress_ca_file
    assert ca_file is not None
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "receiver-ca"]
    assert mount["readOnly"] is True and "subPath" not in mount and str(ca_file.parent) == mount["mountPath"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "receiver-ca"]
    # The CA only: the controller never gets the receiver's private key.
    assert volume["secret"] == {"secretName": SECRET, "items": [{"key": "ca.crt", "path": ca_file.name}]}
    assert restricted_violations(spec) == []
    # No other role is told the CA or the key: dispatchers learn the CA from each address's CACerts.
    config = {k for cm in of_kind(docs, "ConfigMap") for k in cm.get("data", {})}
    assert not config & {"KE_INGRESS_CA_FILE", "KE_TLS_CERT_FILE", "KE_TLS_KEY_FILE"}


def test_an_existing_secret_is_used_as_named() -> None:
    docs = helm(sets=(*ON, "receiver.tls.secretName=my-receiver-cert"))
    assert not of_kind(docs, "Certificate")
    for name, volume in ((RECEIVER, "tls"), (CONTROLLER, "receiver-ca")):
        (v,) = [v for v in pod(docs, name)["volumes"] if v["name"] == volume]
        assert v["secret"]["secretName"] == "my-receiver-cert", name


def test_helm_test_verifies_the_receiver_with_its_ca() -> None:
    docs = helm(sets=ON)
    test_pod = one(docs, "Pod", f"{RELEASE}-test-send-event")
    (c,) = test_pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RECEIVER_URL"] == f"https://kafka-channel-receiver.{NAMESPACE}.svc:443/"
    assert "--cacert /etc/receiver-ca/ca.crt" in c["command"][-1]
    assert c["volumeMounts"] == [{"name": "receiver-ca", "mountPath": "/etc/receiver-ca", "readOnly": True}]
    assert restricted_violations(test_pod["spec"]) == []


def test_helm_test_sends_a_token_for_its_channel_when_auth_is_on() -> None:
    docs = helm(sets=(*ON, "receiver.auth.enabled=true"))
    test_pod = one(docs, "Pod", f"{RELEASE}-test-send-event")
    (c,) = test_pod["spec"]["containers"]
    assert 'Authorization: Bearer $(cat /var/run/secrets/tokens/receiver)' in c["command"][-1]
    env = {e["name"]: e["value"] for e in c["env"]}
    channel = env["CHANNEL_HOST"].split("-kn-channel.")[0]
    (token,) = [v for v in test_pod["spec"]["volumes"] if v["name"] == "token"]
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == f"messaging.knative.dev/kafkachannel/{NAMESPACE}/{channel}"
    assert {"name": "token", "mountPath": "/var/run/secrets/tokens", "readOnly": True} in c["volumeMounts"]
    assert test_pod["spec"]["automountServiceAccountToken"] is False  # only the audience-scoped token
    assert restricted_violations(test_pod["spec"]) == []
    plain = one(helm(), "Pod", f"{RELEASE}-test-send-event")
    assert "Authorization" not in plain["spec"]["containers"][0]["command"][-1] and "volumes" not in plain["spec"]


def test_cert_manager_certificate_names_every_receiver_host() -> None:
    docs = helm(sets=CERT_MANAGER)
    (cert,) = of_kind(docs, "Certificate")
    assert cert["apiVersion"] == "cert-manager.io/v1"
    spec = cert["spec"]
    assert spec["secretName"] == SECRET  # what the pods mount
    assert spec["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert spec["dnsNames"] == [
        f"kafka-channel-receiver.{NAMESPACE}.svc", f"kafka-channel-receiver.{NAMESPACE}.svc.cluster.local",
        f"kafka-sink-ingress.{NAMESPACE}.svc", f"kafka-sink-ingress.{NAMESPACE}.svc.cluster.local",
        "*.team-a.svc.cluster.local"]
    assert spec["usages"][0] == "server auth"
    assert spec["privateKey"] == {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}
    assert spec["duration"] == "2160h" and spec["renewBefore"] == "360h"


def test_cert_manager_alone_does_not_turn_tls_on() -> None:
    docs = helm(sets=("receiver.tls.certManager.enabled=true", "receiver.tls.certManager.issuerRef.name=ca"))
    assert not of_kind(docs, "Certificate")
    assert Settings.from_env(container_env(docs, CONTROLLER)).ingress_ca_file is None


@pytest.mark.parametrize(("sets", "message"), [
    ((*ON, "receiver.tls.certManager.enabled=true"), "issuerRef.name"),
    ((*ON, "receiver.tls.secretName=Not_A_Name"), "secretName"),
    ((*ON, "receiver.tls.certManager.enabled=true", "receiver.tls.certManager.issuerRef.name=ca",
      "receiver.tls.certManager.duration=90d"), "duration"),
    ((*ON, "receiver.tls.certManager.privateKey.algorithm=DSA"), "algorithm"),
    (("receiver.tls.enable=true",), "enable"),
])
def test_bad_tls_values_fail_at_install(sets: tuple[str, ...], message: str) -> None:
    args = [tool("helm"), "template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run(args, ok=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
