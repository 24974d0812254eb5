"""TokenVerifier against an OIDC issuer of our own on loopback (discovery + JWKS over HTTP): expiry, issuer,
algorithm, audience lists, key rotation and the cache. Real tokens from the kube-apiserver:
tests/integration/test_receiver_auth.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from kafka_eventing.receiver.auth import TokenVerifier

from .fakes import AUD, Issuer


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    yield server
    server.close()


def status(verifier: TokenVerifier, token: str | None, audience: str | None = AUD) -> int:
    answer = asyncio.run(verifier.check(None if token is None else f"Bearer {token}", audience))
    return 200 if isinstance(answer, dict) else int(answer.status[:3])


def test_valid_expired_foreign_and_wrong_audience(issuer: Issuer) -> None:
    verifier = TokenVerifier(issuer.url)
    assert status(verifier, issuer.token()) == 200
    assert status(verifier, issuer.token(aud=AUD)) == 200  # a single string audience
    assert status(verifier, None) == 401
    assert status(verifier, issuer.token(exp=int(time.time()) - 60)) == 401
    assert status(verifier, issuer.token(iss="https://elsewhere.example")) == 401
    assert status(verifier, issuer.token(aud=["other"])) == 403
    assert status(verifier, issuer.token(), audience=None) == 200  # unknown channel: the app's 404
    no_exp = jwt.encode({"iss": issuer.url, "aud": [AUD]}, issuer.keys["k0"], algorithm="RS256",
                        headers={"kid": "k0"})
    assert status(verifier, no_exp) == 401
    # A symmetric (HMAC) token and an unsigned one never pass: only the JWKS's asymmetric algorithms do.
    hs = jwt.encode({"iss": issuer.url, "aud": [AUD], "exp": int(time.time()) + 60}, "s" * 32, algorithm="HS256",
                    headers={"kid": "k0"})
    assert status(verifier, hs) == 401
    unsigned = jwt.encode({"iss": issuer.url, "aud": [AUD], "exp": int(time.time()) + 60}, None, algorithm="none")
    assert status(verifier, unsigned) == 401


def test_keys_are_cached_and_a_new_key_id_fetches(issuer: Issuer) -> None:
    verifier = TokenVerifier(issuer.url, refetch_cooldown=0)
    for _ in range(5):
        assert status(verifier, issuer.token()) == 200
    assert issuer.fetches == 1
    kid = issuer.rotate()
    assert status(verifier, issuer.token(kid=kid)) == 200
    assert issuer.fetches == 2
    assert status(verifier, issuer.token(kid="k0")) == 200
    assert issuer.fetches == 2
    # Made-up key ids refetch at most once per cooldown.
    guarded = TokenVerifier(issuer.url, refetch_cooldown=60)
    assert status(guarded, issuer.token()) == 200
    before = issuer.fetches
    for i in range(5):
        assert status(guarded, issuer.token(kid="k0")) == 200
        forged = jwt.encode({"iss": issuer.url, "aud": [AUD], "exp": int(time.time()) + 60}, issuer.keys["k0"],
                            algorithm="RS256", headers={"kid": f"made-up-{i}"})
        assert status(guarded, forged) == 401
    assert issuer.fetches - before <= 1


def test_a_token_is_verified_once_until_it_expires(issuer: Issuer, monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka_eventing.receiver import auth

    verifier = TokenVerifier(issuer.url)
    decoded: list[str] = []
    real_decode = jwt.decode

    def counting(token: str, *args: Any, **kwargs: Any) -> Any:
        decoded.append(token)
        return real_decode(token, *args, **kwargs)

    monkeypatch.setattr(auth.jwt, "decode", counting)
    now = time.time()
    token = issuer.token(exp=int(now) + 30)
    for _ in range(5):
        assert status(verifier, token) == 200
    assert status(verifier, token, audience="messaging.knative.dev/kafkachannel/shop/other") == 403  # per request
    assert decoded == [token]
    other = issuer.token(sub="system:serviceaccount:x:z")
    assert status(verifier, other) == 200 and decoded == [token, other]
    # Past its expiry (by the receiver's clock) a remembered token is verified again: the signature check decides
    # (PyJWT's own clock is not moved here, so it still passes; an expired token's 401 is tested above).
    monkeypatch.setattr(auth.time, "time", lambda: now + 60)
    assert status(verifier, token) == 200 and decoded == [token, other, token]
    # The memory is bounded.
    monkeypatch.setattr(auth, "VERIFIED_TOKENS", 2)
    for i in range(4):
        assert status(verifier, issuer.token(sub=f"s{i}", exp=int(now) + 3600)) == 200
    assert len(verifier._verified) == 2


def test_an_unreachable_issuer_is_a_401_not_a_500() -> None:
    verifier = TokenVerifier("http://127.0.0.1:1")
    token = jwt.encode({"iss": "http://127.0.0.1:1", "aud": [AUD], "exp": int(time.time()) + 60},
                       rsa.generate_private_key(public_exponent=65537, key_size=2048), algorithm="RS256",
                       headers={"kid": "k"})
    assert status(verifier, token) == 401
