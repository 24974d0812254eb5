"""The receiver's EventPolicy decisions (``receiver.auth.PolicyCheck``) on a verified subject: the policies that
apply, their filters on the decoded records, the default modes and the Broker dispatcher's own replies."""

from __future__ import annotations

from typing import Any

from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core.binding import KafkaRecord
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.auth import PolicyCheck
from kafka_eventing.receiver.ingress import Answer

SENDER = "system:serviceaccount:shop:sender"
STRANGER = "system:serviceaccount:shop:stranger"
DISPATCHER = "system:serviceaccount:knative-eventing:kafka-channel-dispatcher"
ORDERS = Channel(namespace="shop", name="orders", topic="t")
EVENTS = Channel(namespace="shop", name="events", topic="t", labels=(("team", "b"),))


class Policies:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self._policies = {(p.namespace, p.name): p for p in map(ep.policy_from_resource, objs)}

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def synced(self) -> bool:
        return True

    def policies(self) -> dict[tuple[str, str], ep.Policy]:
        return self._policies


def policy(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": ep.API_VERSION, "kind": ep.KIND, "metadata": {"name": name, "namespace": "shop"},
            "spec": spec}


def record(event_type: str) -> KafkaRecord:
    return KafkaRecord(None, b"{}", [("ce_specversion", b"1.0"), ("ce_id", b"1"), ("ce_source", b"/s"),
                                     ("ce_type", event_type.encode())])


def status(decision: object) -> int:
    return int(decision.status[:3]) if isinstance(decision, Answer) else 200


def check(*objs: dict[str, Any], mode: ep.DefaultMode = ep.DefaultMode.DENY_ALL) -> PolicyCheck:
    return PolicyCheck(Policies(*objs), mode)


def test_an_applying_policy_allows_its_subjects_only() -> None:
    c = check(policy("orders-senders", to=[{"ref": {"apiVersion": "messaging.knative.dev/v1beta1",
                                                    "kind": "KafkaChannel", "name": "orders"}}],
                     **{"from": [{"sub": SENDER}]}))
    assert c.decide("channel", ORDERS, SENDER) is None
    refused = c.decide("channel", ORDERS, STRANGER)
    assert status(refused) == 403 and "orders-senders" in refused.body["error"]  # type: ignore[union-attr]
    # No policy applies to the Broker: deny-all decides.
    denied = c.decide("broker", EVENTS, SENDER)
    assert status(denied) == 403 and "deny-all" in denied.body["error"]  # type: ignore[union-attr]


def test_any_applying_policy_may_allow() -> None:
    c = check(policy("a", **{"from": [{"sub": "system:serviceaccount:ops:*"}]}),
              policy("b", to=[{"selector": {"matchLabels": {"team": "b"}}}], **{"from": [{"sub": SENDER}]}))
    assert c.decide("broker", EVENTS, SENDER) is None
    assert c.decide("broker", EVENTS, "system:serviceaccount:ops:x") is None
    assert status(c.decide("channel", ORDERS, SENDER)) == 403  # only "a" applies there


def test_filters_are_checked_on_every_record_of_the_request() -> None:
    c = check(policy("typed", **{"from": [{"sub": SENDER}]},
                     filters=[{"prefix": {"type": "com.example."}}, {"cesql": "type <> 'com.example.secret'"}]))
    event_check = c.decide("channel", ORDERS, SENDER)
    assert callable(event_check)
    assert event_check([record("com.example.order")])
    assert not event_check([record("org.other.order")])
    assert not event_check([record("com.example.secret")])
    assert not event_check([record("com.example.order"), record("org.other.order")])  # a batch: all or none


def test_an_unfiltered_policy_wins_over_a_filtered_one_for_the_same_subject() -> None:
    c = check(policy("typed", **{"from": [{"sub": SENDER}]}, filters=[{"exact": {"type": "a"}}]),
              policy("open", **{"from": [{"sub": SENDER}]}))
    assert c.decide("channel", ORDERS, SENDER) is None


