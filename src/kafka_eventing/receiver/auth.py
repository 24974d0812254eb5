"""Optional ingress authentication (``KE_AUTH_ISSUER``; off by default): a POST must carry a JWT from the issuer
— a Kubernetes service-account token (TokenRequest) or any OIDC provider's — naming the channel's audience.

The issuer's keys come from its JWKS, found through OIDC discovery (``<issuer>/.well-known/openid-configuration``)
and kept for ``KE_AUTH_KEYS_TTL_SECONDS`` (an unknown key id refetches, at most every 30 s); fetches run off
the event loop. Signature, issuer and expiry are checked
by PyJWT. No token or an invalid one: 401; a valid token for another audience: 403. Then who may send where
(``PolicyCheck``): the EventPolicies that apply to the target (``core.eventpolicies``, read from the API server or
the channels file), else the default mode (``KE_AUTH_DEFAULT_MODE``); refused: 403. All of these are answered
before the body is read; a policy's event filters run once it is read, before anything is produced — so nothing
refused reaches Kafka. When authentication is off, none of this is installed: the request path is the same as
without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import falcon
import falcon.asgi
import jwt

from kafka_eventing.broker.filters import FilterError, MatchAll, compile_filters, record_attributes
from kafka_eventing.core import brokers as kb
from kafka_eventing.core import eventpolicies as ep
from kafka_eventing.core import sinks as ks
from kafka_eventing.core.binding import KafkaRecord
from kafka_eventing.core.channels import GROUP as GROUP_CHANNELS
from kafka_eventing.core.channels import KIND as KIND_CHANNEL
from kafka_eventing.core.channels import Channel
from kafka_eventing.core.eventpolicies import DefaultMode
from kafka_eventing.core.settings import Settings
from kafka_eventing.receiver.ingress import Answer, Ingress

if TYPE_CHECKING:
    from kafka_eventing.broker.filters import Filter
    from kafka_eventing.core.channel_source import PolicySource

log = logging.getLogger(__name__)

#: Asymmetric algorithms only: a JWKS holds public keys, and "none"/HMAC must never verify a token.
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA"]
FETCH_TIMEOUT = 5.0
#: Verified tokens remembered per worker. A sender reuses one token for many requests (a projected ServiceAccount
#: token lives an hour) and a signature check costs more than the rest of a request, so each distinct token is
#: verified once and then only its expiry is checked; the oldest is forgotten past this many.
VERIFIED_TOKENS = 4096


class AuthError(Exception):
    """The issuer's discovery document or keys cannot be used."""


