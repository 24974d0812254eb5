"""core.tokens: TokenSource with a fake requester and clock — cached per identity and audience, refreshed before
expiry by the refresher (never on the delivery path once a token is held), the old token kept while a refresh fails —
and the OIDC ServiceAccount names, Knative's."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kafka_eventing.core.tokens import (
    REFRESH_AT,
    Identity,
    TokenError,
    TokenSource,
    child_name,
    identity_of,
    oidc_service_account,
)

A: Identity = ("shop", "orders-oidc-eventing.knative.dev-trigger")
B: Identity = ("other", "orders-oidc-eventing.knative.dev-trigger")


class Requests:
    def __init__(self, valid_for: float = 100.0) -> None:
        self.valid_for = valid_for
        self.calls: list[str] = []
        self.fail = False

    def __call__(self, identity: Identity, audience: str) -> tuple[str, float]:
        if self.fail:
            raise RuntimeError("apiserver unavailable")
        self.calls.append(audience if identity == A else f"{identity[0]}:{audience}")
        return f"tok-{audience}-{len(self.calls)}", self.valid_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_request_per_identity_and_audience_then_the_cache() -> None:
    req, clock = Requests(), Clock()
    tokens = TokenSource(req, clock=clock)
    assert asyncio.run(tokens.header(A, "a")) == "Bearer tok-a-1"
    assert asyncio.run(tokens.header(A, "a")) == "Bearer tok-a-1"
    assert asyncio.run(tokens.header(A, "b")) == "Bearer tok-b-2"
    # The same account name and audience in another namespace is another identity: never the first one's token.
    assert asyncio.run(tokens.header(B, "a")) == "Bearer tok-a-3"
    assert req.calls == ["a", "b", "other:a"]


def test_refreshed_before_expiry_and_the_delivery_path_never_calls() -> None:
    req, clock = Requests(valid_for=100.0), Clock()
    tokens = TokenSource(req, clock=clock)
    tokens.fetch(A, "a")
    clock.now += 100.0 * REFRESH_AT - 1
    tokens.refresh_due()
    assert req.calls == ["a"]  # not due yet
    clock.now += 2  # past the refresh point, before expiry
    assert tokens.cached(A, "a") == "tok-a-1"  # still valid: the delivery path reads it without a call
    tokens.refresh_due()
    assert req.calls == ["a", "a"]
    assert tokens.cached(A, "a") == "tok-a-2"

    # A delivery with a held token makes no request, whatever the requester would do.
    req.fail = True
    assert asyncio.run(tokens.header(A, "a")) == "Bearer tok-a-2"
    assert req.calls == ["a", "a"]


def test_a_failed_refresh_keeps_the_valid_token_and_retries_later() -> None:
    req, clock = Requests(valid_for=100.0), Clock()
    tokens = TokenSource(req, clock=clock, retry_seconds=10.0)
    tokens.fetch(A, "a")
    clock.now += 90
    req.fail = True
    tokens.refresh_due()
    assert tokens.cached(A, "a") == "tok-a-1"
    req.fail = False
    clock.now += 5
    tokens.refresh_due()  # within the retry wait: no request
    assert req.calls == ["a"]
    clock.now += 5
    tokens.refresh_due()
    assert tokens.cached(A, "a") == "tok-a-2"


def test_expired_token_is_not_served_and_a_failing_first_request_raises() -> None:
    req, clock = Requests(valid_for=100.0), Clock()
    tokens = TokenSource(req, clock=clock)
    tokens.fetch(A, "a")
    clock.now += 100
    assert tokens.cached(A, "a") is None
    req.fail = True
    with pytest.raises(TokenError, match="shop/orders-oidc-eventing.knative.dev-trigger, audience 'a'") as info:
        asyncio.run(tokens.header(A, "a"))
    assert "tok-" not in str(info.value)


def test_the_refresher_thread_renews_in_the_background() -> None:
    req = Requests(valid_for=0.5)  # real clock: refresh due after 0.4 s
    tokens = TokenSource(req)
    tokens.fetch(A, "a")
    tokens.start()
    try:
        deadline = time.monotonic() + 5
        while len(req.calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        tokens.stop()
    assert len(req.calls) >= 3
    assert tokens.cached(A, "a") == f"tok-a-{len(req.calls)}"


def test_concurrent_first_uses_make_one_request() -> None:
    gate = threading.Event()
    calls: list[str] = []

    def slow(_identity: Identity, audience: str) -> tuple[str, float]:
        calls.append(audience)
        gate.wait(2)
        return "t", 100.0

    tokens = TokenSource(slow)

    async def many() -> list[str]:
        tasks = [asyncio.create_task(tokens.header(A, "a")) for _ in range(5)]
        await asyncio.sleep(0.1)
        gate.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(many()) == ["Bearer t"] * 5
    assert calls == ["a"]


@pytest.mark.parametrize(("parent", "suffix", "want"), [
    # knative.dev/pkg kmeta/names_test.go's table.
    ("asdf", "-deployment", "asdf-deployment"),
    ("f" * 63, "-deployment", "ffffffffffffffffffff105d7597f637e83cc711605ac3ea4957-deployment"),
    ("f" * 63, "-deploy", "ffffffffffffffffffffffff105d7597f637e83cc711605ac3ea4957-deploy"),
    ("f" * 63, "f" * 63, "fffffffffffffffffffffffffffffff0502661254f13c89973cb3a83e0cbec0"),
    ("a", "f" * 63, "ab5cfd486935decbc0d305799f4ce4414ffffffffffffffffffffffffffffff"),
    ("b" * 32, "f" * 32, "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb329c7c81b9ab3ba71aa139066aa5625d"),
    ("aaaa", "b---a" * 20, "aaaa7a3f7966594e3f0849720eced8212c18b---ab---ab---ab---ab---ab"),
    ("a" * 17, "a.-.-.-.-.-.-." + "a" * 37, "aaaaaaaaaaaaaaaaaa1eb10dc911444f8434af83b7225442da"),
])
def test_child_names_are_knatives(parent: str, suffix: str, want: str) -> None:
    assert child_name(parent, suffix) == want


def test_oidc_account_names_and_identities() -> None:
    trigger = oidc_service_account("eventing.knative.dev", "Trigger", "Orders")
    assert trigger == "orders-oidc-eventing.knative.dev-trigger"
    long = oidc_service_account("sources.knative.dev", "KafkaSource", "s" * 50)
    assert len(long) == 63 and long.startswith("s" * 31)
    assert identity_of("shop", {"serviceAccountName": "x"}) == ("shop", "x")
    assert identity_of("shop", None) is None and identity_of("shop", {}) is None
