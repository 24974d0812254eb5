"""`kafka-eventing <command>`: one entry point for every role, the local stack and the reprocessing jobs.

Each command lives in its role's package; this module only dispatches, importing the role lazily so that
e.g. the receiver image never imports pyspark.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("kafka_eventing.localstack.demo", "the main job: local Kafka + receiver + dispatcher + demo subscriber "
                                              "(--broker, --source)"),
    "receiver": ("kafka_eventing.receiver.__main__",
                 "the shared ingress of every KafkaChannel, Kafka Broker and KafkaSink (gunicorn + falcon)"),
    "dispatcher": ("kafka_eventing.dispatcher.__main__",
                   "the egress of one KafkaChannel (a consumer group per Subscription), one Kafka Broker "
                   "(per Trigger) or one KafkaSource"),
    "controller": ("kafka_eventing.controller.__main__",
                   "reconciles KafkaChannels, Kafka-class Brokers and their Triggers, KafkaSinks and KafkaSources"),
    "reprocess": ("kafka_eventing.reprocess.cli", "offline jobs on PySpark: archive, replay, redrive, stats"),
    "local": ("kafka_eventing.localstack.__main__", "start/stop a local Kafka + Kubernetes API server"),
    "cesql": ("kafka_eventing.cesql.cli", "CloudEvents SQL: evaluate an expression, run conformance (TCK) files"),
    "offsets": ("kafka_eventing.core.offsets_cli", "a consumer group's offsets: show, reset to a time (no CRD needed)"),
}


def usage() -> str:
    lines = ["usage: kafka-eventing <command> [args...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`kafka-eventing <command> --help` says more. The roles read KE_* environment variables",
              "(docs/settings.md lists every one); outside a cluster they find the API server through KUBECONFIG."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as exc:
        if exc.name != "kafka_eventing.localstack":
            raise
        print(f"{command}: the dev harness (kafka_eventing.localstack) is not installed here (the role images leave "
              "it out): run it from a checkout (make run)", file=sys.stderr)
        return 2
    result = module.main(rest)
    return int(result or 0)
