"""`kafka-eventing --help` and each role's `--help` name every resource the role serves and how it is configured."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kafka_eventing.cli import usage


def help_of(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kafka_eventing", *args, "--help"], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout


def test_the_command_list_names_what_each_role_serves() -> None:
    roles = {line.split()[0]: line for line in usage().splitlines() if line.startswith("  ")}
    assert "KafkaChannel" in roles["receiver"] and "Broker" in roles["receiver"]
    assert "KafkaChannel" in roles["dispatcher"] and "Broker" in roles["dispatcher"]
    assert all(word in roles["controller"] for word in ("KafkaChannels", "Brokers", "Triggers"))
    assert "docs/settings.md" in usage() and "KUBECONFIG" in usage()


@pytest.mark.parametrize(("role", "words"), [
    ("receiver", ("KafkaChannel", "Kafka Broker", "KE_CHANNEL_SOURCE", "KUBECONFIG", "docs/settings.md")),
    ("dispatcher", ("KafkaChannel", "Kafka Broker", "Trigger", "KE_BROKER_NAMESPACE", "KE_BROKER_NAME",
                    "KE_CHANNEL_NAME", "KUBECONFIG", "docs/settings.md")),
    ("controller", ("KafkaChannels", "Brokers", "Triggers", "KE_RECEIVER_DEPLOYMENT", "KUBECONFIG",
                    "docs/settings.md", "--workers")),
])
def test_each_roles_help_names_its_resources_and_variables(role: str, words: tuple[str, ...]) -> None:
    text = help_of(role)
    missing = [w for w in words if w not in text]
    assert not missing, text


def test_a_harness_command_without_the_harness_says_so(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """In a role image the dev harness is left out: `run` and `local` say so instead of a traceback."""
    import kafka_eventing.cli as cli

    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name="kafka_eventing.localstack")

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    assert cli.main(["local"]) == 2
    assert "dev harness (kafka_eventing.localstack) is not installed here" in capsys.readouterr().err
