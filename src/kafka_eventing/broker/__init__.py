"""The Kafka Broker's Trigger filters (``filters``), compiled once per change: validated by the controller, run by
the dispatcher. The Broker's and Trigger's resource facts are in ``core.brokers``."""
