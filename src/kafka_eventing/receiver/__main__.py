"""``python -m kafka_eventing.receiver [gunicorn flags]``: exec gunicorn with uvicorn workers running the app.

Flags go to gunicorn unchanged (e.g. ``--bind 127.0.0.1:8080 --workers 1``) and override the config module.
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
Service, KE_SINK_SERVICE); 202 once Kafka holds it, on the cluster the target names. Settings are KE_*
environment variables (docs/receiver.md); the flags below are gunicorn's.
"""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(ABOUT, flush=True)  # before exec replaces this process
    cmd = command(args)
    os.execv(cmd[0], cmd)  # noqa: S606 - replace this process, so gunicorn gets the signals


if __name__ == "__main__":
    main()
