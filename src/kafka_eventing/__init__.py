"""kafka-eventing: Kafka-backed, Knative-compatible eventing (KafkaChannel, Kafka Broker, KafkaSource, KafkaSink,
reprocessing)."""

__version__ = "0.1.0"
