"""Which names hold secrets — one list for every place that writes names and values out: Kafka configs in reprs
and logs, the structured log formatter, the Spark jobs' Kafka options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
#: Substrings of a (lower-cased) name whose value must never be written: passwords and SASL/JAAS credentials,
#: tokens and their callbacks, private keys (``ssl.key.pem``, ``ssl.key.password``, Spark's
#: ``ssl.keystore.key``). A bare "key" is not one: it would hide event and partition keys in logs.
SECRET_WORDS = ("password", "secret", "token", "jaas", "oauth_cb", "ssl.key", "keystore.key", "key.pem")


def is_secret(name: str) -> bool:
    low = name.lower()
    return any(word in low for word in SECRET_WORDS)


def redact(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log: the values of secret names replaced."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in values.items()}
