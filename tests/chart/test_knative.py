"""What Knative Eventing's own controllers need from every install: the ClusterRoles its aggregated roles select
by label (channelable-manipulator, addressable-resolver, crossnamespace-subscriber), with the KafkaChannel rules.
tests/integration/test_knative.py shows the aggregation working for Knative's real controller."""

from __future__ import annotations

import pytest

from .render import RENDERS, of_kind, render

MANIPULATE = {"create", "get", "list", "watch", "update", "patch", "delete"}
READ = {"get", "list", "watch"}
#: Knative's aggregation label → what a ClusterRole carrying it grants on KafkaChannels.
AGGREGATED = {
    "duck.knative.dev/channelable": {(r, v) for r in ("kafkachannels", "kafkachannels/status") for v in MANIPULATE},
    "duck.knative.dev/addressable": {(r, v) for r in ("kafkachannels", "kafkachannels/status") for v in READ},
    "duck.knative.dev/crossnamespace-subscribable": {("kafkachannels", "knsubscribe")},
}


@pytest.mark.parametrize("name", RENDERS)
def test_aggregated_cluster_roles_for_knative(name: str) -> None:
    roles = of_kind(render(name), "ClusterRole")
    for label, grants in AGGREGATED.items():
        (role,) = [r for r in roles if r["metadata"]["labels"].get(label) == "true"]
        assert "aggregationRule" not in role
        assert {(res, v) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
                for v in rule["verbs"] if g == "messaging.knative.dev"} == grants, label
        assert {g for rule in role["rules"] for g in rule["apiGroups"]} == {"messaging.knative.dev"}
