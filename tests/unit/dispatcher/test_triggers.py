"""triggers: which Triggers the dispatcher consumes for — only those the controller reports ready for dispatch."""

from __future__ import annotations

from kafka_eventing.broker.filters import TriggerFilters
from kafka_eventing.core import brokers as kb
from kafka_eventing.core.delivery import ANNOTATION_RATE_LIMIT
from kafka_eventing.dispatcher.triggers import broker_channel, dispatch_hold, trigger_subscriber

from .fakes import (
    broker,
    trigger,
    with_condition,
)


def test_every_dispatch_gate_must_be_true() -> None:
    assert dispatch_hold(trigger("t")) == ""
    for kind in (kb.BROKER_READY, kb.SUBSCRIBER_RESOLVED, kb.DEPENDENCY_READY):
        held = with_condition(trigger("t"), kind, "False", "Why", "what to fix")
        assert dispatch_hold(held) == f"{kind} is False (Why: what to fix)"
        assert dispatch_hold(with_condition(trigger("t"), kind, "Unknown")) == f"{kind} is Unknown"
    # Not yet reconciled by the controller: wait for it rather than guess.
    assert dispatch_hold({"metadata": {"name": "t"}, "status": {}}).startswith("waiting for the controller")
    # Ready is not a gate: it waits for the dispatcher's own ConsumerGroupReady.
    assert dispatch_hold(with_condition(trigger("t"), "Ready", "Unknown", "ConsumerGroupNotReported")) == ""
    assert dispatch_hold(with_condition(trigger("t"), kb.CONSUMER_GROUP_READY, "False", "TriggerNotReady")) == ""


def test_a_held_trigger_is_reported_not_consumed_and_released_once_ready() -> None:
    filters = TriggerFilters()
    waiting = with_condition(trigger("t"), kb.DEPENDENCY_READY, "False", "DependencyDoesNotExist", "Broker dep")
    sub = trigger_subscriber(waiting, broker(), filters, "http://receiver/ns/b")
    assert sub.held == "DependencyReady is False (DependencyDoesNotExist: Broker dep)"
    assert sub.uid == "t" and sub.generation == 3
    ready = trigger_subscriber(trigger("t"), broker(), filters, "http://receiver/ns/b")
    assert not ready.held and ready.subscriber_uri == "http://sub/" and ready.event_filter is not None


def test_standalone_triggers_have_no_conditions_to_wait_for() -> None:
    bare = {"metadata": {"namespace": "ns", "name": "t"},
            "spec": {"broker": "b", "subscriber": {"uri": "http://sub/"}}}
    assert not trigger_subscriber(bare, broker(), TriggerFilters(), None, standalone=True).held
    assert trigger_subscriber(bare, broker(), TriggerFilters(), None).held.startswith("waiting for the controller")


def test_a_held_trigger_stays_a_subscriber_of_the_broker_channel() -> None:
    channel = broker_channel(broker(), [with_condition(trigger("t"), kb.BROKER_READY, "False", "BrokerNotReady")],
                             TriggerFilters())
    assert channel is not None
    (sub,) = channel.subscribers
    assert sub.held.startswith("BrokerReady is False")


def test_a_dead_letter_sink_ref_resolves_in_the_triggers_namespace() -> None:
    sink = {"deadLetterSink": {"ref": {"apiVersion": "v1", "kind": "Service", "name": "dls"}}}
    own = trigger_subscriber(trigger("t", delivery=sink), broker(), TriggerFilters(), None)
    assert own.delivery.dead_letter_uri == "http://dls.ns.svc.cluster.local"
    # The Broker's delivery (the Trigger has none) resolves in the same namespace: the Broker's and the Trigger's.
    inherited = trigger_subscriber(trigger("t"), {**broker(), "spec": {"delivery": sink}}, TriggerFilters(), None)
    assert inherited.delivery.dead_letter_uri == "http://dls.ns.svc.cluster.local"
    # A ref that names its namespace keeps it.
    other = {"deadLetterSink": {"ref": {**sink["deadLetterSink"]["ref"], "namespace": "ops"}}}
    named = trigger_subscriber(trigger("t", delivery=other), broker(), TriggerFilters(), None)
    assert named.delivery.dead_letter_uri == "http://dls.ops.svc.cluster.local"


