"""The KafkaChannel receiver (ingress): CloudEvents over HTTP into the channel's Kafka topic.

See docs/receiver.md for the worker model and how to run it (``python -m kafka_eventing.receiver``).
"""
