"""`python -m kafka_eventing.dispatcher [--host H]`: the dispatcher of one KafkaChannel, one Kafka Broker or one
KafkaSource.

A KafkaChannel's (KE_CHANNEL_NAMESPACE + KE_CHANNEL_NAME): a consumer group per subscriber, i.e. per Knative
Subscription. A Broker's (KE_BROKER_NAMESPACE + KE_BROKER_NAME instead): one read of its topic fanned out to its
Triggers, each with its filter and its own consumer group's offsets. A KafkaSource's (KE_SOURCE_NAMESPACE +
KE_SOURCE_NAME): the source's one group over its topics, records that are not CloudEvents converted as upstream
does. All are read from KE_CHANNEL_SOURCE: kube (the API server: KE_KUBECONFIG or KUBECONFIG outside a cluster) or
file (KE_CHANNELS_FILE). Kafka from KE_BOOTSTRAP_SERVERS, KE_KAFKA_SECRET_DIR, KE_KAFKA_PROVIDER; every KE_*
variable: docs/settings.md. SIGTERM/SIGINT stop the loop; done work is committed and every consumer closed before
exit. On the API (KE_CHANNEL_SOURCE=kube) destinations that declare an audience get a token of the sending
resource's own OIDC ServiceAccount — the Trigger's, the Subscription's (core/tokens.py) — and the dispatcher carries
out the ResetOffsets (kafka.eventing.knative.dev/v1alpha1) of its consumer groups when the API server serves that
CRD (dispatcher/resets.py).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import sys

import uvloop

from kafka_eventing.core import logging as ke_logging
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core import tracing
from kafka_eventing.core.channel_source import ChannelSource, channel_source_from_settings
from kafka_eventing.core.group_offsets import GroupOffsets
from kafka_eventing.core.heap import freeze_startup_heap
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.kube import api_client as kube_api_client
from kafka_eventing.core.settings import Settings, SettingsError
from kafka_eventing.core.tokens import TokenSource, kube_requester
from kafka_eventing.dispatcher.factory import create_dispatcher
from kafka_eventing.dispatcher.resets import KubeResetApi, Resets, serves_resetoffsets
from kafka_eventing.dispatcher.status import (
    KubeStatusWriter,
    KubeTriggerStatusWriter,
    MemoryStatusWriter,
    StatusWriter,
)

log = logging.getLogger("kafka_eventing.dispatcher")


async def _run(settings: Settings) -> None:
    connection = connection_from_settings(settings)
    writer: StatusWriter
    source: ChannelSource
    api_client = None
    if settings.broker_name:
        # A Broker's dispatcher reports each Trigger's ConsumerGroupReady condition; the controller the rest.
        # Imported here: a channel's dispatcher has no use for the Trigger filters (CESQL's grammar) or their
        # informer.
        from kafka_eventing.dispatcher.triggers import FileTriggerSource, KubeTriggerSource

        if settings.channel_source == "kube":
            api_client = kube_api_client(settings.kubeconfig)
            # With ingress auth on, replies into the Broker carry a token for its audience.
            source = KubeTriggerSource(api_client, settings.broker_namespace, settings.broker_name,
                                       authenticated=bool(settings.auth_issuer))
            writer = KubeTriggerStatusWriter(api_client)
        elif settings.channels_file is not None:
            source = FileTriggerSource(settings.channels_file, settings, settings.broker_namespace,
                                       settings.broker_name)
            writer = MemoryStatusWriter()
        else:
            raise SettingsError("a Broker's dispatcher in file mode needs KE_CHANNELS_FILE")
    elif settings.source_name:
        # A KafkaSource's dispatcher writes no status of the source: the controller reports its conditions.
        from kafka_eventing.dispatcher.sources import FileSourceSource, KubeSourceSource

        writer = MemoryStatusWriter()
        if settings.channel_source == "kube":
            api_client = kube_api_client(settings.kubeconfig)
            source = KubeSourceSource(api_client, settings.source_namespace, settings.source_name)
        elif settings.channels_file is not None:
            source = FileSourceSource(settings.channels_file, settings, settings.source_namespace,
                                      settings.source_name)
        else:
            raise SettingsError("a KafkaSource's dispatcher in file mode needs KE_CHANNELS_FILE")
    elif settings.channel_source == "kube":
        api_client = kube_api_client(settings.kubeconfig)
        source = channel_source_from_settings(settings, api_client)
        writer = KubeStatusWriter(api_client)
    else:
        source = channel_source_from_settings(settings)
        writer = MemoryStatusWriter()
    resets = None
    if settings.channel_source == "kube" and serves_resetoffsets(api_client):
        # ResetOffsets naming this dispatcher's groups (dispatcher/resets.py); the CRD is optional.
        kind, namespace, name = (
            ("Broker", settings.broker_namespace, settings.broker_name) if settings.broker_name
            else (ro.KAFKA_SOURCE_KIND, settings.source_namespace, settings.source_name) if settings.source_name
            else (ro.KAFKA_CHANNEL_KIND, settings.channel_namespace, settings.channel_name))
        resets = Resets(kind, namespace, name, KubeResetApi(api_client), GroupOffsets(connection.admin_config()))
    if settings.dispatcher_initial_offset not in ("latest", "earliest"):
        raise SystemExit(f"KE_DISPATCHER_INITIAL_OFFSET={settings.dispatcher_initial_offset!r}: use latest or earliest")
    # On the API: each sender's own tokens (its OIDC ServiceAccount's) for destinations that declare an audience.
    tokens = TokenSource(kube_requester(api_client)) if api_client is not None else None
    traces = tracing.setup(settings, "kafka-eventing-dispatcher")
    dispatcher = create_dispatcher(settings, connection, source, status_writer=writer,
                                   initial_offset=settings.dispatcher_initial_offset, host=_ARGS.host,
                                   tracer=traces.tracer if traces is not None else None, tokens=tokens,
                                   resets=resets)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, dispatcher.stop)
    # Start-up's objects out of the collector's passes: a full pass over them took ~15 ms (core/heap.py).
    freeze_startup_heap()
    try:
        await dispatcher.run()
    finally:
        if traces is not None:
            await asyncio.to_thread(traces.shutdown)  # the last spans exported before the process ends


class _Args(argparse.Namespace):
    host: str = "0.0.0.0"


_ARGS = _Args()


def _limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc malloc arenas before librdkafka starts its threads.

    Each consumer runs several librdkafka threads; by default glibc gives busy threads their own arenas
    (up to 8 per core), and freed fetch buffers then stay spread over them. Measured in
    bench/dispatcher.py: about 20 MiB less RSS with 15 subscriptions. ``MALLOC_ARENA_MAX`` still wins.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


def main(argv: list[str] | None = None) -> int:
    _limit_malloc_arenas()
    parser = argparse.ArgumentParser(prog="kafka-eventing dispatcher", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="0.0.0.0", help="address for /healthz, /readyz, /metrics, /status")
    parser.parse_args(sys.argv[1:] if argv is None else argv, namespace=_ARGS)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return 2
    ke_logging.configure(settings.log_level, settings.log_format)
    try:
        # uvloop: every event is one POST and one response through the loop's TCP transport; the same aiohttp
        # client spends ~10 % less CPU per request on it (bench/dispatcher.py, bare_http vs bare_http_uvloop).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_run(settings))
    except SettingsError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)  # one line saying what to set, as for a bad variable
        return 2
    except ValueError as exc:
        log.error("dispatcher cannot start", extra={"error": str(exc)})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