def test_a_policy_whose_filters_do_not_compile_allows_no_one() -> None:
    c = check(policy("broken", **{"from": [{"sub": SENDER}]}, filters=[{"cesql": "type = "}]))
    assert status(c.decide("channel", ORDERS, SENDER)) == 403


def test_default_modes_where_no_policy_applies() -> None:
    assert check(mode=ep.DefaultMode.ALLOW_ALL).decide("channel", ORDERS, "system:serviceaccount:x:y") is None
    same = check(mode=ep.DefaultMode.ALLOW_SAME_NAMESPACE)
    assert same.decide("channel", ORDERS, SENDER) is None
    assert status(same.decide("channel", ORDERS, "system:serviceaccount:x:y")) == 403


def test_no_subject_is_waived_not_even_the_dispatchers() -> None:
    # Built as the receiver builds it (from its settings): a Trigger's reply carries the Trigger's identity, so no
    # system subject may pass a policy or deny-all that does not name it.
    settings = Settings(system_namespace="knative-eventing", auth_default_mode=ep.DefaultMode.DENY_ALL)
    for c in (PolicyCheck.from_settings(settings, Policies(policy("nobody", **{"from": [{"sub": "nobody"}]}))),
              PolicyCheck.from_settings(settings, Policies())):
        assert status(c.decide("broker", EVENTS, DISPATCHER)) == 403
        assert status(c.decide("channel", ORDERS, DISPATCHER)) == 403


def test_a_policy_that_cannot_be_used_refuses_everyone_in_its_namespace() -> None:
    broken = ep.policy_or_invalid(policy("broken", to=[{}], **{"from": [{"sub": SENDER}]}))
    c = PolicyCheck(type("Source", (), {"policies": lambda self: {broken.key: broken}})(),
                    ep.DefaultMode.ALLOW_ALL)
    refused = c.decide("channel", ORDERS, SENDER)
    assert status(refused) == 403 and "broken" in refused.body["error"]  # type: ignore[union-attr]


def test_the_app_refuses_before_anything_is_produced() -> None:
    """The falcon app with the real verifier (an OIDC issuer on loopback) and a fake producer: a sender no policy
    allows and an event the allowing policy's filters reject get 403, and nothing reaches the producer."""
    import json

    from falcon import testing

    from kafka_eventing.core.settings import Settings
    from kafka_eventing.receiver.app import create_app
    from kafka_eventing.receiver.auth import TokenVerifier

    from .fakes import AUD, FakeChannels, FakeProducer, Issuer

    issuer = Issuer()
    try:
        producer = FakeProducer()
        orders = Channel("shop", "orders", "shop.orders", audience=AUD)
        checks = check(policy("typed", **{"from": [{"sub": SENDER}]}, filters=[{"prefix": {"type": "com.example."}}]))
        app = create_app(producer, FakeChannels(orders), Settings(produce_timeout_seconds=1),
                         verifier=TokenVerifier(issuer.url), policies=checks)
        client = testing.TestClient(app)

        def post(sub: str, event_type: str) -> int:
            return client.simulate_post("/shop/orders", body=b"{}", headers={
                "ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s", "ce-type": event_type,
                "Authorization": f"Bearer {issuer.token(sub=sub)}"}).status_code

        assert post(STRANGER, "com.example.order") == 403
        assert post(SENDER, "org.other.order") == 403
        batch = json.dumps([{"specversion": "1.0", "id": i, "source": "/s", "type": t}
                            for i, t in (("a", "com.example.a"), ("b", "org.other.b"))]).encode()
        res = client.simulate_post("/shop/orders", body=batch, headers={
            "content-type": "application/cloudevents-batch+json",
            "Authorization": f"Bearer {issuer.token(sub=SENDER)}"})
        assert res.status_code == 403
        assert producer.produced == []  # nothing refused was written
        assert post(SENDER, "com.example.order") == 202
        assert len(producer.produced) == 1
    finally:
        issuer.close()
