"""The sandbox's OAuth 2.0 token endpoint (JWT-bearer grant), against the running API server."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.api_server import api_server_url
from tpu_rl_sandbox.commands.lifecycle import SANDBOX_PROJECT, SandboxInfo
from tpu_rl_sandbox.world.layout import SandboxLayout

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def _layout(sandbox: SandboxInfo) -> SandboxLayout:
    return SandboxLayout(sandbox.root)


def _url(sandbox: SandboxInfo) -> str:
    url = api_server_url(_layout(sandbox))
    assert url is not None
    return url


def _post(url: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(  # noqa: S310
        url, data=data, headers={"Content-Type": "application/x-www-form-urlencoded"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _claims(sandbox: SandboxInfo, **overrides: Any) -> dict[str, Any]:
    keyfile = oauth.keyfile_dict(_layout(sandbox), _url(sandbox), SANDBOX_PROJECT)
    now = int(time.time())
    claims = {
        "iss": keyfile["client_email"],
        "aud": keyfile["token_uri"],
        "scope": SCOPE,
        "iat": now,
        "exp": now + 3600,
    }
    claims.update(overrides)
    return claims


def _grant(sandbox: SandboxInfo, assertion: str) -> tuple[int, dict[str, Any]]:
    return _post(oauth.token_uri(_url(sandbox)), {"grant_type": oauth.JWT_BEARER, "assertion": assertion})


def test_connection_holds_the_service_account_key(sandbox: SandboxInfo) -> None:
    extra = json.loads(sandbox.env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])["extra"]
    keyfile = extra["keyfile_dict"]
    assert keyfile["type"] == "service_account"
    assert keyfile["token_uri"] == f"{_url(sandbox)}/token"
    assert keyfile["client_email"].endswith(f"@{SANDBOX_PROJECT}.iam.gserviceaccount.com")
    assert keyfile["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert "is_anonymous" not in extra
    assert sandbox.env["AIRFLOW__TPU_RL__CONTAINER_ENDPOINT"] == _url(sandbox)


def test_google_auth_refresh_gets_a_token_the_apis_accept(sandbox: SandboxInfo) -> None:
    token = oauth.access_token(_layout(sandbox), _url(sandbox))
    assert oauth.token_valid(_layout(sandbox), token)
    assert not oauth.token_valid(_layout(sandbox), token + "x")


def test_a_good_jwt_addressed_to_the_token_uri_is_granted(sandbox: SandboxInfo) -> None:
    status, body = _grant(sandbox, oauth.sign_assertion(_layout(sandbox), _claims(sandbox)))
    assert status == 200, body
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 3600
    assert oauth.token_valid(_layout(sandbox), body["access_token"])


def test_a_jwt_signed_by_another_key_is_refused(sandbox: SandboxInfo) -> None:
    good = oauth.sign_assertion(_layout(sandbox), _claims(sandbox))
    header, payload, _ = good.split(".")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signature = other.sign(f"{header}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
    forged = f"{header}.{payload}." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
    assert _grant(sandbox, forged) == (
        400,
        {"error": "invalid_grant", "error_description": "Invalid JWT Signature."},
    )


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"aud": "https://example.com/token"}, "invalid_grant"),
        ({"iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}, "invalid_grant"),
        ({"exp": int(time.time()) + 7200}, "invalid_grant"),
        ({"scope": ""}, "invalid_scope"),
        ({"iss": "someone@else.iam.gserviceaccount.com"}, "invalid_grant"),
    ],
    ids=["wrong-aud", "expired", "too-long", "no-scope", "unknown-account"],
)
def test_bad_assertions_are_refused_as_google_refuses(
    sandbox: SandboxInfo, overrides: dict[str, Any], error: str
) -> None:
    status, body = _grant(sandbox, oauth.sign_assertion(_layout(sandbox), _claims(sandbox, **overrides)))
    assert status == 400
    assert body["error"] == error
    assert body["error_description"]
    assert "access_token" not in body


def test_other_grant_types_and_garbage_are_refused(sandbox: SandboxInfo) -> None:
    url = oauth.token_uri(_url(sandbox))
    assert _post(url, {"grant_type": "client_credentials"}) == (
        400,
        {"error": "unsupported_grant_type", "error_description": "Invalid grant_type: client_credentials"},
    )
    status, body = _post(url, {"grant_type": oauth.JWT_BEARER, "assertion": "not-a-jwt"})
    assert (status, body["error"]) == (400, "invalid_grant")
