"""The receiver's Kafka connections: one ``KafkaSender`` per distinct cluster + Secret that a target names.

A Broker's config or a KafkaSink may name a Kafka cluster other than the receiver's own; the controller writes
that connection on the target's status (``core.kafka_config.ConnectionRef``), and its events must go there — a
202 for an event written to another cluster would be a lie. Each connection gets what the receiver's own has: a
batching and an immediate producer with their ``Linger`` switch, polled by the worker's ``LoopPoller``.

- Made on first use, off the loop (the Secret is read from the API server), once even when many requests ask.
- Bounded (``KE_MAX_KAFKA_CONNECTIONS`` per worker): past the bound a request gets a 503 naming it, never a
  write to the wrong cluster. A connection that could not be made (a missing Secret, a bad config) is refused
  for ``retry`` seconds without asking again, so a broken target cannot hammer the API server.
- Closed (flushed, then dropped) once no target names it; a rotated Secret changes the checksum in the target's
  status, so the next request makes a producer with the new credentials and the old one is closed.

The hot path costs nothing for targets on the receiver's own cluster (``channel.connection is None``) and one
dictionary access for the others (``senders``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

from kafka_eventing.core.kafka_config import ConnectionRef
from kafka_eventing.receiver.sender import KafkaSender, LoopPoller

log = logging.getLogger(__name__)


class ConnectionUnavailable(Exception):
    """No sender for a connection (yet): the message says why, without any secret."""


class Connections:
    """Senders by connection; the receiver's own under ``None``. ``factory`` runs in a thread (it may block)."""

    def __init__(self, default: KafkaSender, factory: Callable[[ConnectionRef], KafkaSender] | None = None, *,
                 limit: int = 16, retry: float = 5.0, close_timeout: float = 10.0) -> None:
        self.default = default
        self.senders: dict[ConnectionRef | None, KafkaSender] = {None: default}
        self.factory, self.limit, self.retry, self.close_timeout = factory, limit, retry, close_timeout
        self.poller: LoopPoller | None = None  # the loop's poller, set by the resource that makes it
        self._making: dict[ConnectionRef, asyncio.Future[KafkaSender]] = {}
        self._failed: dict[ConnectionRef, tuple[float, str]] = {}
        self._closers: list[threading.Thread] = []

    def __len__(self) -> int:
        """Connections other than the receiver's own."""
        return len(self.senders) - 1

    async def connect(self, ref: ConnectionRef, poller: LoopPoller) -> KafkaSender:
        """The sender for ``ref``, made now if need be; raises ``ConnectionUnavailable``."""
        sender = self.senders.get(ref)
        if sender is not None:
            return sender
        making = self._making.get(ref)
        if making is not None:
            return await asyncio.shield(making)
        now = poller.loop.time()
        failed = self._failed.get(ref)
        if failed is not None and failed[0] > now:
            raise ConnectionUnavailable(failed[1])
        if self.factory is None:
            raise ConnectionUnavailable(f"this receiver writes only to its own Kafka cluster, not to "
                                        f"{ref.bootstrap_servers}")
        if len(self) + len(self._making) >= self.limit:
            raise ConnectionUnavailable(
                f"this receiver worker already writes to {self.limit} other Kafka clusters (KE_MAX_KAFKA_CONNECTIONS);"
                f" {ref.bootstrap_servers} gets a producer once a target on another one is deleted")
        future: asyncio.Future[KafkaSender] = poller.loop.create_future()
        self._making[ref] = future
        try:
            sender = await asyncio.to_thread(self.factory, ref)
        except Exception as exc:  # every failure becomes a 503 naming it, for ``retry`` seconds
            why = f"Kafka connection to {ref.bootstrap_servers} cannot be made: {exc}"
            log.warning("kafka connection failed", extra={"servers": ref.bootstrap_servers, "secret": ref.secret,
                                                          "error": str(exc)})
            self._failed[ref] = (now + self.retry, why)
            future.set_exception(ConnectionUnavailable(why))
            future.exception()  # retrieved: nobody else may be waiting
            raise ConnectionUnavailable(why) from None
        finally:
            self._making.pop(ref, None)
        self._failed.pop(ref, None)
        self.senders[ref] = sender
        poller.add(sender.producer, sender.immediate)
        log.info("kafka connection made", extra={"servers": ref.bootstrap_servers, "secret": ref.secret,
                                                 "connections": len(self)})
        future.set_result(sender)
        return sender

    def retain(self, used: Iterable[ConnectionRef]) -> None:
        """Close every connection not in ``used`` (the targets' connections now). Any thread; runs on the loop."""
        poller = self.poller
        if poller is None:
            return  # no request has come yet: nothing but the receiver's own exists
        keep = frozenset(used)
        try:
            poller.loop.call_soon_threadsafe(self._retain, keep)
        except RuntimeError:  # the loop is closed: shutdown closes everything
            pass

    def _retain(self, keep: frozenset[ConnectionRef]) -> None:
        for ref in [r for r in self.senders if r is not None and r not in keep]:
            self._close(ref, self.senders.pop(ref))
        for ref in [r for r in self._failed if r not in keep]:
            del self._failed[ref]

    def _close(self, ref: ConnectionRef, sender: KafkaSender) -> None:
        if self.poller is not None:
            self.poller.remove(sender.producers)
        log.info("kafka connection closed: no target names it", extra={"servers": ref.bootstrap_servers,
                                                                        "secret": ref.secret})
        # Flushed off the loop: its last requests' reports reach the loop from that thread.
        closer = threading.Thread(target=sender.close, args=(self.close_timeout,), name="producer-close",
                                  daemon=True)
        closer.start()
        self._closers = [*(t for t in self._closers if t.is_alive()), closer]

    def close(self, timeout: float) -> int:
        """The ASGI lifespan shutdown (off the loop, once every request has its answer): flush and drop every
        connection but the receiver's own, which its owner closes. Returns the records still undelivered."""
        doomed = [ref for ref in self.senders if ref is not None]
        senders = [self.senders.pop(ref) for ref in doomed]
        if self.poller is not None:
            for sender in senders:
                self.poller.remove(sender.producers)
        left = sum(sender.close(timeout) for sender in senders)
        for closer in self._closers:
            closer.join(timeout)
        return left
