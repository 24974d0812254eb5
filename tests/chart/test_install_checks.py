"""Values that cannot work fail `helm install` / `helm template` with a message saying what to set; what the
chart leaves out for lack of an API, its install notes say."""

from __future__ import annotations

import pytest

from .render import PRESETS, helm, helm_error, notes, of_kind, preset_sets, values_file

#: Presets that leave the bootstrap address to the user (every cluster of that service has its own).
NO_ADDRESS = [n for n in PRESETS if not values_file(n)["kafka"]["bootstrapServers"]]


def test_managed_service_presets_have_no_address() -> None:
    assert set(NO_ADDRESS) == {"values-confluent-cloud.yaml", "values-azure-event-hubs.yaml",
                               "values-aws-msk-scram.yaml", "values-aws-msk-iam.yaml"}


@pytest.mark.parametrize("name", NO_ADDRESS)
def test_a_preset_without_an_address_fails_saying_what_to_set(name: str) -> None:
    sets = tuple(s for s in preset_sets(name) if not s.startswith("kafka.bootstrapServers="))
    error = helm_error(name, sets=sets)
    assert "kafka.bootstrapServers is empty" in error and "--set kafka.bootstrapServers=" in error


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_renders_with_what_its_header_says(name: str) -> None:
    docs = helm(name, sets=preset_sets(name))
    assert of_kind(docs, "Deployment")


@pytest.mark.parametrize("role", ["receiver", "controller", "dispatcher"])
def test_msk_iam_without_a_role_arn_fails_saying_what_to_set(role: str) -> None:
    name = "values-aws-msk-iam.yaml"
    sets = tuple(s for s in preset_sets(name) if not s.startswith(f"{role}.serviceAccount."))
    error = helm_error(name, sets=sets)
    assert f"{role}.serviceAccount.annotations has no eks.amazonaws.com/role-arn" in error
    assert f"--set-string '{role}.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=" in error


@pytest.mark.parametrize("name", list(PRESETS))
def test_secret_create_with_a_preset_naming_an_existing_secret_fails(name: str) -> None:
    error = helm_error(name, sets=(*preset_sets(name), "kafka.secret.create=true", "kafka.secret.data.password=p"))
    assert 'kafka.existingSecret names "kafka-connection"' in error and "--set kafka.existingSecret=" in error


def test_secret_create_with_a_preset_makes_the_secret_once_existing_secret_is_emptied() -> None:
    docs = helm("values-confluent-cloud.yaml", sets=(
        *preset_sets("values-confluent-cloud.yaml"), "kafka.existingSecret=", "kafka.secret.create=true",
        "kafka.secret.data.user=u", "kafka.secret.data.password=p"))
    (secret,) = of_kind(docs, "Secret")
    assert secret["stringData"]["user"] == "u"


@pytest.mark.parametrize("opt_in", ["metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true"])
def test_notes_say_when_prometheus_operator_objects_are_left_out(opt_in: str) -> None:
    text = notes(sets=(opt_in,))
    assert "NOT INSTALLED: " + ("metrics.serviceMonitor" if "serviceMonitor" in opt_in else "metrics.prometheusRule") \
        in text and "monitoring.coreos.com/v1" in text
    assert "NOT INSTALLED" not in notes(sets=(opt_in,), apis=("monitoring.coreos.com/v1",))
    assert "NOT INSTALLED" not in notes()


def test_a_fractional_sample_ratio_from_set_renders() -> None:
    """`--set` makes a string of 0.1; the schema takes it as the number it is."""
    (config,) = [d for d in helm(sets=("tracing.sampleRatio=0.1",)) if d["metadata"]["name"] == "kafka-eventing-config"]
    assert config["data"]["KE_TRACING_SAMPLE_RATIO"] == "0.1"
    assert "sampleRatio" in helm_error(sets=("tracing.sampleRatio=1.5",))
