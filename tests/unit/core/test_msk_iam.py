"""AWS MSK IAM: the OAUTHBEARER token callback run for real, its token checked as AWS checks it.

The token is a base64url (unpadded) SigV4 pre-signed ``GET https://kafka.<region>.amazonaws.com/?Action=
kafka-cluster:Connect``. The signature is recomputed here with botocore's ``SigV4QueryAuth`` over the request the
token carries (less ``X-Amz-Signature`` and ``User-Agent``, which the signer appends after signing) at the token's
own ``X-Amz-Date``. Credentials are fixed (botocore ``Credentials``, or the environment for the default chain) and
the instance-metadata lookup is off, so nothing leaves the machine.
"""

from __future__ import annotations

import base64
import importlib.metadata
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import confluent_kafka
import pytest
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import CredentialProvider, Credentials

from kafka_eventing.core.kafka_config import (
    KafkaConfigError,
    _msk_iam_token_cb,
    connection_from_secret,
    connection_from_settings,
)
from kafka_eventing.core.settings import Settings

AKID, SECRET, SESSION = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token/with+odd=chars"


class FixedCredentials(CredentialProvider):  # type: ignore[misc]  # botocore is untyped
    """A provider that hands out the credentials it is given, one set per ``load`` (rotation)."""

    METHOD = "fixed"

    def __init__(self, *creds: Credentials) -> None:
        super().__init__()
        self._creds = list(creds)
        self.loads = 0

    def load(self) -> Credentials:
        cred = self._creds[min(self.loads, len(self._creds) - 1)]
        self.loads += 1
        return cred


def decode(token: str) -> str:
    assert "=" not in token and "+" not in token and "/" not in token, "base64url without padding"
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()


def verify(token: str, credentials: Credentials, region: str) -> dict[str, str]:
    """Check the token's structure and signature; return its query parameters."""
    url = urlsplit(decode(token))
    assert (url.scheme, url.netloc, url.path, url.fragment) == ("https", f"kafka.{region}.amazonaws.com", "/", "")
    pairs = parse_qsl(url.query, keep_blank_values=True, strict_parsing=True)
    params = dict(pairs)
    assert len(params) == len(pairs), "no repeated parameter"
    assert params["Action"] == "kafka-cluster:Connect"
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    day = params["X-Amz-Date"][:8]
    assert params["X-Amz-Credential"] == f"{credentials.access_key}/{day}/{region}/kafka-cluster/aws4_request"
    assert params["X-Amz-Expires"] == "900"
    assert params["X-Amz-SignedHeaders"] == "host"
    assert params.get("X-Amz-Security-Token") == credentials.token
    version = importlib.metadata.version("aws-msk-iam-sasl-signer-python")
    assert params["User-Agent"] == f"aws-msk-iam-sasl-signer-python/{version}"

    signed = [(k, v) for k, v in pairs if k not in ("X-Amz-Signature", "User-Agent")]
    request = AWSRequest(method="GET", url=urlunsplit((url.scheme, url.netloc, url.path, urlencode(signed), "")))
    request.context["timestamp"] = params["X-Amz-Date"]
    auth = SigV4QueryAuth(credentials, "kafka-cluster", region, expires=900)
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    assert params["X-Amz-Signature"] == expected, "SigV4 signature does not verify"
    return params


def signed_at(params: dict[str, str]) -> float:
    return datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()


def test_token_verifies_as_a_presigned_connect_request_and_expires_in_seconds() -> None:
    creds = Credentials(AKID, SECRET, SESSION)
    before = time.time()
    token, expiry = _msk_iam_token_cb("eu-west-1", FixedCredentials(creds))("")
    params = verify(token, creds, "eu-west-1")
    # librdkafka takes seconds since the epoch: the signing time plus the URL's own lifetime, not milliseconds.
    assert isinstance(expiry, float)
    assert expiry == signed_at(params) + int(params["X-Amz-Expires"])
    assert before - 1 <= signed_at(params) <= time.time()
    assert before + 899 <= expiry <= time.time() + 900


def test_the_check_fails_for_a_token_signed_otherwise() -> None:
    creds = Credentials(AKID, SECRET, None)
    token, _ = _msk_iam_token_cb("us-east-1", FixedCredentials(creds))("")
    verify(token, creds, "us-east-1")
    with pytest.raises(AssertionError, match="does not verify"):
        verify(token, Credentials(AKID, SECRET + "x", None), "us-east-1")
    with pytest.raises(AssertionError):
        verify(token, creds, "eu-west-1")
    url = decode(token).replace("kafka-cluster%3AConnect", "kafka-cluster%3AWriteData")
    forged = base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
    with pytest.raises(AssertionError):
        verify(forged, creds, "us-east-1")