class TokenVerifier:
    """Verifies bearer tokens of one issuer against a channel's audience."""

    def __init__(self, issuer: str, *, ca_file: Path | None = None, token_file: Path | None = None,
                 keys_ttl: float = 300.0, refetch_cooldown: float = 30.0) -> None:
        self.issuer = issuer
        self.keys_ttl = keys_ttl
        # An unknown key id fetches the JWKS again at most this often, so tokens with made-up key ids cannot
        # make the receiver hammer the issuer.
        self.refetch_cooldown = refetch_cooldown
        self._token_file = token_file
        self._ssl = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        self._jwks: jwt.PyJWKClient | None = None
        self._keys: dict[str, tuple[jwt.PyJWK, float]] = {}  # kid → key, fetched at (monotonic)
        self._lock = threading.Lock()
        self._verified: OrderedDict[str, tuple[dict[str, Any], float]] = OrderedDict()  # token → claims, exp

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenVerifier | None:
        if not settings.auth_issuer:
            return None
        return cls(settings.auth_issuer, ca_file=settings.auth_ca_file, token_file=settings.auth_token_file,
                   keys_ttl=settings.auth_keys_ttl_seconds)

    def _headers(self) -> dict[str, str]:
        if self._token_file is None:
            return {}
        return {"Authorization": f"Bearer {self._token_file.read_text().strip()}"}

    def _client(self) -> jwt.PyJWKClient:
        """The JWKS client, from the issuer's discovery document (fetched once)."""
        if self._jwks is None:
            url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
            request = urllib.request.Request(url, headers=self._headers())  # noqa: S310 - an https issuer URL
            try:
                with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT, context=self._ssl) as res:  # noqa: S310
                    doc = json.load(res)
            except (OSError, ValueError) as exc:
                raise AuthError(f"OIDC discovery at {url} failed: {exc}") from None
            if doc.get("issuer") != self.issuer or not doc.get("jwks_uri"):
                raise AuthError(f"{url}: issuer {doc.get('issuer')!r} is not {self.issuer!r}, or no jwks_uri")
            self._jwks = jwt.PyJWKClient(doc["jwks_uri"], cache_jwk_set=True, lifespan=self.keys_ttl,
                                         headers=self._headers(), timeout=FETCH_TIMEOUT, ssl_context=self._ssl,
                                         cooldown_duration=self.refetch_cooldown)
        return self._jwks

    def _fetch(self, kid: str) -> jwt.PyJWK:
        with self._lock:  # one fetch at a time; whoever waited finds the key cached
            cached = self._keys.get(kid)
            if cached is not None and time.monotonic() - cached[1] < self.keys_ttl:
                return cached[0]
            try:
                key = self._client().get_signing_key(kid)
            except jwt.PyJWKClientError as exc:
                raise AuthError(str(exc)) from None
            self._keys[kid] = (key, time.monotonic())
            return key

    async def key(self, kid: str) -> jwt.PyJWK:
        cached = self._keys.get(kid)
        if cached is not None and time.monotonic() - cached[1] < self.keys_ttl:
            return cached[0]
        return await asyncio.to_thread(self._fetch, kid)

    async def check(self, authorization: str | None, audience: str | None) -> Answer | dict[str, Any]:
        """The token's claims when the request may go on; else its 401/403 answer. ``audience`` None: the
        channel is unknown (the token is still checked; the 404 is the app's)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("a bearer token is required")
        token = token.strip()
        known = self._verified.get(token)
        if known is not None and known[1] > time.time():
            claims = known[0]
        else:
            try:
                kid = jwt.get_unverified_header(token).get("kid") or ""
                key = await self.key(kid)
                claims = jwt.decode(token, key, algorithms=ALGORITHMS, issuer=self.issuer,
                                    options={"require": ["exp", "iss", "aud"], "verify_aud": False})
            except AuthError as exc:
                log.warning("token keys unavailable", extra={"error": str(exc)})
                return _unauthorized("the token's signing key could not be found")
            except jwt.InvalidTokenError as exc:
                self._verified.pop(token, None)
                return _unauthorized(f"invalid token: {exc}")
            self._remember(token, claims)
        if audience is None:
            return claims
        aud = claims["aud"]
        if audience not in (aud if isinstance(aud, list) else [aud]):
            return Answer(falcon.HTTP_403, {"error": f"the token is not for audience {audience!r}"})
        return claims


    def _remember(self, token: str, claims: dict[str, Any]) -> None:
        if len(self._verified) >= VERIFIED_TOKENS:
            self._verified.popitem(last=False)
        self._verified[token] = (claims, float(claims["exp"]))


def _unauthorized(message: str) -> Answer:
    return Answer(falcon.HTTP_401, {"error": message})


#: The receiver's kinds of target (``Ingress.target``) as an EventPolicy names them.
TARGET_KINDS = {"channel": (GROUP_CHANNELS, KIND_CHANNEL), "broker": (kb.GROUP, "Broker"),
                "KafkaSink": (ks.GROUP, ks.KIND)}

#: A request's event check, left for after the body is read: true when every record may be written.
EventCheck = Callable[[list[KafkaRecord]], bool]


class PolicyCheck:
    """Who may send to what, on a verified token's subject (``core.eventpolicies``; Knative's semantics): 403
    when no applying policy allows it, or — where none applies — the default mode does not.

    No subject is waived: a Trigger's reply going back into its Broker carries the Trigger's own identity
    (``core.tokens``), so a policy admits it by naming the Trigger. Filters are compiled once per policy generation;
    a policy whose filters do not compile allows no one (the controller reports why on the policy).
    """

    def __init__(self, policies: PolicySource | None, mode: DefaultMode) -> None:
        self.source, self.mode = policies, mode
        self._compiled: dict[tuple[str, str], tuple[ep.Policy, Filter | None]] = {}
        # The policies by namespace, for the snapshot they were built from (a snapshot is replaced, never
        # changed): a request looks at its target's namespace only.
        self._index: tuple[object, dict[str, list[ep.Policy]]] = (None, {})

    def _in(self, namespace: str) -> list[ep.Policy]:
        snapshot = self.source.policies() if self.source is not None else None
        if snapshot is None:
            return []
        built, index = self._index
        if built is not snapshot:
            index = {}
            for policy in snapshot.values():
                index.setdefault(policy.namespace, []).append(policy)
            self._index = (snapshot, index)
            self._compiled = {k: v for k, v in self._compiled.items() if k in snapshot}  # forget deleted ones
        return index.get(namespace, [])

    @classmethod
    def from_settings(cls, settings: Settings, policies: PolicySource | None) -> PolicyCheck:
        return cls(policies, settings.auth_default_mode)

    def _filter(self, policy: ep.Policy) -> Filter | None:
        """The policy's compiled filters (MatchAll without any); None when they do not compile."""
        cached = self._compiled.get(policy.key)
        if cached is not None and cached[0] == policy:
            return cached[1]
        try:
            compiled: Filter | None = compile_filters(list(policy.filters))
        except FilterError as exc:
            log.error("EventPolicy filters rejected", extra={
                "policy": f"{policy.namespace}/{policy.name}", "error": str(exc)})
            compiled = None
        self._compiled[policy.key] = (policy, compiled)
        return compiled

    def decide(self, kind: str, channel: Channel, subject: str) -> Answer | EventCheck | None:
        """None: allowed; an ``EventCheck``: allowed if the event passes it; an Answer: refused (403)."""
        group, kind_name = TARGET_KINDS[kind]
        target = ep.Target(group, kind_name, channel.namespace, channel.name, channel.labels)
        applying = ep.applying(self._in(channel.namespace), target)
        where = f"{kind_name} {channel.namespace}/{channel.name}"
        if not applying:
            if ep.default_allows(self.mode, subject, channel.namespace):
                return None
            return _forbidden(f"{subject!r} may not send to {where}: no EventPolicy applies and the default "
                              f"authorization mode is {self.mode.value}")
        checks: list[Filter] = []
        for policy in applying:
            if not policy.allows_subject(subject):
                continue
            compiled = self._filter(policy)
            if isinstance(compiled, MatchAll):
                return None
            if compiled is not None:
                checks.append(compiled)
        if not checks:
            names = ", ".join(p.name for p in applying)
            return _forbidden(f"{subject!r} may not send to {where}: not allowed by the EventPolicies that "
                              f"apply ({names})")

        def passes(records: list[KafkaRecord]) -> bool:
            events = [record_attributes(r.headers, r.value) for r in records]
            return any(all(f.matches(e) for e in events) for f in checks)

        return passes


