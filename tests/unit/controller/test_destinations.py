"""controller.destinations.resolve_address: a Destination's url, audience and CACerts — its own, else what the
Addressable it refers to publishes in ``status.address`` (Knative's resolver). On the real apiserver, the Trigger's
status fields: tests/integration/test_broker_auth.py."""

from __future__ import annotations

from pathlib import Path
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


def test_addresses_are_https_with_the_receivers_ca_while_it_serves_tls(tmp_path: Path) -> None:
    from kafka_eventing.controller import resources as res
    from kafka_eventing.core.settings import Settings

    assert res.address(Settings(), "http://r.sys.svc/shop/b") == {"url": "http://r.sys.svc/shop/b"}
    ca = tmp_path / "ca.crt"
    ca.write_text("PEM-1")
    tls = Settings(ingress_ca_file=ca)
    assert res.address(tls, "http://r.sys.svc/shop/b") == {"url": "https://r.sys.svc/shop/b", "CACerts": "PEM-1"}
    ca.write_text("PEM-22")  # rotated (another size): read again
    assert res.address(tls, "http://r.sys.svc/shop/b")["CACerts"] == "PEM-22"


def test_broker_replies_over_https_carry_the_ca_the_broker_publishes() -> None:
    from kafka_eventing.broker.filters import TriggerFilters
    from kafka_eventing.dispatcher.triggers import broker_channel

    broker = {"metadata": {"name": "b", "namespace": "shop",
                           "annotations": {"eventing.knative.dev/broker.class": "Kafka"}},
              "status": {"address": {"url": "https://r.sys.svc/shop/b", "CACerts": "PEM"}}}
    trigger = {"metadata": {"name": "t", "namespace": "shop"},
               "spec": {"broker": "b", "subscriber": {"uri": "http://s"}}}
    channel = broker_channel(broker, [trigger], TriggerFilters(), standalone=True)
    assert channel is not None
    (sub,) = channel.subscribers
    assert (sub.reply_uri, sub.reply_ca_certs) == ("https://r.sys.svc/shop/b", "PEM")
    plain = {**broker, "status": {"address": {"url": "http://r.sys.svc/shop/b"}}}
    (sub,) = broker_channel(plain, [trigger], TriggerFilters(), standalone=True).subscribers  # type: ignore[union-attr]
    assert sub.reply_ca_certs is None
