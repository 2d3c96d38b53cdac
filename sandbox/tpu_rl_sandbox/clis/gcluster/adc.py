"""Application Default Credentials as the fake ``gcluster`` finds them, and the sandbox's ADC key.

gcluster's ``getADCSetupCommand`` (cmd/job/prereq.go, cluster-toolkit v1.95.0) calls
golang.org/x/oauth2 v0.34.0 ``google.FindDefaultCredentials(ctx, cloud-platform)`` and then fetches a
token; either failing means "ADC missing". :func:`find_adc_problem` follows that search order
(google/default.go ``FindDefaultCredentialsWithParams``):

1. ``GOOGLE_APPLICATION_CREDENTIALS``: the file must read and parse, else an error (no fallback);
2. the well-known file ``$HOME/.config/gcloud/application_default_credentials.json``
   (``wellKnownFile`` / sdk.go ``guessUnixHomeDir``: ``$HOME`` first; ``CLOUDSDK_CONFIG`` is not read);
3. the GCE metadata server (``metadata.OnGCE``): the sandbox runs off Google Cloud, with none.

The token fetch is google-auth's (the JWT-bearer grant against the key's ``token_uri``: the
sandbox's API server for the sandbox key, see :mod:`tpu_rl_sandbox.apis.oauth`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tpu_rl_sandbox.world.layout import SandboxLayout

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
ADC_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
ADC_KEY_FILE = "adc_service_account.json"
# google/default.go adcSetupURL (v0.34.0)
ADC_SETUP_URL = "https://cloud.google.com/docs/authentication/external/set-up-adc"
TOKEN_TIMEOUT_SECONDS = 30.0


def well_known_file(env: Mapping[str, str]) -> Path | None:
    """``wellKnownFile()`` on Linux: ``$HOME/.config/gcloud/application_default_credentials.json``."""
    home = env.get("HOME")
    if not home:
        return None
    return Path(home) / ".config" / "gcloud" / "application_default_credentials.json"


def _token_problem(info: Mapping[str, object]) -> str | None:
    """Fetch a token with the credentials ``info`` describes; the error text, or ``None``."""
    import google.auth
    import google.auth.exceptions
    import google.auth.transport.requests

    try:
        credentials, _ = google.auth.load_credentials_from_dict(dict(info), scopes=[CLOUD_PLATFORM])
    except google.auth.exceptions.GoogleAuthError as error:
        return str(error)
    request = google.auth.transport.requests.Request()
    try:
        credentials.refresh(_Bounded(request))
    except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as error:
        return str(error)
    return None


class _Bounded:
    """A google-auth transport whose every call has a timeout."""

    def __init__(self, request: object) -> None:
        self._request = request

    def __call__(self, *args: object, **kwargs: object) -> object:
        kwargs["timeout"] = TOKEN_TIMEOUT_SECONDS
        return self._request(*args, **kwargs)  # type: ignore[operator]


def _from_file(path: str) -> str | None:
    try:
        info = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        return str(error)
    if not isinstance(info, dict):
        return "credentials file is not a JSON object"
    return _token_problem(info)


def find_adc_problem(env: Mapping[str, str]) -> str | None:
    """Why gcluster would find no usable ADC in ``env`` (its error text), or ``None`` when it would."""
    configured = env.get(ADC_ENV)
    if configured:
        problem = _from_file(configured)
        if problem is not None:
            return f"google: error getting credentials using {ADC_ENV} environment variable: {problem}"
        return None
    known = well_known_file(env)
    if known is not None and known.is_file():
        problem = _from_file(str(known))
        return None if problem is None else f"google: {problem}"
    # metadata.OnGCE(): the sandbox has no metadata server, so FindDefaultCredentials gives up.
    return f"google: could not find default credentials. See {ADC_SETUP_URL} for more information"


def write_adc_key(layout: SandboxLayout, api_url: str, project: str) -> Path:
    """The sandbox's service-account key (``token_uri`` the API server) as a file for
    ``GOOGLE_APPLICATION_CREDENTIALS`` (mode 0600, replaced atomically)."""
    from tpu_rl_sandbox.apis import oauth  # RSA signing: not on every fake gcluster call

    path = layout.root / oauth.CREDENTIALS_DIR / ADC_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".adc.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(oauth.keyfile_dict(layout, api_url, project), handle, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


__all__ = ["ADC_ENV", "CLOUD_PLATFORM", "find_adc_problem", "well_known_file", "write_adc_key"]