def _forbidden(message: str) -> Answer:
    return Answer(falcon.HTTP_403, {"error": message})


class AuthMiddleware:
    """Checks the token of every POST to a channel, Broker or KafkaSink before its responder runs, and who may
    send there (``PolicyCheck``); installed only when enabled. A policy's event filters are left to the responder
    (``req.context.event_check``): they need the body, and run before anything is produced."""

    def __init__(self, verifier: TokenVerifier, ingress: Ingress, resource: object,
                 policies: PolicyCheck | None = None) -> None:
        self.verifier, self.ingress, self.resource = verifier, ingress, resource
        self.policies = policies or PolicyCheck(None, DefaultMode.ALLOW_ALL)

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               params: dict[str, Any]) -> None:
        if resource is not self.resource or req.method != "POST":
            return
        ingress = self.ingress
        by_path = params.get("namespace") is not None  # as the app decides it
        key = ingress.key(req, params.get("namespace"), params.get("name"))
        # The audience of what the request goes to: a Broker's path must not be checked against a channel's.
        sink = by_path and ingress.sinks is not None and ingress.to_sink(req)
        channel, kind = ingress.target(key, by_path, sink) if key is not None else (None, "")
        answer = await self.verifier.check(req.get_header("Authorization"),
                                           channel.token_audience if channel is not None else None)
        if not isinstance(answer, Answer) and channel is not None:
            decision = self.policies.decide(kind, channel, str(answer.get("sub") or ""))
            if isinstance(decision, Answer):
                answer = decision
            elif decision is not None:
                req.context.event_check = decision
        if isinstance(answer, Answer):
            ingress.respond(resp, answer, key)
            if answer.status == falcon.HTTP_401:
                resp.set_header("WWW-Authenticate", 'Bearer error="invalid_token"')
            resp.complete = True
