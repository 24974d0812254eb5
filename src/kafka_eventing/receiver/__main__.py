"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with uvicorn workers running the app.

The shared ingress of every KafkaChannel (``POST /<namespace>/<channel>``, or any path with the Host
``<channel>-kn-channel.<namespace>.svc...``) and every Kafka Broker (``POST /<namespace>/<broker>``): 202 once
Kafka holds the event. Channels and Brokers come from KE_CHANNEL_SOURCE: kube (the API server: KE_KUBECONFIG or
KUBECONFIG outside a cluster) or file (KE_CHANNELS_FILE); Kafka from KE_BOOTSTRAP_SERVERS, KE_KAFKA_SECRET_DIR,
KE_KAFKA_PROVIDER; every KE_* variable: docs/settings.md.

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
    if args and args[0] in ("-h", "--help"):
        print(f"usage: kafka-eventing receiver [gunicorn flags]\n\n{__doc__.split(chr(10), 2)[2]}", end="")
        return
    preflight()
    cmd = command(args)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
