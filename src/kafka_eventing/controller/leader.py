"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Expiry is judged by the local clock from when this process last saw the lease record change (not from the
holder's ``renewTime``), so clock skew between replicas cannot make two of them leaders. Writes use the read
``resourceVersion``: of two candidates racing for an expired lease, one gets a 409 and stays a follower.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


def _micro_time(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started: Callable[[], None] | None = None,
        on_stopped: Callable[[], None] | None = None,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_started, self.on_stopped = on_started, on_stopped
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion)
        self._observed_at = 0.0
        self._last_renewed = 0.0

    @property
    def is_leader(self) -> bool:
        # Past the renew deadline without a successful renew, act as a follower even before the loop notices.
        return self._leader.is_set() and time.monotonic() - self._last_renewed < self.renew_deadline

    def wait_leader(self, timeout: float) -> bool:
        return self._leader.wait(timeout)

    def holder(self) -> str | None:
        return self._observed[0] if self._observed else None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"lease:{self.name}", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.retry_period + 10)
            self._thread = None
        if release and self._leader.is_set():
            self._release()
        self._lose()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                held = self._try_acquire_or_renew()
            except Exception as exc:  # API server unreachable: keep trying; is_leader lapses by itself
                log.warning("lease update failed", extra={"lease": self.name, "error": f"{type(exc).__name__}: {exc}"})
                held = False
            if held:
                self._last_renewed = time.monotonic()
                if not self._leader.is_set():
                    log.info("became leader", extra={"lease": self.name, "identity": self.identity})
                    self._leader.set()
                    if self.on_started:
                        self.on_started()
            elif self._leader.is_set() and time.monotonic() - self._last_renewed >= self.renew_deadline:
                log.warning("lost leadership", extra={"lease": self.name, "identity": self.identity})
                self._lose()
            self._stop.wait(self.retry_period)

    def _lose(self) -> None:
        if self._leader.is_set():
            self._leader.clear()
            if self.on_stopped:
                self.on_stopped()

    # -- one round ----------------------------------------------------------------------------------
    def _body(self, resource_version: str | None, acquire_time: str, transitions: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_duration)),
                     "acquireTime": acquire_time, "renewTime": _micro_time(), "leaseTransitions": transitions},
        }

    def _try_acquire_or_renew(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=(5, 10))
        except ApiException as exc:
            if exc.status != HTTP_NOT_FOUND:
                raise
            try:
                self.api.create_namespaced_lease(self.namespace, self._body(None, _micro_time(), 0),
                                                 _request_timeout=(5, 10))
            except ApiException as create_exc:
                if create_exc.status == HTTP_CONFLICT:
                    return False  # another candidate created it first
                raise
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time), str(lease.metadata.resource_version))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.lease_duration_seconds or self.lease_duration)
        mine = holder == self.identity
        if not mine and holder and now - self._observed_at < duration:
            return False  # held by someone else and not expired
        transitions = int(spec.lease_transitions or 0) + (0 if mine else 1)
        acquire = _micro_time(spec.acquire_time) if mine and spec.acquire_time else _micro_time()
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace,
                                              self._body(lease.metadata.resource_version, acquire, transitions),
                                              _request_timeout=(5, 10))
        except ApiException as exc:
            if exc.status == HTTP_CONFLICT:
                return False
            raise
        return True

    def _release(self) -> None:
        """Hand the lease back at shutdown so the next replica need not wait for it to expire."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=(5, 10))
            if lease.spec.holder_identity != self.identity:
                return
            body = self._body(lease.metadata.resource_version, _micro_time(), int(lease.spec.lease_transitions or 0))
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            self.api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=(5, 10))
        except Exception as exc:
            log.warning("lease release failed", extra={"lease": self.name, "error": str(exc)})
