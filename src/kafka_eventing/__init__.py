"""kafka-eventing: Kafka-backed, Knative-compatible eventing (KafkaChannel, Kafka Broker, reprocessing)."""

__version__ = "0.1.0"
