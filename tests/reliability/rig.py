"""One scenario's setup: a topic, the channel file, a receiver, dispatchers, subscribers, load, and the verdict.

``Rig.verdict`` records the scenario's numbers for docs/reliability.md before it asserts the pass criteria, so a
failing scenario still shows what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    NS,
    DispatcherProcess,
    Ledger,
    LoadGenerator,
    ReceiverProcess,
    Recorder,
    Tally,
    check,
    create_topic,
    delete_topic,
    write_broker,
    write_channel,
)

from kafka_eventing.core import brokers as kb
from kafka_eventing.localstack.kafka import KafkaNode
from waiting import wait_for


@dataclass
class Row:
    scenario: str
    subscription: str
    tally: Tally
    seconds: float
    notes: list[str] = field(default_factory=list)
    passed: bool | None = None  # filled in from the test's outcome


@dataclass
class Watch:
    """What a subscription must show: acknowledged at ``path``, or taken by the sink at ``dls`` (on ``sink``)."""

    path: str
    dls: str | None = None
    sink: Recorder | None = None


class Rig:
    def __init__(self, kafka: KafkaNode, workdir: Path, report: Callable[[Row], None], *,
                 partitions: int = 3, name: str = "orders") -> None:
        self.kafka, self.workdir, self._report = kafka, workdir, report
        self.name, self.partitions = name, partitions
        self.topic = create_topic(kafka, partitions)
        self.channels = workdir / "channels.yaml"
        self.subscribers = Recorder().start()
        self.ledger = Ledger()
        self.receiver: ReceiverProcess | None = None
        self.dispatchers: list[DispatcherProcess] = []
        self.loads: list[LoadGenerator] = []
        self.extra: list[Any] = []  # more parts to stop (e.g. a dead-letter sink)
        self._subs: list[dict[str, Any]] = []
        self.is_broker = False
        self.started = time.monotonic()

    # -- parts --------------------------------------------------------------------------------------------------
    def channel(self, subscriptions: list[dict[str, Any]], partitions: int | None = None) -> None:
        self._subs = subscriptions
        if partitions is not None:
            self.partitions = partitions
        write_channel(self.channels, self.name, self.topic, self.partitions, subscriptions)

    def broker(self, triggers: list[dict[str, Any]]) -> None:
        """Serve a Broker (on the same topic) instead of a channel: ``triggers`` from ``harness.trigger``."""
        self.is_broker = True
        write_broker(self.channels, self.name, self.topic, triggers)

    def group(self, uid: str) -> str:
        return kb.trigger_group(NS, uid) if self.is_broker else f"kafka.{NS}.{self.name}.{uid}"

    def start_receiver(self, env: dict[str, str] | None = None) -> ReceiverProcess:
        self.receiver = ReceiverProcess(self.kafka, self.channels, self.workdir, env=env).start()
        return self.receiver

    def add_dispatcher(self, kafka_extra: str = "", wait: bool = True,
                       env: dict[str, str] | None = None) -> DispatcherProcess:
        proc = DispatcherProcess(self.kafka, self.name, self.channels, self.workdir, kafka_extra,
                                 broker=self.is_broker, env=env)
        self.dispatchers.append(proc)
        if wait:
            wait_for(proc.ready, 90, "dispatcher joined its consumer groups", interval=0.2)
        return proc

    def owners(self, uid: str) -> list[set[int]]:
        """Per running dispatcher, the partitions it owns for subscription ``uid``."""
        return [d.partitions().get(uid, set()) for d in self.dispatchers if d.proc.poll() is None]

    def wait_spread(self, uid: str, members: int, timeout: float = 90.0) -> None:
        """Until ``members`` running dispatchers each own some partitions of ``uid`` and together all of them."""
        def spread() -> bool:
            owned = self.owners(uid)
            union = set().union(*owned) if owned else set()
            return (len(owned) == members and all(owned) and union == set(range(self.partitions))
                    and sum(map(len, owned)) == self.partitions)

        wait_for(spread, timeout, f"{uid}'s partitions spread over {members} dispatchers", interval=0.2)

    def load(self, **kw: Any) -> LoadGenerator:
        assert self.receiver is not None
        gen = LoadGenerator(f"{self.receiver.url}/{NS}/{self.name}", self.ledger, **kw)
        self.loads.append(gen)
        return gen.start()

    # -- checking -----------------------------------------------------------------------------------------------
    def _reached(self, watch: Watch) -> set[str]:
        got = {r.event_id for r in self.subscribers.delivered(watch.path)}
        if watch.dls:
            got |= {r.event_id for r in (watch.sink or self.subscribers).delivered(watch.dls)}
        return got

    def settle(self, watches: list[Watch], timeout: float = 120.0) -> None:
        """Until every 202'd id reached every watched subscription (or ``timeout``), then a moment for strays."""
        accepted = self.ledger.accepted()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(accepted <= self._reached(w) for w in watches):
            time.sleep(0.2)
        time.sleep(1.5)  # late duplicates still in flight count too

    def tally(self, watch: Watch) -> Tally:
        sink = watch.sink or self.subscribers
        return check(self.ledger, self.subscribers.delivered(watch.path),
                     sink.delivered(watch.dls) if watch.dls else None)

    def verdict(self, scenario: str, watches: dict[str, Watch], *, notes: list[str] | None = None,
                settle_timeout: float = 120.0, max_duplicate_ratio: float | None = None) -> dict[str, Tally]:
        """Settle, record every subscription's row, then assert the pass criteria (all rows are recorded first)."""
        for gen in self.loads:
            gen.stop()
        self.settle(list(watches.values()), settle_timeout)
        seconds = time.monotonic() - self.started
        tallies = {uid: self.tally(w) for uid, w in watches.items()}
        for uid, tally in tallies.items():
            abandoned = sum(len(g.abandoned) for g in self.loads)
            row_notes = list(notes or [])
            if abandoned:
                row_notes.append(f"{abandoned} ids never got a 202 within the senders' retry window")
            self._report(Row(scenario, uid, tally, seconds, row_notes))
        for uid, tally in tallies.items():
            assert tally.accepted > 0, f"{scenario}/{uid}: no event was accepted — the scenario proved nothing"
            assert tally.lost == 0, f"{scenario}/{uid}: {tally.lost} accepted events lost, e.g. {tally.lost_ids}"
            assert tally.unaccepted_delivered == 0, (
                f"{scenario}/{uid}: delivered without a 202: {tally.unaccepted_ids}")
            if max_duplicate_ratio is not None:
                assert tally.duplicate_ratio <= max_duplicate_ratio, (
                    f"{scenario}/{uid}: {tally.duplicates} duplicates of {tally.delivered + tally.duplicates} "
                    f"deliveries")
        return tallies

    def kept_rate(self, path: str, start: float, end: float, slack: float = 2.0) -> float:
        """Share of the events accepted in [start, end) that ``path`` acknowledged within ``slack`` s of their 202.

        The load is offered at a fixed rate, so a subscription slowed by another shows as a falling share here.
        """
        accepted_at = {i: at for i, at in self.ledger.accepted_at.items() if start <= at < end}
        if not accepted_at:
            return 0.0
        first: dict[str, float] = {}
        for receipt in self.subscribers.delivered(path):
            first.setdefault(receipt.event_id, receipt.at)
        kept = sum(1 for i, at in accepted_at.items() if i in first and first[i] - at <= slack)
        return kept / len(accepted_at)

    # -- teardown -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        for gen in self.loads:
            gen.stop()
        for proc in self.dispatchers:
            proc.stop()
        if self.receiver is not None:
            self.receiver.stop()
        for part in (*self.extra, self.subscribers):
            part.stop()
        if not self.kafka.running:
            self.kafka.start()
        delete_topic(self.kafka, self.topic)
