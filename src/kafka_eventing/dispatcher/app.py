"""The dispatcher of one KafkaChannel, Broker or KafkaSource: reconciles one consumer group per subscriber
(a Trigger, or one topic of a KafkaSource, all of its topics in the source's one group), live, and serves probes.

A Broker's dispatcher (``broker_dispatcher.BrokerDispatcher``) is the same with one shared read fanned out to its
Triggers.

``factory.create_dispatcher`` builds it (or the Broker's) from injected parts (settings, Kafka connection, channel
source, HTTP session, status writer); only ``__main__`` reads the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kafka_eventing.core import brokers as kb
from kafka_eventing.core.channel_source import ChannelSource
from kafka_eventing.core.channels import Channel, ChannelKey, Subscriber
from kafka_eventing.core.kafka_config import KafkaConnection
from kafka_eventing.core.settings import Settings
from kafka_eventing.core.tokens import TokenSource
from kafka_eventing.dispatcher.delivery import Deliverer
from kafka_eventing.dispatcher.group_offsets import AdminGroupOffsets, GroupOffsets
from kafka_eventing.dispatcher.http_client import PooledSender
from kafka_eventing.dispatcher.metrics import metrics_for
from kafka_eventing.dispatcher.scheduler import MAX_OUTSTANDING
from kafka_eventing.dispatcher.status import (
    JOINING,
    REASON_DEAD_LETTER,
    REASON_FAILED,
    REASON_JOINING,
    REASON_NOT_READY,
    REASON_TRIGGER_NOT_READY,
    MemoryStatusWriter,
    StatusBoard,
    StatusWriter,
)
from kafka_eventing.dispatcher.subscription import ConsumerFactory, SubscriptionConsumer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from kafka_eventing.dispatcher.resets import Resets

log = logging.getLogger(__name__)

INITIAL_OFFSETS = ("latest", "earliest")


def consumer_settings(settings: Settings, connection: KafkaConnection, group_id: str, initial_offset: str,
                      partitions: int) -> dict[str, Any]:
    """Consumer config sized per subscription so that RSS stays flat however large the lag is.

    librdkafka's prefetch queue is bounded by ``queued.max.messages.kbytes`` (per consumer with the
    high-level consumer); one fetch response by ``fetch.max.bytes``. Properties in ``KE_KAFKA_EXTRA`` win.
    """
    # The subscription's budget (KE_QUEUED_MAX_MESSAGES_KBYTES) is split: half prefetched by librdkafka, a
    # quarter in the dispatcher's own per-partition queues (SubscriptionConsumer.queue_bytes), a quarter
    # left for fetch responses being parsed. Measured with 15 subscriptions in bench/dispatcher.py.
    kbytes = max(128, settings.queued_max_messages_kbytes) // 2
    # One fetch response is at most half of librdkafka's share; librdkafka requires message.max.bytes <= it.
    fetch_max = max(64 * 1024, min(kbytes * 1024 // 2, 1024 * 1024))
    defaults: dict[str, Any] = {
        "auto.offset.reset": initial_offset,
        "queued.max.messages.kbytes": kbytes,
        "queued.min.messages": 1000,
        # A paused partition drops its prefetched records; once resumed, fetch again at once (default 1 s).
        "fetch.queue.backoff.ms": 10,
        # ... and a resumed partition is fetched only when the fetch under way returns: with the default 500 ms
        # long poll on the other (caught-up) partitions, ordered delivery under a backlog stalled for up to 0.5 s
        # per resume (bench: 100,000 events took 28 s at 500 ms, 15 s at 100 ms). Idle, a consumer then sends
        # ~10 fetch requests per second.
        "fetch.wait.max.ms": 100,
        "fetch.max.bytes": fetch_max,
        "message.max.bytes": fetch_max,
        "max.partition.fetch.bytes": max(32 * 1024, fetch_max // max(1, partitions)),
        "auto.commit.interval.ms": 1000,
        "client.id": f"kafka-eventing-dispatcher-{group_id}"[:200],
        "log_level": 3,
    }
    return connection.consumer_config(group_id, **{**defaults, **settings.kafka_extra_config()})


class _Running:
    """A subscription consumer and the task running it."""

    def __init__(self, consumer: SubscriptionConsumer, task: asyncio.Task[None]) -> None:
        self.consumer = consumer
        self.task = task


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        connection: KafkaConnection,
        channel_source: ChannelSource,
        *,
        http_session: aiohttp.ClientSession | None = None,
        status_writer: StatusWriter | None = None,
        consumer_factory: ConsumerFactory | None = None,
        registry: CollectorRegistry | None = None,
        initial_offset: str = "latest",
        host: str = "0.0.0.0",
        port: int | None = None,
        shutdown_grace: float = 5.0,
        tracer: Tracer | None = None,
        max_outstanding: int = MAX_OUTSTANDING,
        tokens: TokenSource | None = None,
        resets: Resets | None = None,
    ) -> None:
        self.broker = bool(settings.broker_name)
        #: A KafkaSource's dispatcher (dispatcher/sources.py): its subscribers are its topics, one group.
        self.kafka_source = bool(settings.source_name)
        if self.broker and not settings.broker_namespace:
            raise ValueError("a Broker's dispatcher needs KE_BROKER_NAMESPACE and KE_BROKER_NAME")
        if self.kafka_source and not settings.source_namespace:
            raise ValueError("a KafkaSource's dispatcher needs KE_SOURCE_NAMESPACE and KE_SOURCE_NAME")
        if not (self.broker or self.kafka_source) and (not settings.channel_name or not settings.channel_namespace):
            raise ValueError("the dispatcher needs KE_CHANNEL_NAMESPACE and KE_CHANNEL_NAME "
                             "(or KE_BROKER_NAMESPACE and KE_BROKER_NAME)")
        if initial_offset not in INITIAL_OFFSETS:
            raise ValueError(f"initial offset {initial_offset!r} must be one of {', '.join(INITIAL_OFFSETS)}")
        self.settings = settings
        self.connection = connection
        self.source = channel_source
        # A Broker is served as a channel whose subscribers are its Triggers (dispatcher/triggers.py).
        self.key: ChannelKey = ((settings.broker_namespace, settings.broker_name) if self.broker
                                else (settings.source_namespace, settings.source_name) if self.kafka_source
                                else (settings.channel_namespace, settings.channel_name))
        self.registry = registry
        self.metrics = metrics_for(registry)
        self.initial_offset = initial_offset
        self.host = host
        self.port = settings.metrics_port if port is None else port
        self.shutdown_grace = shutdown_grace
        self.tracer = tracer
        self.max_outstanding = max_outstanding
        self.tokens = tokens  # audience-scoped tokens for destinations that declare an audience
        self._session = http_session
        self._own_session = http_session is None
        self._writer = status_writer or MemoryStatusWriter()
        self._factory = consumer_factory
        #: ResetOffsets of this dispatcher's groups (dispatcher/resets.py); None: not served (file mode, no CRD).
        self._resets = resets
        #: No member joins before the ResetOffsets are listed (run() sets it): a change of the channel seen while
        #: the list is still loading must not start a group whose reset is pending.
        self._resets_listed = resets is None
        self._subs: dict[str, _Running] = {}
        self._stopping_subs: dict[str, asyncio.Task[None]] = {}
        self._group_offsets: GroupOffsets | None = None  # made on first use (a Broker's dispatcher passes its own)
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliverer: Deliverer | None = None
        self._sender: PooledSender | None = None
        self.board = StatusBoard(self.key, self._writer)
        # Read when scraped: what /readyz would answer, for the DispatcherNotReady alert.
        self.metrics.ready.labels(*self.key).set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
        self.bound_port: int | None = None
        self._started = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask ``run()`` to finish (safe from a signal handler on the loop, or any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stop.set)

    async def wait_started(self) -> None:
        await self._started.wait()

    async def run(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        if self._session is None:
            # No connection limit: each subscription's in-flight budget is its own limit (isolation).
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300))
        # Plain-HTTP destinations through the dispatcher's own keep-alive client (http_client.py), the rest
        # through the aiohttp session.
        sender = self._sender = PooledSender(self._session, self.settings.tls_min_version)
        if self.tracer is None:
            self._deliverer = Deliverer(sender, self.metrics, self.settings.retry_after_max_seconds,
                                        tokens=self.tokens)
        else:
            from kafka_eventing.dispatcher.tracing import TracedDeliverer

            self._deliverer = TracedDeliverer(sender, self.metrics,
                                              self.settings.retry_after_max_seconds, tracer=self.tracer,
                                              broker=self.broker, tokens=self.tokens)
        runner: web.AppRunner | None = None
        try:
            if self.port >= 0:
                runner = await self._serve()
            self.board.start()
            if self.tokens is not None:
                self.tokens.start()

            def changed(_snapshot: Mapping[ChannelKey, Channel]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop may already be closed at shutdown
                    loop.call_soon_threadsafe(self._reconcile)

            self.source.subscribe(changed)
            await loop.run_in_executor(None, self.source.start)
            if self._resets is not None:
                # Listed before any member joins: a group whose reset is pending (a restart mid-reset) stays out.
                self._resets.bind(loop)
                await loop.run_in_executor(None, self._resets.start, self)
                self._resets_listed = True
            self._reconcile()
            if self._resets is not None:
                self._resets.kick()
            self._started.set()
            log.info("dispatcher started", extra={"channel": "/".join(self.key), "port": self.bound_port})
            await self._stop.wait()
        finally:
            log.info("dispatcher stopping", extra={"channel": "/".join(self.key)})
            if self._resets is not None:
                await self._resets.stop()
            await self._stop_all()
            self.source.stop()
            if self.tokens is not None:
                await asyncio.to_thread(self.tokens.stop)
            await self.board.stop()
            if runner is not None:
                await runner.cleanup()
            if self._sender is not None:
                self._sender.close()
            if self._own_session and self._session is not None:
                await self._session.close()

    # -- reconcile ----------------------------------------------------------------------------------
    def _channel(self) -> Channel | None:
        return self.source.get(self.key)

    def _reconcile(self) -> None:
        if self._stop.is_set() or not self._resets_listed:
            return
        channel = self._channel()
        wanted: dict[str, Subscriber] = {}
        if channel is not None:
            wanted = {s.uid: s for s in channel.subscribers}
            if not channel.ready:
                what = "Broker" if self.broker else "KafkaSource" if self.kafka_source else "channel"
                for sub in channel.subscribers:
                    self.board.set(sub.uid, sub.generation, False, f"{what} not ready: {channel.reason}",
                                   REASON_NOT_READY)
                wanted = {}
        for uid, sub in list(wanted.items()):
            if sub.held:
                # A Trigger not ready for dispatch (dispatcher/triggers.py): its group does not join, so it neither
                # receives nor commits anything until then (a new group then starts at the latest offset).
                self.board.set(uid, sub.generation, False, sub.held, REASON_TRIGGER_NOT_READY)
                del wanted[uid]
                continue
            problem = sub.delivery.dead_letter_problem
            if problem:
                # Consuming without the sink would drop (and commit) every event that fails: hold them in Kafka.
                self.board.set(uid, sub.generation, False, problem, REASON_DEAD_LETTER)
                del wanted[uid]
                continue
            if channel is not None and self._resets is not None and self._resets.holds(self.group_of(channel, sub)):
                del wanted[uid]  # its group is being reset: the member stays out until the reset is done
        self._apply(channel, wanted)
        if channel is None:
            return
        known = {sub.uid for sub in channel.subscribers}
        for entry in self.board.document()["status"]["subscribers"]:
            if entry["uid"] not in known:
                self.board.remove(entry["uid"])

    def _apply(self, channel: Channel | None, wanted: dict[str, Subscriber]) -> None:
        """Consume for exactly the ``wanted`` subscribers: one consumer group each."""
        # A subscriber gone from the channel (its Subscription deleted) takes its group along; a KafkaSource's topics
        # share one group, and a deleted channel's groups are the controller's to delete.
        listed = {s.uid for s in channel.subscribers} if channel is not None else set()
        for uid, current in list(self._subs.items()):
            if uid not in wanted or channel is None or current.consumer.topic != (wanted[uid].topic or channel.topic):
                gone = channel is not None and uid not in listed and not self.kafka_source
                self._retire(uid, forget=self.group_of(channel, current.consumer.subscriber)
                             if channel is not None and gone else None)
        if channel is None:
            return
        for uid, sub in wanted.items():
            running = self._subs.get(uid)
            if running is None:
                self._launch(channel, sub)
            elif running.consumer.subscriber != sub:
                log.info("subscriber changed, applying", extra={"subscriber": uid})
                running.consumer.update(sub)

    async def _delete_group(self, group: str, attempts: int = 8) -> None:
        """Delete a group this replica has left. The other replicas' members leave it at their own pace (each
        deletes too; the first to find it empty wins), so a non-empty group is retried for about a minute."""
        if self._group_offsets is None:
            self._group_offsets = AdminGroupOffsets(self.connection.admin_config())
        for attempt in range(attempts):
            try:
                await asyncio.to_thread(self._group_offsets.delete, group)
                log.info("consumer group deleted", extra={"group": group})
                return
            except KafkaException as exc:
                if attempt == attempts - 1:
                    log.warning("consumer group not deleted", extra={"group": group, "error": str(exc)})
                    return
            await asyncio.sleep(min(15.0, 0.5 * 2**attempt))

    def group_of(self, channel: Channel, sub: Subscriber) -> str:
        """The consumer group of one subscriber (a KafkaSource's own, a Trigger's, or a channel subscription's)."""
        return sub.group or (kb.trigger_group(channel.namespace, sub.uid) if self.broker
                             else self.settings.consumer_group_for(channel.namespace, channel.name, sub.uid))

    # -- ResetOffset (dispatcher/resets.py) -----------------------------------------------------------
    def group_subscriber(self, group: str) -> str | None:
        uids = self._group_subscribers(group)
        return uids[0] if uids else None

    def _group_subscribers(self, group: str) -> list[str]:
        """The subscribers whose consumer group is ``group``: one, or a KafkaSource's topics (one group)."""
        channel = self._channel()
        return [s.uid for s in channel.subscribers if self.group_of(channel, s) == group] \
            if channel is not None else []

    async def pause_group(self, group: str) -> None:
        """Stop the group's members (no new records; in-flight deliveries finish within the shutdown grace, the
        finished marks are committed, each member leaves the group) and keep them out while ``Resets.holds``
        says so. The other subscriptions are not touched."""
        uids = self._group_subscribers(group)
        if not uids:
            return
        self._reconcile()
        leaving = [task for uid in uids if (task := self._stopping_subs.get(uid)) is not None]
        if leaving:
            await asyncio.gather(*leaving, return_exceptions=True)

    def resume_group(self, group: str) -> None:
        """The member joins again (from the committed offsets), unless the dispatcher is stopping."""
        self._reconcile()

    def _launch(self, channel: Channel, sub: Subscriber) -> None:
        assert self._deliverer is not None
        group = self.group_of(channel, sub)
        config = consumer_settings(self.settings, self.connection, group, self.initial_offset,
                                   channel.num_partitions)
        kwargs: dict[str, Any] = {} if self._factory is None else {"consumer_factory": self._factory}
        consumer = SubscriptionConsumer(
            channel, sub, group_id=group, consumer_config=config, deliverer=self._deliverer,
            metrics=self.metrics, board=self.board, max_in_flight=self.settings.max_in_flight,
            shutdown_grace=self.shutdown_grace, max_outstanding=self.max_outstanding,
            queue_bytes=max(128, self.settings.queued_max_messages_kbytes) * 1024 // 4, **kwargs)
        previous = self._stopping_subs.get(sub.uid)
        self.board.set(sub.uid, sub.generation, False, JOINING, REASON_JOINING)
        task = asyncio.get_running_loop().create_task(self._supervise(consumer, previous), name=f"sub-{sub.uid}")
        self._subs[sub.uid] = _Running(consumer, task)
        log.info("subscriber started", extra={"subscriber": sub.uid, "group": group,
                                              "uri": sub.subscriber_uri, "ordered": consumer.ordered})

    async def _supervise(self, consumer: SubscriptionConsumer, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)  # same group: let the old member leave first
        failures = 0
        while True:
            try:
                await consumer.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                sub = consumer.subscriber
                log.exception("subscription consumer failed, restarting", extra={"subscriber": sub.uid})
                self.board.set(sub.uid, sub.generation, False, f"consumer failed: {type(exc).__name__}: {exc}",
                               REASON_FAILED)
                await asyncio.sleep(min(30.0, 0.5 * 2**failures))

    def _retire(self, uid: str, forget: str | None = None) -> None:
        """Stop the subscriber's consumer; then, with ``forget``, delete that consumer group."""
        running = self._subs.pop(uid)
        running.consumer.stop()
        log.info("subscriber removed", extra={"subscriber": uid, "delete_group": bool(forget)})

        async def wait() -> None:
            await asyncio.gather(running.task, return_exceptions=True)
            if forget:
                await self._delete_group(forget)
            if self._stopping_subs.get(uid) is task:
                del self._stopping_subs[uid]

        task = asyncio.get_running_loop().create_task(wait())
        self._stopping_subs[uid] = task

    async def _stop_all(self) -> None:
        for uid in list(self._subs):
            self._retire(uid)
        pending = list(self._stopping_subs.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- probes -------------------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, str]:
        if not self.source.synced():
            return False, "channel source not synced"
        channel = self._channel()
        if channel is None:
            what = "Broker" if self.broker else "KafkaSource" if self.kafka_source else "KafkaChannel"
            return False, f"{what} {'/'.join(self.key)} not found"
        waiting = self._waiting()
        if waiting:
            return False, f"consumer groups not joined yet: {', '.join(sorted(waiting))}"
        return True, "ok"

    def _waiting(self) -> list[str]:
        """The subscribers whose consumer has not joined yet."""
        return [uid for uid, r in self._subs.items() if not r.consumer.joined]

    def _stats(self) -> dict[str, Any]:
        return {uid: r.consumer.stats() for uid, r in self._subs.items()}

    def status_document(self) -> dict[str, Any]:
        doc = self.board.document()
        doc["subscriptions"] = self._stats()
        return doc

    async def _serve(self) -> web.AppRunner:
        app = web.Application()
        registry = self.metrics.registry

        async def healthz(_request: web.Request) -> web.Response:
            return web.json_response({"status": "alive"})

        async def readyz(_request: web.Request) -> web.Response:
            ready, reason = self.readiness()
            return web.json_response({"ready": ready, "reason": reason}, status=200 if ready else 503)

        async def metrics(_request: web.Request) -> web.Response:
            body = generate_latest(registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def status(_request: web.Request) -> web.Response:
            return web.json_response(self.status_document())

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/status", status)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.bound_port = int(sockets[0].getsockname()[1]) if sockets else self.port
        return runner
