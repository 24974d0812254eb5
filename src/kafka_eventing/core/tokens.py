"""Audience-scoped tokens for outgoing requests: the dispatcher's own ServiceAccount tokens (TokenRequest), one per
audience, sent as ``Authorization: Bearer`` to destinations that declare an audience (``subscriberAudience``,
``replyAudience``, a dead-letter sink's ``audience``, a Broker's own ingress when ingress auth is on).

Tokens are cached per audience and refreshed by a background thread once ``REFRESH_AT`` of their lifetime has
passed, so a delivery reads the cache and never waits on the API — except the first one for an audience not seen
before, which waits for its first token (bounded by the API client's timeout). The token itself is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: The ServiceAccount every dispatcher Deployment runs as (the controller sets it; the chart's RBAC names it).
DISPATCHER_SERVICE_ACCOUNT = "kafka-channel-dispatcher"
#: Lifetime asked of the API (its minimum is 600 s; it may give less or more).
EXPIRATION_SECONDS = 3600
#: Fraction of a token's lifetime after which it is refreshed.
REFRESH_AT = 0.8
#: Wait between attempts when the API refuses or fails a TokenRequest.
RETRY_SECONDS = 10.0

#: Asks for a token for one audience: (token, seconds it is valid for).
Requester = Callable[[str], tuple[str, float]]


class TokenError(Exception):
    """No token could be obtained for an audience."""


@dataclass(frozen=True, slots=True)
class _Token:
    value: str
    refresh_at: float  # monotonic
    expires_at: float  # monotonic


class TokenSource:
    """Cached tokens per audience; ``start()`` runs the refresher, ``header(audience)`` is the delivery path's call."""

    def __init__(self, request: Requester, *, clock: Callable[[], float] = time.monotonic,
                 retry_seconds: float = RETRY_SECONDS) -> None:
        self._request = request
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._tokens: dict[str, _Token] = {}
        self._failed: dict[str, float] = {}  # audience → monotonic time of the last failed request
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = 0  # TokenRequests made, for tests and the status document

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._refresh_loop, name="token-refresh", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def cached(self, audience: str) -> str | None:
        """The audience's token if one is held and not expired; never calls the API."""
        token = self._tokens.get(audience)
        if token is None or self._clock() >= token.expires_at:
            return None
        return token.value

    async def header(self, audience: str) -> str:
        """``Bearer <token>`` for the audience: from the cache, or (first use) fetched off the event loop."""
        value = self.cached(audience)
        if value is None:
            value = await asyncio.to_thread(self.fetch, audience)
        return f"Bearer {value}"

    def fetch(self, audience: str) -> str:
        """A valid token for the audience, requesting one if none is held (one request per audience at a time)."""
        with self._guard:
            lock = self._locks.setdefault(audience, threading.Lock())
        with lock:
            value = self.cached(audience)
            if value is not None:
                return value
            return self._renew(audience)

    def _renew(self, audience: str) -> str:
        started = self._clock()
        try:
            value, valid_for = self._request(audience)
        except Exception as exc:
            self._failed[audience] = self._clock()
            # The audience only: the exception text of a client error never includes the token.
            raise TokenError(f"TokenRequest for audience {audience!r} failed: {type(exc).__name__}: {exc}") from None
        self.requests += 1
        self._failed.pop(audience, None)
        self._tokens[audience] = _Token(value, started + valid_for * REFRESH_AT, started + valid_for)
        self._wake.set()  # the refresher's next deadline may now be earlier
        return value

    def _due(self) -> tuple[list[str], float]:
        """Audiences whose token should be renewed now, and seconds until the next one is due."""
        now, due, wait = self._clock(), [], 60.0
        for audience, token in list(self._tokens.items()):
            at = token.refresh_at
            failed = self._failed.get(audience)
            if failed is not None:
                at = max(at, failed + self._retry_seconds)
            if at <= now:
                due.append(audience)
            else:
                wait = min(wait, at - now)
        return due, wait

    def _refresh_loop(self) -> None:
        while not self._stopped.is_set():
            self.refresh_due()
            _due, wait = self._due()
            self._wake.clear()
            self._wake.wait(timeout=max(wait, 0.05))

    def refresh_due(self) -> None:
        """Renew every token past its refresh point (the refresher's step; a failure keeps the old token)."""
        for audience in self._due()[0]:
            lock = self._locks.setdefault(audience, threading.Lock())
            with lock:
                try:
                    self._renew(audience)
                except TokenError as exc:
                    log.warning("token refresh failed, retrying", extra={"error": str(exc)})


def kube_requester(api_client: Any, namespace: str, service_account: str,
                   expiration_seconds: int = EXPIRATION_SECONDS) -> Requester:
    """TokenRequest for ``service_account`` in ``namespace`` (RBAC: create ``serviceaccounts/token`` on that one
    ServiceAccount)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def request(audience: str) -> tuple[str, float]:
        spec = client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=expiration_seconds)
        res = core.create_namespaced_service_account_token(
            service_account, namespace, client.AuthenticationV1TokenRequest(spec=spec), _request_timeout=10)
        expires = res.status.expiration_timestamp  # datetime (UTC)
        valid_for = expires.timestamp() - time.time() if expires is not None else float(expiration_seconds)
        return str(res.status.token), max(valid_for, 1.0)

    return request
