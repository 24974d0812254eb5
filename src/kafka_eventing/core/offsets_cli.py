"""`kafka-eventing offsets show|reset`: a consumer group's offsets from a terminal, for users without the
ResetOffset CRD.

``show`` prints per partition the committed offset, the high watermark and the lag. ``reset --to TIME`` (RFC 3339,
``earliest`` or ``latest``) prints the same table with the new offsets, asks before moving anything unless
``--yes``, and commits every partition in one request (applied whole or not at all).

Kafka moves a group's offsets only while the group has no active member, so ``reset`` refuses a group with
members and names them: stop the dispatcher (or use a ResetOffset, which pauses the members itself) first.
``--wait SECONDS`` waits that long for the members to leave (while you scale the dispatcher down). There is no
``--force``: Kafka itself would refuse the commit, and forcing members out would make them commit over it.

A Trigger's group never has members: its Broker's dispatcher reads the topic once, in the group
``knative-broker-dispatcher-<ns>-<broker>``, and commits each Trigger's group itself, so Kafka would accept the
commit and the running dispatcher would commit over it within a second. ``reset --trigger`` therefore also refuses
while that shared read has members (the Broker's dispatcher runs; ``--wait`` waits for it too), checks again just
before the commit, and exits 4 if the dispatcher joined while the commit was made. The reset of a running
dispatcher's group is the ResetOffset's: the CLI has only Kafka, and the dispatcher learns of resets only from the
API server. A Trigger's group is therefore named with ``--trigger`` (and ``--broker``), never ``--group`` alone.

The connection comes from the same ``KE_*`` settings as the roles (``KE_BOOTSTRAP_SERVERS``,
``KE_KAFKA_SECRET_DIR``, ``KE_KAFKA_PROVIDER``).
The group is named with ``--group``, or derived: ``--channel NS/NAME --subscription UID`` (the channel's template)
or ``--trigger NS/NAME``. A KafkaSource's group reads several topics: ``--group <spec.consumerGroup> --topic T1
--topic T2`` shows them all and moves them all in one commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException, TopicPartition

from kafka_eventing.core import brokers as kb
from kafka_eventing.core import resetoffsets as ro
from kafka_eventing.core.group_offsets import Committed, GroupOffsets, GroupOffsetsError, plan
from kafka_eventing.core.kafka_config import connection_from_settings
from kafka_eventing.core.settings import Settings, SettingsError

#: The marker a terminal reset leaves in the commit metadata (who moved the group, and from where).
CLI_UID = "cli"


def table(rows: Sequence[ro.PartitionMove], highs: dict[int, int], *, moving: bool) -> str:
    """partition, committed, [new,] high watermark, lag (after the move when moving)."""
    head = ["partition", "committed", *(["new"] if moving else []), "high", "lag"]
    lines = [head]
    for m in rows:
        at = m.new if moving else m.old
        lag = highs[m.partition] - at if at >= 0 else highs[m.partition]
        new = [f"{m.new}{' *' if m.before_retention else ''}"] if moving else []
        lines.append([str(m.partition), str(m.old) if m.old >= 0 else "-", *new, str(highs[m.partition]), str(lag)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in lines]
    if any(m.before_retention for m in rows):
        out.append("* the time is older than the oldest record kept (retention): the earliest kept offset")
    return "\n".join(out)


@dataclass(frozen=True)
class Named:
    """The group the arguments name, its topics, and for a Trigger the Broker whose dispatcher commits it."""

    group: str
    topics: list[str]
    broker: str | None = None  # NS/NAME
    reader: str | None = None  # the group of the Broker dispatcher's shared read


def named(args: argparse.Namespace, settings: Settings) -> Named:
    topics = list(args.topic or ())
    if args.trigger:
        ns, _, name = args.trigger.partition("/")
        broker = args.broker or "default"
        return Named(args.group or kb.trigger_group(ns, name), topics or [kb.broker_topic(ns, broker)],
                     f"{ns}/{broker}", kb.reader_group(ns, broker))
    if args.channel:
        ns, _, name = args.channel.partition("/")
        if not args.subscription and not args.group:
            raise SettingsError("--channel needs --subscription UID (or --group)")
        group = args.group or settings.consumer_group_for(ns, name, args.subscription)
        return Named(group, topics or [settings.topic_for(ns, name)])
    if not args.group or not topics:
        raise SettingsError("name the group: --group G --topic T [--topic T2 ...], --channel NS/NAME "
                            "--subscription UID, or --trigger NS/NAME [--broker NAME]")
    if args.command == "reset" and args.group.startswith(kb.TRIGGER_GROUP_PREFIX):
        # Without the Broker there is no telling whether its dispatcher runs and would commit over the reset.
        raise SettingsError(f"{args.group} is a Trigger's group: name it with --trigger NS/NAME --broker NAME, "
                            "so that its Broker's dispatcher is checked")
    return Named(args.group, topics)


def refusal(offsets: GroupOffsets, target: Named) -> str | None:
    """Why the group cannot be moved now (someone would commit over it), or None."""
    members = offsets.members(target.group)
    if not members.empty:
        return (f"refused: the group has {members.count} active member(s) ({', '.join(members.clients)}); Kafka "
                "moves a group's offsets only while it is empty. Stop its dispatcher, use a ResetOffset, or --wait.")
    if target.reader is not None:
        readers = offsets.members(target.reader)
        if not readers.empty:
            return (f"refused: the dispatcher of Broker {target.broker} is running ({readers.count} member(s) in "
                    f"{target.reader}: {', '.join(readers.clients)}) and commits the Trigger's group itself, over "
                    "any reset from here. Use a ResetOffset, or stop the Broker's dispatcher first (or --wait).")
    return None


def run(args: argparse.Namespace, offsets: GroupOffsets, settings: Settings,
        ask: Callable[[str], str] = input, out: Callable[[str], None] = print) -> int:
    target = named(args, settings)
    group, topics = target.group, target.topics
    parts = {t: offsets.partitions(t) for t in topics}

    def read_committed() -> dict[str, dict[int, Committed]]:
        return {t: offsets.committed(group, t, ps) for t, ps in parts.items()}

    committed = read_committed()
    highs = {t: {p: w.high for p, w in offsets.watermarks(t, ps).items()} for t, ps in parts.items()}
    if args.command == "show":
        for t in topics:
            out(f"group {group}, topic {t}")
            rows = [ro.PartitionMove(t, p, committed[t][p].offset, committed[t][p].offset) for p in parts[t]]
            out(table(rows, highs[t], moving=False))
        members = offsets.members(group)
        out(f"members: {members.count} ({members.state.lower()})")
        if target.reader is not None:
            readers = offsets.members(target.reader)
            out(f"Broker {target.broker} dispatcher: {readers.count} member(s) in {target.reader} "
                f"({readers.state.lower()})")
        return 0
    when = ro.parse_time(args.to)
    if all(c.offset < 0 for per in committed.values() for c in per.values()):
        out(f"group {group} has no committed offsets on {', '.join(topics)}: nothing to move")
        return 1
    deadline = time.monotonic() + args.wait
    refused = refusal(offsets, target)
    while refused is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        refused = refusal(offsets, target)
    if refused is not None:
        out(refused)
        return 3
    committed = read_committed()
    moves: list[ro.PartitionMove] = []
    for t in topics:
        planned = plan(offsets, t, committed[t], earliest=when.earliest, latest=when.latest, millis=when.millis)
        out(f"group {group}, topic {t}")
        out(table(planned, highs[t], moving=True))
        moves += planned
    if not args.yes and ask(f"move group {group} to {when.text}? [y/N] ").strip().lower() not in ("y", "yes"):
        out("nothing moved")
        return 1
    # The question may have taken minutes: a Broker's dispatcher started meanwhile would not stop Kafka's commit.
    refused = refusal(offsets, target) if target.reader is not None else None
    if refused is not None:
        out(f"nothing moved: {refused}")
        return 3
    marker = ro.marker(CLI_UID, int(time.time()), 0)
    try:
        # Every partition of every topic in one request: applied whole or not at all.
        offsets.commit(group, [TopicPartition(m.topic, m.partition, m.new, marker) for m in moves])
    except (GroupOffsetsError, KafkaException) as exc:
        out(f"nothing moved: {exc}")
        return 3
    out(f"moved {sum(1 for m in moves if m.new != m.old)} of {len(moves)} partitions")
    if target.reader is not None and not (readers := offsets.members(target.reader)).empty:
        # It joined between the last check and the commit: it may have read the old offsets and commit them again.
        out(f"but the dispatcher of Broker {target.broker} started meanwhile ({readers.count} member(s) in "
            f"{target.reader}) and may commit over the reset: check with `offsets show`, or use a ResetOffset")
        return 4
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-eventing offsets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("show", "print the group's committed offsets, high watermarks and lag"),
                        ("reset", "move every partition of the group to a point in time")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--group", help="the consumer group")
        s.add_argument("--topic", action="append", help="its topic (derived with --channel or --trigger); repeat "
                                                        "it for a group over several (a KafkaSource's), moved in "
                                                        "one commit")
        s.add_argument("--channel", metavar="NS/NAME", help="a KafkaChannel (with --subscription)")
        s.add_argument("--subscription", metavar="UID", help="the Subscription's uid (the channel's subscriber)")
        s.add_argument("--trigger", metavar="NS/NAME", help="a Trigger of a Kafka Broker (with --broker)")
        s.add_argument("--broker", metavar="NAME", help="the Trigger's Broker (for its topic)")
        if name == "reset":
            s.add_argument("--to", required=True, help="RFC 3339 time with a zone, earliest or latest")
            s.add_argument("--yes", action="store_true", help="do not ask before moving")
            s.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                           help="wait up to this long for the group's members (for a Trigger: its Broker's "
                                "dispatcher) to leave (default: refuse at once)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = Settings.from_env()
        connection = connection_from_settings(settings)
        return run(args, GroupOffsets(connection.admin_config()), settings)
    except (SettingsError, ro.SpecError, GroupOffsetsError) as exc:
        print(f"offsets: {exc}", file=sys.stderr)
        return 2
