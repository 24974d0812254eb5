"""core.delivery.resolve_destination: a Knative Destination (uri and/or ref) as the data plane resolves it."""

from __future__ import annotations

import pytest

from kafka_eventing.core.channels import Channel, channel_from_resource
from kafka_eventing.core.delivery import resolve_destination
from kafka_eventing.core.settings import Settings


def test_uri_only() -> None:
    assert resolve_destination({"uri": "http://sink/x"}, "ns") == ("http://sink/x", "")
    assert resolve_destination(None, "ns") == (None, "")


@pytest.mark.parametrize(("uri", "want"), [
    (None, "http://dls.other.svc.cluster.local"),
    ("/dead", "http://dls.other.svc.cluster.local/dead"),
    ("dead/letters", "http://dls.other.svc.cluster.local/dead/letters"),
])
def test_service_ref_like_knative_resolver(uri: str | None, want: str) -> None:
    dest = {"ref": {"apiVersion": "v1", "kind": "Service", "name": "dls", "namespace": "other"}, "uri": uri}
    assert resolve_destination(dest, "ns") == (want, "")


def test_service_ref_defaults_to_the_resource_namespace() -> None:
    assert resolve_destination({"ref": {"apiVersion": "v1", "kind": "Service", "name": "d"}}, "ns")[0] == \
        "http://d.ns.svc.cluster.local"


def test_other_kinds_are_reported_not_ignored() -> None:
    uri, problem = resolve_destination({"ref": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                                                "name": "b"}}, "ns")
    assert uri is None
    assert "Broker ns/b" in problem and "eventing.knative.dev/v1" in problem


def _channel(sub_delivery: dict[str, object], status: dict[str, object] | None = None) -> Channel:
    obj = {"metadata": {"name": "c", "namespace": "ns"},
           "spec": {"delivery": {"deadLetterSink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "chdls"}}},
                    "subscribers": [{"uid": "u", "subscriberUri": "http://s", "delivery": sub_delivery}]},
           **({"status": status} if status else {})}
    return channel_from_resource(obj, Settings())


def test_subscriber_ref_is_resolved_and_a_broken_one_is_carried_to_the_dispatcher() -> None:
    [sub] = _channel({"deadLetterSink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "d"},
                                         "uri": "/x"}}).subscribers
    assert sub.delivery.dead_letter_uri == "http://d.ns.svc.cluster.local/x"
    [sub] = _channel({"deadLetterSink": {"ref": {"apiVersion": "x/v1", "kind": "Thing", "name": "t"}}}).subscribers
    assert sub.delivery.dead_letter_uri is None and "Thing ns/t" in sub.delivery.dead_letter_problem


def test_channel_sink_from_the_controller_status_wins_over_the_parsers() -> None:
    [sub] = _channel({"retry": 1}).subscribers  # no sink of its own: the channel's, resolved by the parser
    assert sub.delivery.dead_letter_uri == "http://chdls.ns.svc.cluster.local"
    [sub] = _channel({"retry": 1}, {"deadLetterSinkUri": "http://resolved/"}).subscribers
    assert sub.delivery.dead_letter_uri == "http://resolved/"
