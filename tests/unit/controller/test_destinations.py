"""controller.destinations.resolve_address: a Destination's url, audience and CACerts — its own, else what the
Addressable it refers to publishes in ``status.address`` (Knative's resolver). On the real apiserver, the Trigger's
status fields: tests/integration/test_broker_auth.py."""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

from kafka_eventing.controller.destinations import Address, resolve_address
from kafka_eventing.controller.reconciler import dead_letter_status

CHANNEL_REF = {"apiVersion": "messaging.knative.dev/v1beta1", "kind": "KafkaChannel", "name": "orders"}


def custom(address: dict[str, Any]) -> Any:
    api = MagicMock()
    api.get_namespaced_custom_object.return_value = {"status": {"address": address}}
    return api


def test_a_refs_published_audience_and_ca_certs_are_taken() -> None:
    api = custom({"url": "https://orders.example", "audience": "aud-of-orders", "CACerts": "PEM"})
    assert resolve_address(MagicMock(), api, {"ref": CHANNEL_REF}, "shop") == Address(
        "https://orders.example", "aud-of-orders", "PEM")
    api.get_namespaced_custom_object.assert_called_once_with("messaging.knative.dev", "v1beta1", "shop",
                                                             "kafkachannels", "orders", _request_timeout=(5, 15))


def test_the_destinations_own_audience_and_ca_certs_win() -> None:
    api = custom({"url": "https://orders.example", "audience": "published", "CACerts": "PUBLISHED"})
    found = resolve_address(MagicMock(), api, {"ref": CHANNEL_REF, "audience": "mine", "CACerts": "MINE"}, "shop")
    assert (found.audience, found.ca_certs) == ("mine", "MINE")
    assert resolve_address(MagicMock(), MagicMock(), {"uri": "https://x", "audience": "a"}, "shop") == Address(
        "https://x", "a", None)
    plain = resolve_address(MagicMock(), custom({"url": "http://o"}), {"ref": CHANNEL_REF}, "shop")
    assert (plain.audience, plain.ca_certs) == (None, None)


def test_dead_letter_status_fields() -> None:
    assert dead_letter_status(Address("https://d", "aud", "PEM")) == {
        "deadLetterSinkUri": "https://d", "deadLetterSinkAudience": "aud", "deadLetterSinkCACerts": "PEM"}
    assert dead_letter_status(None) == dict.fromkeys(
        ("deadLetterSinkUri", "deadLetterSinkAudience", "deadLetterSinkCACerts"))
