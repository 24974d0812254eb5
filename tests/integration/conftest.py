"""The integration tier's shared fixtures, defined in ``support/`` beside the helpers they go with."""

from support.broker_dispatch import broker_dispatch
from support.brokers import brokers
from support.controller import api, env
from support.dispatcher import http
from support.receiver import start_receiver
from support.reprocess import sink
from support.sinks import sinks

__all__ = ["api", "broker_dispatch", "brokers", "env", "http", "sink", "sinks", "start_receiver"]
