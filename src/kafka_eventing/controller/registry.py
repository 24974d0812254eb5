"""The kinds the controller reconciles (``controller/host.py`` says what a kind is): a new kind is its module and
one line here."""

from __future__ import annotations

from kafka_eventing.controller.brokers import KIND_BROKER
from kafka_eventing.controller.channels import KIND_CHANNEL
from kafka_eventing.controller.eventpolicies import KIND_POLICY
from kafka_eventing.controller.host import Kind
from kafka_eventing.controller.kafkasources import KIND_SOURCE
from kafka_eventing.controller.resetoffsets import KIND_RESET_OFFSET
from kafka_eventing.controller.sinks import KIND_SINK

#: In setup order. EventPolicies come first: the targets' reconciles read their cache.
KINDS: tuple[Kind, ...] = (KIND_POLICY, KIND_CHANNEL, KIND_BROKER, KIND_SINK, KIND_SOURCE, KIND_RESET_OFFSET)
