"""The sandbox's service account and its OAuth 2.0 token endpoint (JWT-bearer grant).

``tpu-rl-sandbox up`` generates one RSA key per sandbox (``<root>/credentials/
service_account.json``); the sandbox's ``google_cloud_default`` connection carries it as a
``keyfile_dict`` whose ``token_uri`` is the API server's ``/token``. That endpoint behaves as
Google's (https://developers.google.com/identity/protocols/oauth2/service-account#httprest): form
``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=<JWT>``, the JWT signed RS256 by
the account's key, ``iss`` the account's e-mail, ``aud`` the token endpoint, ``exp`` at most an hour
after ``iat``, a ``scope``. Issued access tokens are remembered in the state document
``oauth_tokens`` (by SHA-256) so the fake GKE and Kubernetes APIs can check them.

google-auth always signs ``aud = https://oauth2.googleapis.com/token`` whatever ``token_uri``
says (google/oauth2/service_account.py ``_make_authorization_grant_assertion``) while
gcloud-aio-auth signs ``aud = token_uri``; Google accepts its own token URLs, so the fake accepts
those and its own ``token_uri``.

Tests get a token the way clients do: :func:`access_token` (google-auth against ``/token``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore

CREDENTIALS_DIR = "credentials"
KEY_FILE = "service_account.json"
TOKENS_DOC = "oauth_tokens"
TOKEN_PATH = "/token"
TOKEN_LIFETIME = 3600
MAX_ASSERTION_LIFETIME = 3600
CLOCK_SKEW = 300
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ACCOUNT_ID = "tpu-rl-sandbox"
# Google's token endpoint accepts assertions addressed to any of its token URLs.
GOOGLE_TOKEN_AUDIENCES = (
    "https://oauth2.googleapis.com/token",
    "https://www.googleapis.com/oauth2/v4/token",
    "https://accounts.google.com/o/oauth2/token",
)
EXPIRED_OR_LONG = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)

__all__ = [
    "GrantError",
    "access_token",
    "ensure_service_account",
    "grant",
    "keyfile_dict",
    "self_signed_jwt_valid",
    "token_uri",
    "token_valid",
]


class GrantError(Exception):
    """A refused grant: Google's ``{"error": ..., "error_description": ...}`` with HTTP 400."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(f"{error}: {description}")
        self.error = error
        self.description = description

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description}


def _key_path(layout: SandboxLayout) -> Path:
    return layout.root / CREDENTIALS_DIR / KEY_FILE


def ensure_service_account(layout: SandboxLayout, project: str) -> dict[str, str]:
    """The sandbox's service-account key (created on first use, then kept), without ``token_uri``."""
    path = _key_path(layout)
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("private_key"):
            return {str(k): str(v) for k, v in data.items()}
    except (OSError, ValueError):
        pass
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    email = f"{ACCOUNT_ID}@{project}.iam.gserviceaccount.com"
    data = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email,
        "client_id": str(
            100_000_000_000_000_000_000 + int(hashlib.sha256(email.encode()).hexdigest()[:16], 16)
        ),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email.replace('@', '%40')}",
        "universe_domain": "googleapis.com",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return data


def token_uri(api_url: str) -> str:
    """The token endpoint of the API server at ``api_url``."""
    return api_url.rstrip("/") + TOKEN_PATH


def keyfile_dict(layout: SandboxLayout, api_url: str, project: str) -> dict[str, str]:
    """The service-account JSON a GCP connection's ``keyfile_dict`` holds."""
    return {**ensure_service_account(layout, project), "token_uri": token_uri(api_url)}


