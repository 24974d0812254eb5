"""HTTP delivery of one event, shared by the dispatcher and the reprocessing jobs' HTTP sink: one POST as an
``Attempt`` (``HttpSender``), and the retry timing around it — DeliverySpec backoff, ``Retry-After``, and the
tenacity policies built from them.

tenacity's ``AsyncRetrying`` sleeps with ``asyncio.sleep``, so a partition waiting for its next attempt never
blocks the event loop that serves every other partition and subscription.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_attempt, stop_never

from kafka_eventing.core.delivery import DeliverySpec, is_retryable
from kafka_eventing.core.tls import CACertsError, TlsVersion, client_context

#: Per-attempt timeout when the DeliverySpec sets none, so that a hung subscriber cannot stall a partition.
DEFAULT_ATTEMPT_TIMEOUT = 60.0
#: Replies larger than this are not forwarded: the event counts as failed at its reply (dead-lettered).
MAX_REPLY_BYTES = 4 * 1024 * 1024
#: Of an error response, only this much is kept (for ``knativeerrordata``).
ERROR_BODY_BYTES = 1024

#: A dead-letter sink that keeps failing is retried forever, but not more often than this.
SINK_MAX_BACKOFF_SECONDS = 30.0


class HasOutcome(Protocol):
    @property
    def status(self) -> int | None: ...
    @property
    def ok(self) -> bool: ...
    @property
    def retry_after(self) -> float | None: ...


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date (RFC 9110); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_delay(spec: DeliverySpec, retry: int, retry_after: float | None, retry_after_max: float) -> float:
    """Seconds before retry number ``retry`` (1-based): the backoff, or Retry-After (capped by the spec's
    ``retryAfterMax``, else by ``retry_after_max``) if longer."""
    delay = spec.backoff(retry)
    if retry_after is not None:
        cap = spec.retry_after_max.total_seconds() if spec.retry_after_max is not None else retry_after_max
        delay = max(delay, min(retry_after, cap))
    return delay


def _last(state: RetryCallState) -> Any:
    assert state.outcome is not None
    return state.outcome.result()


def delivery_policy(
    spec: DeliverySpec,
    retry_after_max: float,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    before_retry: Callable[[int, float], None] | None = None,
    done: int = 0,
) -> AsyncRetrying:
    """Up to ``spec.retry`` retries of a retryable outcome; the last outcome is returned, never raised.

    ``done`` attempts were already made outside the policy (the caller tries once without tenacity — the
    common, successful case then costs nothing extra — and has already slept before retry ``done``).
    """

    def wait(state: RetryCallState) -> float:
        return retry_delay(spec, state.attempt_number + done, _last(state).retry_after, retry_after_max)

    def notify(state: RetryCallState) -> None:
        if before_retry is not None and state.next_action is not None:
            before_retry(state.attempt_number + done, state.next_action.sleep)

    kwargs = {} if sleep is None else {"sleep": sleep}
    return AsyncRetrying(
        stop=stop_after_attempt(spec.retry + 1 - done),
        wait=wait,
        retry=retry_if_result(lambda o: not o.ok and is_retryable(o.status)),
        retry_error_callback=_last,
        before_sleep=notify,
        reraise=True,
        **kwargs,  # type: ignore[arg-type]
    )


def sink_policy(
    spec: DeliverySpec,
    retry_after_max: float,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    before_retry: Callable[[int, float], None] | None = None,
) -> AsyncRetrying:
    """The dead-letter sink: retried until it accepts (any non-2xx counts as failed), backoff capped."""

    def wait(state: RetryCallState) -> float:
        delay = max(0.01, min(spec.backoff(min(state.attempt_number, 32)), SINK_MAX_BACKOFF_SECONDS))
        retry_after = _last(state).retry_after
        if retry_after is not None:
            cap = spec.retry_after_max.total_seconds() if spec.retry_after_max is not None else retry_after_max
            delay = max(delay, min(retry_after, cap))
        return delay

    def notify(state: RetryCallState) -> None:
        if before_retry is not None and state.next_action is not None:
            before_retry(state.attempt_number, state.next_action.sleep)

    kwargs = {} if sleep is None else {"sleep": sleep}
    return AsyncRetrying(
        stop=stop_never,
        wait=wait,
        retry=retry_if_result(lambda o: not o.ok),
        before_sleep=notify,
        reraise=True,
        **kwargs,  # type: ignore[arg-type]
    )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt: ``status`` None means no response (connection error or timeout)."""

    status: int | None
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    error: str = ""
    #: The body was longer than the limit it was read with (``body`` holds the first part, or nothing).
    oversized: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retry_after(self) -> float | None:
        if self.status not in (429, 503):
            return None
        return parse_retry_after(self.headers.get("Retry-After") or self.headers.get("retry-after"))

    @property
    def code(self) -> str:
        return str(self.status) if self.status is not None else "none"


#: aiohttp's automatic headers not to add: an event without datacontenttype has no Content-Type (aiohttp would send
#: application/octet-stream, a datacontenttype the producer never set).
_NO_CONTENT_TYPE = ("Content-Type",)


class HttpSender:
    """POSTs on a shared aiohttp session; every failure becomes an ``Attempt``, never an exception."""

    def __init__(self, session: aiohttp.ClientSession, tls_minimum: TlsVersion = TlsVersion.TLS_1_3) -> None:
        self.session = session
        self.tls_minimum = tls_minimum
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def post(self, url: str, headers: Mapping[str, str], body: bytes, timeout: float | None, *,
                   ca_certs: str | None = None) -> Attempt:
        """``ca_certs``: PEM CAs trusted for this ``https://`` destination besides the system's (its
        ``CACerts``); every https request is verified and held to ``tls_minimum``."""
        seconds = timeout or DEFAULT_ATTEMPT_TIMEOUT
        client_timeout = self._timeouts.get(seconds)
        if client_timeout is None:
            client_timeout = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        try:
            tls = client_context(ca_certs, self.tls_minimum) if url[:8].lower() == "https://" else True
        except CACertsError as exc:
            return Attempt(None, error=str(exc))
        try:
            async with self.session.post(url, data=body, headers=headers, timeout=client_timeout,
                                         skip_auto_headers=_NO_CONTENT_TYPE, ssl=tls) as resp:
                if resp.content_length == 0:
                    return Attempt(resp.status, b"", resp.headers)  # the usual answer: nothing to read
                # Only a 2xx may carry a reply worth reading in full; error bodies are kept for knativeerrordata.
                limit = MAX_REPLY_BYTES if 200 <= resp.status < 300 else ERROR_BODY_BYTES
                data, oversized = await _read(resp, limit)
                # The response's own (case-insensitive, read-only) headers: no copy per event.
                return Attempt(resp.status, data, resp.headers, oversized=oversized)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            return Attempt(None, error=f"{type(exc).__name__}: {exc}")


async def _read(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The whole body if it is at most ``limit`` bytes, else its first ``limit`` bytes and True.

    ``content.read(n)`` returns what is buffered so far, not ``n`` bytes: read until the end or the limit.
    """
    if resp.content_length is not None and resp.content_length > limit:
        return await resp.content.read(limit) if limit <= ERROR_BODY_BYTES else b"", True
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await resp.content.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return data[:limit], size > limit