def test_a_triggers_rate_limit_annotation_limits_its_subscriber_and_an_invalid_one_holds_it() -> None:
    limited = trigger("t")
    limited["metadata"]["annotations"][ANNOTATION_RATE_LIMIT] = "4"
    assert trigger_subscriber(limited, broker(), TriggerFilters(), None).rate_limit == 4.0
    assert trigger_subscriber(trigger("t"), broker(), TriggerFilters(), None).rate_limit is None
    invalid = trigger("t")
    invalid["metadata"]["annotations"][ANNOTATION_RATE_LIMIT] = "lots"
    held = trigger_subscriber(invalid, broker(), TriggerFilters(), None)
    assert ANNOTATION_RATE_LIMIT in held.held and "'lots'" in held.held


def test_replies_carry_the_brokers_audience_only_with_ingress_auth_on() -> None:
    t = trigger("t", subscriber={"uri": "http://sub/", "audience": "sub-aud"},
                delivery={"deadLetterSink": {"uri": "http://dls/", "audience": "dls-aud"}})
    t["status"]["deadLetterSinkUri"] = "http://dls/"
    t["status"]["auth"] = {"serviceAccountName": "t-oidc-eventing.knative.dev-trigger"}
    on = broker_channel(broker(), [t], TriggerFilters(), authenticated=True)
    off = broker_channel(broker(address={"url": "http://receiver/ns/b", "audience": "published"}), [t],
                         TriggerFilters())
    assert on is not None and off is not None
    (sub,) = on.subscribers
    assert (sub.reply_audience, sub.subscriber_audience, sub.delivery.dead_letter_audience) == (
        "eventing.knative.dev/broker/ns/b", "sub-aud", "dls-aud")
    assert off.subscribers[0].reply_audience is None
    # A Broker's published audience is the one its replies are sent for.
    published = broker_channel(broker(address={"url": "http://receiver/ns/b", "audience": "published"}), [t],
                               TriggerFilters(), authenticated=True)
    assert published is not None and published.subscribers[0].reply_audience == "published"


def test_a_trigger_sends_as_its_own_identity_and_waits_for_one_where_replies_need_a_token() -> None:
    audience = kb.broker_audience("ns", "b")
    anonymous = trigger("t")
    held = trigger_subscriber(anonymous, broker(), TriggerFilters(), "http://receiver/ns/b", reply_audience=audience)
    assert held.held.startswith("no OIDC identity yet")
    # Without ingress auth nothing needs its token yet: consumed, and no token is sent.
    assert trigger_subscriber(anonymous, broker(), TriggerFilters(), "http://receiver/ns/b").identity is None
    own = trigger("t")
    own["status"]["auth"] = {"serviceAccountName": "t-oidc-eventing.knative.dev-trigger"}
    sub = trigger_subscriber(own, broker(), TriggerFilters(), "http://receiver/ns/b", reply_audience=audience)
    assert not sub.held and sub.identity == ("ns", "t-oidc-eventing.knative.dev-trigger")


def test_a_trigger_naming_another_namespaces_broker_belongs_to_no_broker_here() -> None:
    """``spec.brokerRef.namespace`` is honoured by refusing it: a same-named Broker of the Trigger's own namespace
    must not take it (the controller reports CrossNamespaceBrokerRef)."""
    foreign = trigger("t", broker_name="")
    foreign["spec"] = {"brokerRef": {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker", "name": "b",
                                     "namespace": "elsewhere"}, "subscriber": {"uri": "http://sub/"}}
    assert kb.trigger_broker(foreign) == "" and kb.foreign_broker(foreign) == "elsewhere/b"
    channel = broker_channel(broker(), [foreign], TriggerFilters())
    assert channel is not None and channel.subscribers == ()
    # The same ref in its own namespace (or no namespace) is the Broker here.
    for ref_ns in ("ns", None):
        local = trigger("t", broker_name="")
        local["spec"] = {"brokerRef": {"name": "b", "namespace": ref_ns}, "subscriber": {"uri": "http://sub/"}}
        assert kb.trigger_broker(local) == "b" and kb.foreign_broker(local) == ""
