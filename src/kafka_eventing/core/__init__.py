"""What every role shares: settings, Kafka connection config, the CloudEvents⇄Kafka binding, channels."""
