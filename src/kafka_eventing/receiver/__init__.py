"""The shared receiver (ingress) of KafkaChannels, Kafka Brokers and KafkaSinks: CloudEvents over HTTP into each
target's Kafka topic, on the Kafka cluster the target names.

See docs/receiver.md for the worker model and how to run it (``python -m kafka_eventing.receiver``).
"""