def _accounts(layout: SandboxLayout) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(_key_path(layout).read_text())
    except (OSError, ValueError):
        return {}
    return {str(data["client_email"]): data} if isinstance(data, dict) and "client_email" in data else {}


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _decode(assertion: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
    """``(header, claims, signed bytes, signature)``; :class:`ValueError` if malformed."""
    parts = assertion.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    try:
        header = json.loads(_b64decode(parts[0]))
        claims = json.loads(_b64decode(parts[1]))
        signature = _b64decode(parts[2])
    except (binascii.Error, ValueError, UnicodeDecodeError) as error:
        raise ValueError(str(error)) from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise ValueError("not a JWT")
    return header, claims, f"{parts[0]}.{parts[1]}".encode(), signature


@functools.lru_cache(maxsize=64)
def _public_key(private_key_pem: str) -> rsa.RSAPublicKey | None:
    """The public half of a service account's RSA key (loading the PEM checks the key, which costs
    tens of milliseconds: the API server does it once per key, not once per token)."""
    key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    return key.public_key() if isinstance(key, rsa.RSAPrivateKey) else None


def _signature_ok(
    account: Mapping[str, str], header: Mapping[str, Any], signed: bytes, signature: bytes
) -> bool:
    if header.get("alg") != "RS256":
        return False
    if header.get("kid") not in (None, account.get("private_key_id")):
        return False
    public_key = _public_key(account["private_key"])
    if public_key is None:
        return False
    try:
        public_key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True


def _times_ok(claims: Mapping[str, Any], now: float) -> bool:
    try:
        iat, exp = float(claims["iat"]), float(claims["exp"])
    except (KeyError, TypeError, ValueError):
        return False
    return iat <= now + CLOCK_SKEW and exp > now and exp - iat <= MAX_ASSERTION_LIFETIME


def _remember(layout: SandboxLayout, token: str, email: str, scope: str, expires: float) -> None:
    now = time.time()
    with StateStore(layout).txn() as txn:
        tokens = txn.doc(TOKENS_DOC)
        for digest in [d for d, t in tokens.items() if float(t.get("expires", 0)) < now]:
            del tokens[digest]
        tokens[hashlib.sha256(token.encode()).hexdigest()] = {
            "email": email,
            "scope": scope,
            "expires": expires,
        }
        txn.save(TOKENS_DOC)


def grant(layout: SandboxLayout, form: Mapping[str, str], own_token_uri: str) -> dict[str, Any]:
    """Answer a token request (form fields); raises :class:`GrantError` as Google refuses."""
    grant_type = form.get("grant_type", "")
    if grant_type != JWT_BEARER:
        raise GrantError("unsupported_grant_type", f"Invalid grant_type: {grant_type}")
    assertion = form.get("assertion", "")
    try:
        header, claims, signed, signature = _decode(assertion)
    except ValueError:
        raise GrantError("invalid_grant", "Invalid JWT: Unexpected JWT format.") from None
    account = _accounts(layout).get(str(claims.get("iss", "")))
    if account is None:
        raise GrantError("invalid_grant", "Invalid grant: account not found")
    if not _signature_ok(account, header, signed, signature):
        raise GrantError("invalid_grant", "Invalid JWT Signature.")
    if claims.get("aud") not in (*GOOGLE_TOKEN_AUDIENCES, own_token_uri):
        raise GrantError(
            "invalid_grant",
            f"Invalid JWT: Failed audience check. The right audience is {GOOGLE_TOKEN_AUDIENCES[0]}",
        )
    if not _times_ok(claims, time.time()):
        raise GrantError("invalid_grant", EXPIRED_OR_LONG)
    scope = str(claims.get("scope") or "")
    if not scope.strip():
        raise GrantError("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
    token, _ = issue(layout, str(account["client_email"]), scope, TOKEN_LIFETIME)
    return {"access_token": token, "expires_in": TOKEN_LIFETIME, "token_type": "Bearer"}


def issue(layout: SandboxLayout, email: str, scope: str, lifetime: float) -> tuple[str, float]:
    """A new access token of ``email`` (remembered, so the fake APIs accept it) and its expiry."""
    token = "ya29.sandbox-" + secrets.token_urlsafe(48)
    expires = time.time() + lifetime
    _remember(layout, token, email, scope, expires)
    return token, expires


def token_valid(layout: SandboxLayout, token: str) -> bool:
    """Whether ``token`` is an unexpired access token the endpoint issued."""
    record = StateStore(layout).read(TOKENS_DOC).get(hashlib.sha256(token.encode()).hexdigest())
    return record is not None and float(record.get("expires", 0)) > time.time()


def self_signed_jwt_valid(layout: SandboxLayout, token: str, audiences: Iterable[str]) -> bool:
    """A self-signed JWT (https://google.aip.dev/auth/4111) Google APIs accept in place of a token.

    google-api-core clients switch service-account credentials to it
    (``with_always_use_jwt_access(True)``): signed by the account's key, ``iss`` = ``sub`` = the
    account, and either a ``scope`` claim or ``aud`` the API's service URL.
    """
    try:
        header, claims, signed, signature = _decode(token)
    except ValueError:
        return False
    account = _accounts(layout).get(str(claims.get("iss", "")))
    if account is None or claims.get("sub", claims.get("iss")) != claims.get("iss"):
        return False
    if not _signature_ok(account, header, signed, signature) or not _times_ok(claims, time.time()):
        return False
    return bool(str(claims.get("scope") or "").strip()) or claims.get("aud") in set(audiences)


def bearer_valid(
    layout: SandboxLayout, authorization: str | None, self_signed_audiences: Iterable[str] = ()
) -> bool:
    """Whether an ``Authorization`` header carries an issued token (or an accepted self-signed JWT)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return False
    if token_valid(layout, token):
        return True
    audiences = list(self_signed_audiences)
    return bool(audiences) and self_signed_jwt_valid(layout, token, audiences)


def iam_credentials_endpoint(api_url: str) -> str:
    """The API server's ``generateAccessToken`` URL in the form of google-auth's
    ``google.auth.iam._IAM_ENDPOINT`` (``{}`` the account). google-auth's impersonated credentials
    post to ``https://iamcredentials.googleapis.com`` and no hook lets a caller say otherwise, so a
    test that impersonates sets that attribute to this (there is no DNS for Google here)."""
    return f"{api_url}/v1/projects/-/serviceAccounts/{{}}:generateAccessToken"


def access_token(layout: SandboxLayout, api_url: str, project: str = "sandbox-project") -> str:
    """An access token from the running token endpoint, obtained as google-auth clients do (for tests)."""
    from google.auth.transport.requests import Request
    from google.oauth2 import service_account

    credentials = service_account.Credentials.from_service_account_info(
        keyfile_dict(layout, api_url, project), scopes=["https://www.googleapis.com/auth/cloud-platform"]
    )
    credentials.refresh(Request())
    return str(credentials.token)


def sign_assertion(layout: SandboxLayout, claims: Mapping[str, Any], kid: str | None = None) -> str:
    """An RS256 JWT over ``claims`` signed with the sandbox account's key (for tests of the endpoint)."""
    account = next(iter(_accounts(layout).values()))
    key = serialization.load_pem_private_key(account["private_key"].encode(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    header = {"alg": "RS256", "typ": "JWT", "kid": kid or account["private_key_id"]}

    def part(value: Mapping[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    signed = f"{part(header)}.{part(claims)}"
    signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signed + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
