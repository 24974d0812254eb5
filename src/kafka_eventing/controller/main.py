"""`kafka-eventing controller`: reconciles KafkaChannels (topic, dispatcher Deployment, channel Service, status),
Kafka-class Brokers (topic, dispatcher, address) with their Triggers (subscriber, dependency, dead-letter sink,
status), KafkaSinks (topic, address), KafkaSources (dispatcher Deployment, initial offsets, scale) and ResetOffsets
(kafka.eventing.knative.dev/v1alpha1: the ref resolved, the reset handed to the dispatcher that owns the group)
and EventPolicies (eventing.knative.dev/v1alpha1: the targets' status.policies; their own status with
KE_EVENT_POLICY_STATUS), each served when the API server serves its CRD, on the Kubernetes API (in a pod its
service account; outside KE_KUBECONFIG or KUBECONFIG).

Settings come from KE_* variables (docs/settings.md lists every one; the controller's own: KE_SYSTEM_NAMESPACE,
KE_TOPIC_MANAGEMENT, KE_DELETE_TOPICS, KE_DISPATCHER_IMAGE, KE_DISPATCHER_REPLICAS, KE_RECEIVER_SERVICE,
KE_RECEIVER_DEPLOYMENT); the flags below are the controller process's own knobs.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType

from kafka_eventing.controller.connection import DEFAULT_CONFIG_MAP
from kafka_eventing.controller.controller import Controller, ControllerOptions
from kafka_eventing.core import logging as ke_logging
from kafka_eventing.core.kube import api_client
from kafka_eventing.core.settings import Settings, SettingsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kafka-eventing controller", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=8, help="parallel reconciles (default 8)")
    p.add_argument("--resync-seconds", type=float, default=300.0, help="re-check every channel this often")
    p.add_argument("--health-port", type=int, default=None,
                   help="port of /healthz, /readyz, /metrics (default: KE_METRICS_PORT)")
    p.add_argument("--health-address", default="0.0.0.0", help="address the health/metrics server binds")
    p.add_argument("--lease-name", default="kafka-channel-controller", help="Lease used for leader election")
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    p.add_argument("--config-map", default=DEFAULT_CONFIG_MAP,
                   help="ConfigMap in the system namespace with bootstrap.servers / auth.secret.ref.name")
    p.add_argument("--topic-recheck-seconds", type=float, default=60.0,
                   help="re-check an unchanged channel's topic in Kafka at most this often")
    p.add_argument("--kafka-timeout", type=float, default=10.0, help="seconds per Kafka Admin API call")
    p.add_argument("--identity", default=os.environ.get("POD_NAME", ""),
                   help="leader-election identity (default: POD_NAME, else hostname + random)")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        api = api_client(settings.kubeconfig, pool_size=args.workers + 16)
    except SettingsError as exc:
        raise SystemExit(f"controller: {exc}") from None  # one line saying what to set, not a traceback
    ke_logging.configure(settings.log_level, settings.log_format)
    options = ControllerOptions(
        workers=args.workers, resync_seconds=args.resync_seconds,
        health_port=settings.metrics_port if args.health_port is None else args.health_port,
        health_address=args.health_address, topic_recheck_seconds=args.topic_recheck_seconds,
        lease_name=args.lease_name, lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
        retry_period=args.retry_period, config_map=args.config_map, kafka_timeout=args.kafka_timeout,
        identity=args.identity,
    )
    controller = Controller(api, settings, options)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    controller.start()
    print(f"controller {controller.identity} started; health on :{controller.health_port}", flush=True)
    stop.wait()
    controller.stop()  # hands the lease back so a standby takes over without waiting for expiry
