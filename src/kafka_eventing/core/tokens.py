"""Audience-scoped tokens for outgoing requests, each of the identity of the resource that sends: a Trigger, a
channel's Subscription or a KafkaSource has an OIDC ServiceAccount of its own in its own namespace (Knative's
``pkg/auth``: the controller creates it and names it in ``status.auth.serviceAccountName``), and the dispatcher asks
the API for that account's token (TokenRequest), one per audience, sent as ``Authorization: Bearer`` to destinations
that declare an audience (``subscriberAudience``, ``replyAudience``, a dead-letter sink's ``audience``, a Broker's
own ingress when ingress auth is on). A token thus says which resource sent, so an EventPolicy can name it, and a
token that leaks to a subscriber is worth no more than that resource's own right to send.

Tokens are cached per identity and audience and refreshed by a background thread once ``REFRESH_AT`` of their
lifetime has passed, so a delivery reads the cache and never waits on the API — except the first one for an identity
and audience not seen before, which waits for its first token (bounded by the API client's timeout). The token itself
is never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: The ServiceAccount every dispatcher Deployment runs as (the controller sets it; the chart's RBAC names it). Its
#: tokens are never sent: it may only request the tokens of the senders' OIDC accounts.
DISPATCHER_SERVICE_ACCOUNT = "kafka-channel-dispatcher"
#: The label on a sender's OIDC ServiceAccount (Knative's ``auth.OIDCLabelKey``).
OIDC_LABEL = "eventing.knative.dev/oidc"
#: The Role (in each namespace with senders) that lets the dispatchers request exactly that namespace's OIDC
#: accounts' tokens (``resourceNames``); the controller keeps it and its RoleBinding.
TOKEN_ROLE = "kafka-eventing-oidc-tokens"  # noqa: S105 - a Role's name
#: Kubernetes' longest object name, and the length of an md5 in hex (``kmeta.ChildName``).
_LONGEST, _MD5_LEN = 63, 32
#: Lifetime asked of the API (its minimum is 600 s; it may give less or more).
EXPIRATION_SECONDS = 3600
#: Fraction of a token's lifetime after which it is refreshed.
REFRESH_AT = 0.8
#: Wait between attempts when the API refuses or fails a TokenRequest.
RETRY_SECONDS = 10.0

#: A sender's identity: the (namespace, name) of the ServiceAccount whose tokens its deliveries carry.
Identity = tuple[str, str]
#: Asks for a token of one identity for one audience: (token, seconds it is valid for).
Requester = Callable[[Identity, str], tuple[str, float]]
#: What a token is cached under.
_Key = tuple[Identity, str]


def child_name(parent: str, suffix: str) -> str:
    """Knative's ``kmeta.ChildName``: ``parent + suffix``, the parent shortened and an md5 of it put in when the whole
    would pass 63 characters (the whole hashed when the suffix alone leaves no room)."""
    if len(parent) <= _LONGEST - len(suffix):
        return parent + suffix
    head = _LONGEST - _MD5_LEN
    if head - len(suffix) <= 0:
        out = parent[:head] + hashlib.md5((parent + suffix).encode(), usedforsecurity=False).hexdigest()
        if len(out) < _LONGEST:
            out += suffix[:_LONGEST - len(out)]
        return re.sub(r"[^a-zA-Z0-9]+$", "", out)  # a name ends in a letter or digit
    return parent[:head - len(suffix)] + hashlib.md5(parent.encode(), usedforsecurity=False).hexdigest() + suffix


def oidc_service_account(group: str, kind: str, name: str) -> str:
    """The OIDC ServiceAccount of a sender (Knative's ``GetOIDCServiceAccountNameForResource``), e.g.
    ``orders-oidc-eventing.knative.dev-trigger`` for the Trigger ``orders``."""
    return child_name(name, f"-oidc-{group}-{kind}").lower()


def identity_of(namespace: str, auth: object) -> Identity | None:
    """The identity a resource's ``auth`` (``status.auth`` or a subscriber's ``auth``) names; None without one."""
    name = auth.get("serviceAccountName") if isinstance(auth, dict) else None
    return (namespace, str(name)) if name else None


class TokenError(Exception):
    """No token could be obtained for an audience."""


@dataclass(frozen=True, slots=True)
class _Token:
    value: str
    refresh_at: float  # monotonic
    expires_at: float  # monotonic


class TokenSource:
    """Cached tokens per identity and audience; ``start()`` runs the refresher, ``header(identity, audience)`` is the
    delivery path's call."""

    def __init__(self, request: Requester, *, clock: Callable[[], float] = time.monotonic,
                 retry_seconds: float = RETRY_SECONDS) -> None:
        self._request = request
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._tokens: dict[_Key, _Token] = {}
        self._failed: dict[_Key, float] = {}  # key → monotonic time of the last failed request
        self._locks: dict[_Key, threading.Lock] = {}
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

    def cached(self, identity: Identity, audience: str) -> str | None:
        """The token of the identity for the audience if one is held and not expired; never calls the API."""
        token = self._tokens.get((identity, audience))
        if token is None or self._clock() >= token.expires_at:
            return None
        return token.value

    async def header(self, identity: Identity, audience: str) -> str:
        """``Bearer <token>``: from the cache, or (first use) fetched off the event loop."""
        value = self.cached(identity, audience)
        if value is None:
            value = await asyncio.to_thread(self.fetch, identity, audience)
        return f"Bearer {value}"

    def fetch(self, identity: Identity, audience: str) -> str:
        """A valid token, requesting one if none is held (one request per identity and audience at a time)."""
        key = (identity, audience)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            value = self.cached(identity, audience)
            if value is not None:
                return value
            return self._renew(key)

    def _renew(self, key: _Key) -> str:
        (namespace, account), audience = key
        started = self._clock()
        try:
            value, valid_for = self._request(*key)
        except Exception as exc:
            self._failed[key] = self._clock()
            # Names only: the exception text of a client error never includes the token.
            raise TokenError(f"TokenRequest for {namespace}/{account}, audience {audience!r}, failed: "
                             f"{type(exc).__name__}: {exc}") from None
        self.requests += 1
        self._failed.pop(key, None)
        self._tokens[key] = _Token(value, started + valid_for * REFRESH_AT, started + valid_for)
        self._wake.set()  # the refresher's next deadline may now be earlier
        return value

    def _due(self) -> tuple[list[_Key], float]:
        """Tokens that should be renewed now, and seconds until the next one is due."""
        now, due, wait = self._clock(), [], 60.0
        for key, token in list(self._tokens.items()):
            at = token.refresh_at
            failed = self._failed.get(key)
            if failed is not None:
                at = max(at, failed + self._retry_seconds)
            if at <= now:
                due.append(key)
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
        for key in self._due()[0]:
            lock = self._locks.setdefault(key, threading.Lock())
            with lock:
                try:
                    self._renew(key)
                except TokenError as exc:
                    log.warning("token refresh failed, retrying", extra={"error": str(exc)})


def kube_requester(api_client: Any, expiration_seconds: int = EXPIRATION_SECONDS) -> Requester:
    """TokenRequest for an identity's ServiceAccount (RBAC: create ``serviceaccounts/token`` on the senders'
    accounts by name, ``TOKEN_ROLE`` in each namespace)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)

    def request(identity: Identity, audience: str) -> tuple[str, float]:
        namespace, service_account = identity
        spec = client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=expiration_seconds)
        res = core.create_namespaced_service_account_token(
            service_account, namespace, client.AuthenticationV1TokenRequest(spec=spec), _request_timeout=10)
        expires = res.status.expiration_timestamp  # datetime (UTC)
        valid_for = expires.timestamp() - time.time() if expires is not None else float(expiration_seconds)
        return str(res.status.token), max(valid_for, 1.0)

    return request
