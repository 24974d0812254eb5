"""KafkaChannel egress: one process per channel, one consumer group per subscriber, at-least-once delivery."""

from kafka_eventing.dispatcher.app import Dispatcher, create_dispatcher

__all__ = ["Dispatcher", "create_dispatcher"]
