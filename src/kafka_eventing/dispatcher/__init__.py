"""The egress: one process per KafkaChannel, Kafka Broker or KafkaSource, delivering at least once.

A channel's dispatcher runs a consumer group per subscriber; a Broker's reads its topic once and fans each record out
to its Triggers (``fanout``, ``lane``), each with its own group's offsets; a KafkaSource's runs the source's one group
over its topics (``sources``). It also carries out the ResetOffsets of its groups (``resets``). docs/dispatcher.md.
"""

from kafka_eventing.dispatcher.app import Dispatcher
from kafka_eventing.dispatcher.factory import create_dispatcher

__all__ = ["Dispatcher", "create_dispatcher"]
