"""TLS to event destinations: the client context of an ``https://`` subscriber, reply or dead-letter sink — the
system trust store plus the PEM CA certificates its spec gives (Knative's ``CACerts``), hostnames checked, and a
minimum protocol version (``KE_TLS_MIN_VERSION``; TLS 1.3 by default, as Knative 1.22).

Contexts are cached by (CA bundle, minimum): a destination's handshake reuses one context, and its sessions.
"""

from __future__ import annotations

import enum
import functools
import ssl
from pathlib import Path


class TlsVersion(enum.StrEnum):
    TLS_1_2 = "1.2"
    TLS_1_3 = "1.3"

    @property
    def ssl_version(self) -> ssl.TLSVersion:
        return ssl.TLSVersion.TLSv1_3 if self is TlsVersion.TLS_1_3 else ssl.TLSVersion.TLSv1_2


class CACertsError(ValueError):
    """``CACerts`` that are not PEM certificates."""


@functools.lru_cache(maxsize=256)
def client_context(ca_certs: str | None = None, minimum: TlsVersion = TlsVersion.TLS_1_3) -> ssl.SSLContext:
    """Verifies the server with the system's CAs and ``ca_certs`` (PEM, one or more); refuses anything below
    ``minimum``. ``CACertsError`` when ``ca_certs`` holds no usable certificate."""
    context = ssl.create_default_context()
    context.minimum_version = minimum.ssl_version
    if ca_certs:
        try:
            context.load_verify_locations(cadata=ca_certs)
        except (ssl.SSLError, ValueError) as exc:
            raise CACertsError(f"CACerts are not PEM certificates: {exc}") from None
    return context


def read_ca_file(path: Path) -> str:
    """A CA bundle file's PEM text, read again only when the file changed (a rotated Secret)."""
    st = path.stat()
    return _read(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _read(path: Path, _mtime: int, _size: int) -> str:
    return path.read_text()
