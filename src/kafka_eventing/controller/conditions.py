"""The KafkaChannel's condition types and its Ready rule (``core.conditions`` holds the Condition type itself)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kafka_eventing.core.conditions import Condition

READY = "Ready"
#: The channel's annotations and spec parse as the dispatcher reads them (content mode, delivery order, rate limit,
#: subscribers' delivery); False: the dispatcher would refuse the channel, and the message says which field.
CONFIG_PARSED = "ConfigParsed"
ADDRESSABLE = "Addressable"
TOPIC_READY = "TopicReady"
CHANNEL_SERVICE_READY = "ChannelServiceReady"
DISPATCHER_DEPLOYMENT_READY = "DispatcherDeploymentReady"
DISPATCHER_SERVICE_READY = "DispatcherServiceReady"
RECEIVER_DEPLOYMENT_READY = "ReceiverDeploymentReady"
DEAD_LETTER_SINK_RESOLVED = "DeadLetterSinkResolved"
#: Only while KEDA scaling is enabled. Informational: without KEDA the dispatcher runs at the controller's
#: replica count, so the channel stays Ready.
DISPATCHER_AUTOSCALER_READY = "DispatcherAutoscalerReady"

#: Conditions whose truth makes the channel Ready (DeadLetterSinkResolved counts only when a sink is set).
DEPENDENTS = (CONFIG_PARSED, TOPIC_READY, CHANNEL_SERVICE_READY, DISPATCHER_DEPLOYMENT_READY, DISPATCHER_SERVICE_READY,
              RECEIVER_DEPLOYMENT_READY, ADDRESSABLE)


def ready_condition(conditions: Iterable[Condition], dependents: Sequence[str] = DEPENDENTS) -> Condition:
    """Ready is True when every dependent is True; otherwise it carries the first failing one's reason."""
    by_type = {c.type: c for c in conditions}
    wanted = [*dependents]
    if DEAD_LETTER_SINK_RESOLVED in by_type:
        wanted.append(DEAD_LETTER_SINK_RESOLVED)
    failing = [by_type.get(kind, Condition.unknown(kind, "NotReconciled", f"{kind} not reconciled yet"))
               for kind in wanted]
    # A False condition explains more than an Unknown one, so report it first.
    failing = [c for c in failing if not c.is_true]
    if not failing:
        return Condition.true(READY, "Ready", "")
    worst = next((c for c in failing if c.status == "False"), failing[0])
    return Condition(READY, worst.status, worst.reason, worst.message or worst.type)
