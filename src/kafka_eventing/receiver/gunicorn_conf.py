"""gunicorn configuration of the receiver: ``gunicorn -c python:kafka_eventing.receiver.gunicorn_conf``.

Worker model (chosen by bench/receiver.py, see docs/receiver.md): uvicorn workers running the ASGI app. A
request spends most of its life waiting for Kafka's delivery report; as a suspended coroutine it costs no
thread, so hundreds wait at once while librdkafka batches their records, for less CPU per event than gthread
workers running a WSGI app did. Command-line flags override everything here.
"""

from __future__ import annotations

import os
from typing import Any

from kafka_eventing.core.heap import freeze_startup_heap
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.metrics import prepare_multiprocess_dir, worker_exited

_settings = Settings.from_env()

bind = [f"0.0.0.0:{os.environ.get('PORT', '8080')}"]
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "kafka_eventing.receiver.server.ReceiverWorker"  # uvicorn workers; see receiver/server.py
wsgi_app = "kafka_eventing.receiver.app:get_app()"  # gunicorn's name for the app setting, ASGI included
# The producer and its threads must be created in the worker, never inherited across fork().
preload_app = False
keepalive = 75  # longer than common client/LB idle timeouts, so connections are reused rather than reset
timeout = 30
# In-flight requests may wait a whole produce timeout for their delivery report, then the flush runs.
graceful_timeout = int(_settings.produce_timeout_seconds * 2 + 5)
accesslog = None  # one JSON log line per failure is ours; an access log per event would cost more than it tells
if _settings.tls_cert_file and _settings.tls_key_file:
    # HTTPS: uvicorn makes each worker's SSL context from these; receiver.server reloads them on rotation.
    certfile, keyfile = str(_settings.tls_cert_file), str(_settings.tls_key_file)


def on_starting(server: Any) -> None:
    # Before any worker exists: every worker then writes its metrics to the same, freshly emptied directory.
    prepare_multiprocess_dir()


def post_worker_init(worker: Any) -> None:
    # get_app() has just created this worker's producer (after fork); say so once, without any secret.
    worker.log.info("receiver worker %s ready (producer created in-process)", worker.pid)
    freeze_startup_heap()  # core/heap.py: the cyclic GC was ~8 % of a worker's CPU before


def worker_exit(server: Any, worker: Any) -> None:
    # The ASGI lifespan shutdown has normally done this already (then a no-op); this covers a worker whose
    # lifespan never completed.
    from kafka_eventing.receiver import app

    app.shutdown()


def child_exit(server: Any, worker: Any) -> None:
    worker_exited(worker.pid)
