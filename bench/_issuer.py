"""An OIDC issuer on loopback for the benchmarks' auth-on runs: discovery document and JWKS over HTTP, one RSA
key, tokens signed with it (what a Kubernetes API server's service-account issuer serves, without the cluster)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

KID = "bench"


class Issuer(http.server.ThreadingHTTPServer):
    """Serves until ``close()``; ``url`` is the issuer (``KE_AUTH_ISSUER``)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def jwks(self) -> dict[str, Any]:
        jwk = json.loads(RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**jwk, "kid": KID, "alg": "RS256", "use": "sig"}]}

    def token(self, audience: str, subject: str, lifetime_s: int = 3600) -> str:
        claims = {"iss": self.url, "aud": [audience], "sub": subject, "exp": int(time.time()) + lifetime_s}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": KID})

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Issuer

    def do_GET(self) -> None:
        if self.path == "/.well-known/openid-configuration":
            body: dict[str, Any] = {"issuer": self.server.url, "jwks_uri": self.server.url + "/keys"}
        elif self.path == "/keys":
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
