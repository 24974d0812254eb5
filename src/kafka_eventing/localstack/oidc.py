"""An OIDC issuer on loopback: the discovery document and a JWKS over HTTP, RSA keys that can rotate, and tokens
signed with them — what a Kubernetes API server's service-account issuer serves, without the cluster. For the
receiver's token checks in tests and for the auth-on benchmark."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


class Issuer(http.server.ThreadingHTTPServer):
    """Serves from construction until ``close()``; ``url`` is the issuer (``KE_AUTH_ISSUER``)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.keys: dict[str, Any] = {}
        #: how often the JWKS was fetched (a verifier's key cache at work)
        self.fetches = 0
        self.rotate()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def rotate(self) -> str:
        """A new signing key, the one ``token`` uses from now on; the older ones stay published."""
        kid = f"k{len(self.keys)}"
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return kid

    def jwks(self) -> dict[str, Any]:
        return {"keys": [{**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "alg": "RS256",
                          "use": "sig"} for kid, key in self.keys.items()]}

    def token(self, kid: str | None = None, **claims: Any) -> str:
        """A token with this issuer's ``iss`` and an ``exp`` 10 minutes ahead, unless ``claims`` say otherwise."""
        kid = kid or sorted(self.keys)[-1]
        body = {"iss": self.url, "exp": int(time.time()) + 600, **claims}
        return jwt.encode(body, self.keys[kid], algorithm="RS256", headers={"kid": kid})

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Issuer

    def do_GET(self) -> None:
        if self.path == "/.well-known/openid-configuration":
            body: dict[str, Any] = {"issuer": self.server.url, "jwks_uri": self.server.url + "/keys"}
        elif self.path == "/keys":
            self.server.fetches += 1
            body = self.server.jwks()
        else:
            self.send_error(404)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass
