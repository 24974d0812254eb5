"""The receiver's termination grace period outlasts gunicorn's graceful timeout."""

from __future__ import annotations

import os

from kafka_eventing.core.settings import Settings

from .render import (
    CHART,
    PRESETS,
    RELEASE,
    helm,
    kustomize,
    one,
    pod_spec,
    run,
    scenario,
    tool,
)


def test_receiver_grace_period_outlasts_gunicorns_graceful_timeout() -> None:
    from kafka_eventing.receiver import gunicorn_conf

    # gunicorn's graceful timeout with the default produce timeout (the ConfigMap does not override it).
    graceful = int(Settings().produce_timeout_seconds * 2 + 5)
    assert graceful == 25
    assert "KE_PRODUCE_TIMEOUT_SECONDS" not in one(helm(), "ConfigMap", "kafka-eventing-config")["data"]
    if "KE_PRODUCE_TIMEOUT_SECONDS" not in os.environ:
        assert gunicorn_conf.graceful_timeout == graceful
    for docs in [helm(), *(scenario(n) for n in PRESETS)]:
        grace = pod_spec(one(docs, "Deployment", "kafka-eventing-receiver"))["terminationGracePeriodSeconds"]
        assert grace == 30 and grace > graceful
    for overlay in PRESETS.values():
        assert pod_spec(one(kustomize(overlay), "Deployment", "kafka-eventing-receiver"))[
            "terminationGracePeriodSeconds"] == 30
    docs = helm(sets=("receiver.terminationGracePeriodSeconds=45",))
    assert pod_spec(one(docs, "Deployment", "kafka-eventing-receiver"))["terminationGracePeriodSeconds"] == 45
    # A grace period the receiver cannot finish in is refused at install.
    proc = run([tool("helm"), "template", RELEASE, str(CHART), "--set", "receiver.terminationGracePeriodSeconds=20"],
               ok=False)
    assert proc.returncode != 0 and "terminationGracePeriodSeconds" in proc.stderr