def test_each_call_signs_anew_with_the_credentials_of_that_moment() -> None:
    first, second = Credentials(AKID, SECRET, "s1"), Credentials("AKIDROTATED", SECRET[::-1], "s2")
    provider = FixedCredentials(first, second)
    cb = _msk_iam_token_cb("ap-southeast-2", provider)
    token1, expiry1 = cb("")
    time.sleep(1.05)  # X-Amz-Date has one-second resolution
    token2, expiry2 = cb("")
    assert provider.loads == 2
    verify(token1, first, "ap-southeast-2")
    verify(token2, second, "ap-southeast-2")
    assert expiry2 > expiry1


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Credentials:
    """Credentials for botocore's default chain from the environment only: no files, no instance metadata."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AKID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
    return Credentials(AKID, SECRET, SESSION)


def test_the_connections_callback_signs_with_the_default_chain(aws_env: Credentials) -> None:
    conn = connection_from_secret({"aws.region": "eu-central-1"}, provider="aws-msk-iam", bootstrap_servers="b:9098")
    for cfg in (conn.producer_config(), conn.consumer_config("g"), conn.admin_config()):
        assert cfg["sasl.mechanism"] == "OAUTHBEARER" and cfg["security.protocol"] == "SASL_SSL"
        token, expiry = cfg["oauth_cb"](cfg.get("sasl.oauthbearer.config", ""))
        params = verify(token, aws_env, "eu-central-1")
        assert expiry == signed_at(params) + 900


def test_librdkafka_accepts_the_token_and_its_expiry(aws_env: Credentials) -> None:
    """A real client: confluent-kafka asks for the token while it is built and refuses it if already expired."""
    conn = connection_from_secret({"aws.region": "eu-west-1"}, provider="aws-msk-iam",
                                  bootstrap_servers="127.0.0.1:9", extra={"security.protocol": "SASL_PLAINTEXT"})
    cfg = conn.producer_config(log_level=0)
    issued: list[tuple[str, float]] = []
    inner = cfg["oauth_cb"]

    def recording(config: str) -> tuple[str, float]:
        issued.append(inner(config))
        return issued[-1]

    cfg["oauth_cb"] = recording
    producer = confluent_kafka.Producer(cfg)
    producer.poll(0.1)
    assert len(issued) == 1, "refreshed only near expiry (80 % of 15 minutes)"
    verify(issued[0][0], aws_env, "eu-west-1")


def test_librdkafka_asks_again_before_expiry_and_gets_a_fresh_token(aws_env: Credentials) -> None:
    """The refresh, shortened: librdkafka asks at 80 % of the lifetime it was given (here 2 s, instead of the
    signer's 15 minutes), and every answer is a newly signed token that verifies."""
    conn = connection_from_secret({"aws.region": "eu-west-1"}, provider="aws-msk-iam",
                                  bootstrap_servers="127.0.0.1:9", extra={"security.protocol": "SASL_PLAINTEXT"})
    cfg = conn.producer_config(log_level=0)
    issued: list[tuple[str, float, float, float]] = []
    inner = cfg["oauth_cb"]

    def short_lived(config: str) -> tuple[str, float]:
        before = time.time()
        token, expiry = inner(config)
        issued.append((token, expiry, before, time.time()))
        return token, min(expiry, time.time() + 2)

    cfg["oauth_cb"] = short_lived
    producer = confluent_kafka.Producer(cfg)
    # Three asks take about 3.2 s; the bound only ends a wait that never comes (a loaded host is slower).
    deadline = time.monotonic() + 60
    while len(issued) < 3 and time.monotonic() < deadline:
        producer.poll(0.1)
    assert len(issued) >= 3, issued
    for token, expiry, before, after in issued:
        params = verify(token, aws_env, "eu-west-1")
        # Signed during the call (X-Amz-Date has one-second resolution), valid 15 minutes from then.
        assert expiry == signed_at(params) + 900 and int(before) <= signed_at(params) <= after
    assert len({token for token, *_ in issued}) >= 2  # signed anew (X-Amz-Date has one-second resolution)


def _msk(environ: dict[str, str] | None, data: dict[str, str | bytes] | None = None) -> dict[str, str]:
    conn = connection_from_secret(data or {}, provider="aws-msk-iam", bootstrap_servers="b:9098", environ=environ)
    token, _ = conn.producer_config()["oauth_cb"]("")
    return dict(parse_qsl(urlsplit(decode(token)).query))


def test_region_comes_from_the_secret_first(aws_env: Credentials) -> None:
    params = _msk({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-west-1"}, {"aws.region": b" eu-north-1\n"})
    assert params["X-Amz-Credential"].split("/")[2] == "eu-north-1"


def test_region_falls_back_to_aws_region_then_aws_default_region(aws_env: Credentials) -> None:
    both = _msk({"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-west-1"})
    assert both["X-Amz-Credential"].split("/")[2] == "us-west-2"
    default_only = _msk({"AWS_DEFAULT_REGION": "us-west-1"})
    assert default_only["X-Amz-Credential"].split("/")[2] == "us-west-1"


def test_region_from_the_process_environment(aws_env: Credentials, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the roles do: ``connection_from_settings`` without ``environ`` reads the pod's variables."""
    monkeypatch.setenv("AWS_REGION", "sa-east-1")
    conn = connection_from_settings(Settings(bootstrap_servers="b:9098", kafka_provider="aws-msk-iam"))
    token, _ = conn.producer_config()["oauth_cb"]("")
    verify(token, aws_env, "sa-east-1")
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ca-central-1")
    conn = connection_from_settings(Settings(bootstrap_servers="b:9098", kafka_provider="aws-msk-iam"))
    verify(conn.producer_config()["oauth_cb"]("")[0], aws_env, "ca-central-1")


def test_no_region_anywhere_is_refused(aws_env: Credentials) -> None:
    with pytest.raises(KafkaConfigError, match="aws.region.*AWS_REGION / AWS_DEFAULT_REGION"):
        connection_from_secret({}, provider="aws-msk-iam", bootstrap_servers="b:9098")
    with pytest.raises(KafkaConfigError, match="needs a region"):
        connection_from_secret({"aws.region": "  "}, provider="aws-msk-iam", bootstrap_servers="b:9098", environ={})
