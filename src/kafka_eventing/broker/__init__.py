"""The Kafka Broker's own logic: Trigger filters (``filters``) and Broker/Trigger resource facts (``resources``)."""
