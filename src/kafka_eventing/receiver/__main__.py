"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with uvicorn workers running the app.

The shared ingress of every KafkaChannel (``POST /<namespace>/<channel>``, or any path with the Host
``<channel>-kn-channel.<namespace>.svc...``), every Kafka Broker (``POST /<namespace>/<broker>``) and every
KafkaSink (``POST /<namespace>/<sink>`` on the sink ingress Service): 202 once Kafka holds the event. With
KE_AUTH_ISSUER it verifies each sender's token and enforces EventPolicies (eventing.knative.dev/v1alpha1, read
when served) and KE_AUTH_DEFAULT_MODE. They come
from KE_CHANNEL_SOURCE: kube (the API server: KE_KUBECONFIG or KUBECONFIG outside a cluster) or file
(KE_CHANNELS_FILE); Kafka from KE_BOOTSTRAP_SERVERS, KE_KAFKA_SECRET_DIR, KE_KAFKA_PROVIDER; every KE_* variable:
docs/settings.md.

Flags go to gunicorn unchanged (e.g. ``--bind 127.0.0.1:8080 --workers 1``; ``python -m gunicorn --help`` lists
them) and override the config module.
"""

from __future__ import annotations

import os
import sys

APP = "kafka_eventing.receiver.app:get_app()"
WORKER = "kafka_eventing.receiver.server.ReceiverWorker"  # uvicorn, with deadlines for slow clients


def command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", "python:kafka_eventing.receiver.gunicorn_conf",
            "-k", WORKER, *argv, APP]


#: What ``--help`` says before gunicorn's own flags.
ABOUT = """kafka-eventing receiver: the shared ingress of KafkaChannels, Kafka Brokers and KafkaSinks.

POST a CloudEvent to a channel (Host <name>-kn-channel.<namespace>.svc, or path /<namespace>/<name>), a Broker
(path /<namespace>/<name> on the receiver Service) or a KafkaSink (path /<namespace>/<name> on the sink ingress
Service, KE_SINK_SERVICE); 202 once Kafka holds it, on the cluster the target names. With KE_AUTH_ISSUER a
sender needs a token for the target's audience, and an EventPolicy (eventing.knative.dev/v1alpha1) or the default
mode KE_AUTH_DEFAULT_MODE that allows it (else 401/403). Targets come from
KE_CHANNEL_SOURCE: kube (the API server: KE_KUBECONFIG or KUBECONFIG outside a cluster) or file (KE_CHANNELS_FILE).
Settings are KE_* environment variables (every one: docs/settings.md); the flags below are gunicorn's.
"""


def preflight() -> None:
    """Settings and the API server checked before gunicorn starts: a worker that fails to boot exits with a
    traceback per worker; here the receiver stops with one line saying what to set."""
    from kafka_eventing.core.kube import load_configuration
    from kafka_eventing.core.settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
        if settings.channel_source == "kube":
            load_configuration(settings.kubeconfig)
    except SettingsError as exc:
        raise SystemExit(f"receiver: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(ABOUT, flush=True)  # before exec replaces this process
    else:
        preflight()
    cmd = command(args)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
