"""Application Default Credentials as ``gcluster job submit`` finds them, in the env it runs with.

Cluster Toolkit's ``job submit`` refuses without ADC (cmd/job/prereq.go ``getADCSetupCommand``:
golang.org/x/oauth2 ``google.FindDefaultCredentials(ctx, cloud-platform)``, then a token). The
search order is golang/oauth2 v0.34.0 google/default.go ``FindDefaultCredentialsWithParams``:

1. ``GOOGLE_APPLICATION_CREDENTIALS`` (a file that does not load is an error, no fallback);
2. ``$HOME/.config/gcloud/application_default_credentials.json`` (``wellKnownFile``: ``$HOME``,
   never ``CLOUDSDK_CONFIG``); gcluster runs with a fresh HOME, so this is found only there;
3. the GCE metadata server (``metadata.OnGCE``: ``GCE_METADATA_HOST`` or 169.254.169.254, answering
   with the ``Metadata-Flavor: Google`` header), reached directly, never through a proxy.

Each step loads the credentials with google-auth and fetches a token, every request bounded.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
ADC_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
WELL_KNOWN_NAME = "application_default_credentials.json"
METADATA_HOST_ENV = "GCE_METADATA_HOST"
METADATA_HOST = "169.254.169.254"
METADATA_TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"


@dataclass(frozen=True)
class AdcStatus:
    """Where gcluster would find usable ADC (``source``), or why it would not (``problem``)."""

    source: str | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class _BoundedRequest:
    """google-auth's requests transport with a timeout on every call."""

    def __init__(self, timeout: float) -> None:
        import google.auth.transport.requests

        self._request = google.auth.transport.requests.Request()
        self._timeout = timeout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = self._timeout
        return self._request(*args, **kwargs)


def _file_problem(path: str, timeout: float) -> str | None:
    """Load the credentials file at ``path`` and fetch a token: the error, or ``None``."""
    import google.auth
    import google.auth.exceptions

    try:
        credentials, _ = google.auth.load_credentials_from_file(path, scopes=[CLOUD_PLATFORM])
        credentials.refresh(_BoundedRequest(timeout))
    except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def _metadata_problem(env: Mapping[str, str], timeout: float) -> str | None:
    """A token from the metadata server (no proxy), or why there is none."""
    host = env.get(METADATA_HOST_ENV) or METADATA_HOST
    query = urllib.parse.urlencode({"scopes": CLOUD_PLATFORM})
    request = urllib.request.Request(
        f"http://{host}{METADATA_TOKEN_PATH}?{query}", headers={"Metadata-Flavor": "Google"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            if response.headers.get("Metadata-Flavor") != "Google":
                return f"not on Google Cloud: {host} is no metadata server"
            token = json.loads(response.read() or b"{}").get("access_token")
    except urllib.error.HTTPError as err:
        if err.headers.get("Metadata-Flavor") != "Google":
            return f"not on Google Cloud: {host} is no metadata server"
        return f"the metadata server gave no token (HTTP {err.code})"
    except (OSError, ValueError) as err:
        return f"not on Google Cloud: no metadata server at {host} ({err})"
    return None if token else "the metadata server gave no token"


def find_adc(env: Mapping[str, str], *, timeout: float = 20.0) -> AdcStatus:
    """Where a process with ``env`` (gcluster's) finds ADC, in golang/oauth2's order."""
    configured = env.get(ADC_ENV)
    if configured:
        problem = _file_problem(configured, timeout)
        if problem is not None:
            return AdcStatus(problem=f"{ADC_ENV}={configured}: {problem}")
        return AdcStatus(source=f"{ADC_ENV}={configured}")
    home = env.get("HOME")
    known = Path(home) / ".config" / "gcloud" / WELL_KNOWN_NAME if home else None
    if known is not None and known.is_file():
        problem = _file_problem(str(known), timeout)
        if problem is not None:
            return AdcStatus(problem=f"{known}: {problem}")
        return AdcStatus(source=str(known))
    problem = _metadata_problem(env, timeout)
    if problem is not None:
        return AdcStatus(problem=f"no {ADC_ENV}, no {WELL_KNOWN_NAME} in its HOME, {problem}")
    return AdcStatus(source="the metadata server")


def worker_adc_file(env: Mapping[str, str] | None = None) -> str | None:
    """An ADC file the worker itself has (``gcloud auth application-default login`` writes it to
    gcloud's config folder: ``CLOUDSDK_CONFIG``, else ``~/.config/gcloud``)."""
    env = os.environ if env is None else env
    folders = [env.get("CLOUDSDK_CONFIG")]
    home = env.get("HOME") or str(Path.home())
    folders.append(str(Path(home) / ".config" / "gcloud"))
    for folder in folders:
        if folder and (Path(folder) / WELL_KNOWN_NAME).is_file():
            return str(Path(folder) / WELL_KNOWN_NAME)
    return None
