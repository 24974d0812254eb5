"""Offline reprocessing on PySpark: archive a topic to Parquet, replay, redrive dead letters, statistics.

Every job decodes records with the core CloudEvents binding (``kafka_eventing.core.binding``) inside Spark,
and connects to Kafka with the same connection Secret as the other roles (translated for Spark's Java client).
"""
