"""Which dispatcher a process runs: a Broker's fan-out (``broker_dispatcher.BrokerDispatcher``) or the
per-subscriber one of a KafkaChannel or KafkaSource (``app.Dispatcher``), built from injected parts."""

from __future__ import annotations

from typing import Any

import aiohttp

from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.kafka_config import KafkaConnection
from kafka_eventing.core.settings import Settings
from kafka_eventing.dispatcher.app import Dispatcher
from kafka_eventing.dispatcher.status import StatusWriter


def create_dispatcher(
    settings: Settings,
    connection: KafkaConnection,
    channel_source: ChannelSource,
    *,
    http_session: aiohttp.ClientSession | None = None,
    status_writer: StatusWriter | None = None,
    **kwargs: Any,
) -> Dispatcher:
    """The dispatcher for ``settings.channel_namespace``/``settings.channel_name`` from injected parts; for a
    Broker (``settings.broker_name``), the fan-out dispatcher of ``broker_dispatcher.py``."""
    if settings.broker_name:
        # Imported here: a channel's dispatcher has no use for the Trigger filters (CESQL's grammar).
        from kafka_eventing.dispatcher.broker_dispatcher import BrokerDispatcher

        return BrokerDispatcher(settings, connection, channel_source, http_session=http_session,
                                status_writer=status_writer, **kwargs)
    return Dispatcher(settings, connection, channel_source, http_session=http_session,
                      status_writer=status_writer, **kwargs)
