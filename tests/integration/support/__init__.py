"""The integration tier's helpers, one module per subject (a control-plane environment, Brokers, KafkaSinks, a
dispatcher in-process and a recording subscriber, a receiver process, a Broker's dispatch, the reprocessing jobs'
events and sink). Test modules import from here, never from each other; the fixtures among them are registered for
the whole tier by tests/integration/conftest.py."""
