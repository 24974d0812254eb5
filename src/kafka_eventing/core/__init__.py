"""What every role shares: settings, Kafka connection config, the CloudEvents⇄Kafka binding, DeliverySpec, the
informer, and each resource's facts (channels, brokers, sinks, kafkasources, resetoffsets, eventpolicies)."""
