"""The controller: reconciles KafkaChannels, Kafka-class Brokers and their Triggers, KafkaSinks, KafkaSources,
ResetOffsets and EventPolicies into topics, dispatchers, Services, identities and status (docs/architecture.md).

``python -m kafka_eventing.controller`` runs it (``main.main``); ``Controller`` runs it in-process.
"""
