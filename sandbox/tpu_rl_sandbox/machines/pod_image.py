"""Library files a fake pod's image holds, written into the pod at start (:class:`hosts.PodHost`).

``python3 -c`` runs for real in the pod (:mod:`~tpu_rl_sandbox.machines.machine`), so what the rendered commands import or
edit must exist at the real paths of the ``tpu_post_training:0.2.4`` image
(``python:3.12-slim-bookworm`` base: site-packages in ``/usr/local/lib/python3.12``; MaxText's
source in ``/deps/src/maxtext``, see MaxText's
``src/dependencies/dockerfiles/maxtext_tpu_dependencies.Dockerfile`` at ``maxtext-v0.2.4``):

* the two files the image workarounds patch (``TUNIX_RESHARD_PATCH`` and ``ADAFACTOR_PATCH`` in
  ``airflow_provider_tpu_rl/render/gke.py``), holding only the lines those patches edit, copied
  verbatim from the pinned sources (cited on each);
* ``google.auth`` / ``requests`` stand-ins, so the Secret Manager read of the rendered commands
  (``render/shell.py``) runs as written and is answered by the sandbox.
"""

from __future__ import annotations

from typing import Final

SITE_PACKAGES: Final = "/usr/local/lib/python3.12/site-packages"
UTILS_RL_PATH: Final = "/deps/src/maxtext/trainers/post_train/rl/utils_rl.py"
VLLM_SAMPLER_PATH: Final = f"{SITE_PACKAGES}/tunix/generate/vllm_sampler.py"

# google/tunix, tunix/generate/vllm_sampler.py at c4ec573d29e4c3a3955b348256d464b119c8a6d1 -- the
# google-tunix pin of MaxText maxtext-v0.2.4 (src/dependencies/extra_deps/post_train_github_deps.txt),
# the MaxText release of the tpu_post_training:0.2.4 image. Line 74 (VllmConfig field) and line 215
# (the reshard call in VllmSampler.update_params), verbatim with their indentation.
TUNIX_CONFIG_LINE: Final = "  reshard_chunk_size: Optional[int] = None"
TUNIX_CALL_LINE: Final = "          reshard_chunk_size=self.config.reshard_chunk_size,"

VLLM_SAMPLER: Final = f'''"""Sandbox stand-in for tunix/generate/vllm_sampler.py: only the lines the reshard patch edits.

Lines 74 and 215 of google/tunix@c4ec573d29e4c3a3955b348256d464b119c8a6d1, verbatim.
"""

import dataclasses
from typing import Optional


@dataclasses.dataclass
class VllmConfig:
{TUNIX_CONFIG_LINE}


class VllmSampler:
  def update_params(self, utils, updated_weights):
    utils.transfer_state_directly(
        src_state=updated_weights,
{TUNIX_CALL_LINE}
    )
'''

# AI-Hypercomputer/maxtext, src/maxtext/trainers/post_train/rl/utils_rl.py at tag maxtext-v0.2.4
# (538fe7a3f3376d94cf3f04e77741aa6d7e8efa45), lines 631-638 (get_optimizer's make_optimizer),
# verbatim with their indentation.
ADAMW_CALL: Final = """    transforms.append(
        optax.adamw(
            learning_rate=learning_rate,
            b1=tmvp_config.adam_b1,
            b2=tmvp_config.adam_b2,
            weight_decay=tmvp_config.adam_weight_decay,
        )
    )"""

UTILS_RL: Final = f'''"""Sandbox stand-in for maxtext/trainers/post_train/rl/utils_rl.py: only what the Adafactor patch edits.

Lines 631-638 of AI-Hypercomputer/maxtext@maxtext-v0.2.4, verbatim.
"""


def make_optimizer(optax, tmvp_config, learning_rate):
    transforms = []
{ADAMW_CALL}
    return optax.chain(*transforms)
'''

_TOOL_CLIENT = '''
def _sandbox_request(method, url, headers):
    """Ask the sandbox (the machine's tool server) for ``url``: ``(status, body)``."""
    import json, os, socket, struct

    with open("/run/tpu-rl-sandbox/tools") as handle:
        address = handle.read().strip()
    body = json.dumps(
        {"tool": "http", "path": __file__, "argv": [method, url, json.dumps(dict(headers or {}))],
         "env": {}, "cwd": os.getcwd()}
    ).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\\0" + address)
    null = os.open("/dev/null", os.O_RDWR)
    socket.send_fds(sock, [struct.pack("!I", len(body))], [null, null, null])
    os.close(null)
    sock.sendall(body)
    reply = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    answer = json.loads(reply)
    return int(answer["exit"]), answer["data"]
'''

GOOGLE_AUTH: Final = '''"""Sandbox stand-in for google-auth's ``google.auth`` (Application Default Credentials).

Follows google/auth/_default.py: with no GOOGLE_APPLICATION_CREDENTIALS and no gcloud user
credentials, ``default()`` asks the GCE/GKE metadata server (Workload Identity on GKE) and returns
``(credentials, project_id)``; without a metadata server it raises DefaultCredentialsError.
"""

__version__ = "2.40.3"


from google.auth.exceptions import DefaultCredentialsError


class Credentials:
    """compute_engine.Credentials: the pod's service account, scoped as asked."""

    def __init__(self, scopes=None, default_scopes=None):
        self.scopes = scopes
        self.default_scopes = default_scopes
        self.token = None


def default(scopes=None, request=None, quota_project_id=None, default_scopes=None):
    from google.auth.transport.requests import _sandbox_request

    try:
        status, project = _sandbox_request(
            "GET",
            "http://metadata.google.internal/computeMetadata/v1/project/project-id",
            {"Metadata-Flavor": "Google"},
        )
    except OSError:
        status, project = 0, ""
    if status != 200:
        raise DefaultCredentialsError(
            "Your default credentials were not found. To set up Application Default Credentials, see "
            "https://cloud.google.com/docs/authentication/external/set-up-adc for more information."
        )
    return Credentials(scopes, default_scopes), project
'''

GOOGLE_AUTH_EXCEPTIONS: Final = '''"""Sandbox stand-in for google.auth.exceptions: the classes and bases of google-auth 2.63.0."""


class GoogleAuthError(Exception):
    """Base class for all google.auth errors."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args)
        self._retryable = kwargs.get("retryable", False)

    @property
    def retryable(self):
        return self._retryable


class TransportError(GoogleAuthError):
    """Used to indicate an error occurred during an HTTP request."""


class RefreshError(GoogleAuthError):
    """Used to indicate that an refreshing the credentials' access token failed."""


class DefaultCredentialsError(GoogleAuthError):
    """Used to indicate that acquiring default credentials failed."""
'''

GOOGLE_AUTH_TRANSPORT_REQUESTS: Final = (
    '''"""Sandbox stand-in for ``google.auth.transport.requests.AuthorizedSession``.

A requests.Session that sends the credentials' token (google/auth/transport/requests.py). The
sandbox has no network: Google API URLs are answered by the sandbox (Secret Manager's
``v1/{name}:access``, the metadata server); any other host raises ConnectionError as an
unreachable host does in requests.
"""

import requests


class AuthorizedSession:
    def __init__(self, credentials, refresh_status_codes=(401,), max_refresh_attempts=2,
                 refresh_timeout=None, auth_request=None, default_host=None):
        self.credentials = credentials

    def _refresh(self):
        """compute_engine.Credentials.refresh: the token from the metadata server. A status that
        google-auth does not retry (the GKE metadata server's 403 while the pod's Workload Identity
        binding is not in effect) is its TransportError, raised as a RefreshError
        (compute_engine/_metadata.py get, credentials.py _perform_refresh_token)."""
        import json

        from google.auth import exceptions

        url = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
        scopes = self.credentials.scopes or self.credentials.default_scopes
        if scopes:
            url += "?scopes=" + ",".join(scopes)
        status, body = _sandbox_request("GET", url, {"Metadata-Flavor": "Google"})
        if status != 200:
            caught = exceptions.TransportError(
                "Failed to retrieve {} from the Google Compute Engine metadata service. Status: {} "
                "Response:\\n{}".format(url, status, body.encode())
            )
            raise exceptions.RefreshError(caught) from caught
        self.credentials.token = json.loads(body)["access_token"]

    def request(self, method, url, data=None, headers=None, **kwargs):
        if self.credentials.token is None:
            self._refresh()
        host = url.split("/")[2] if "://" in url else ""
        if not (host.endswith(".googleapis.com") or host == "metadata.google.internal"):
            raise requests.exceptions.ConnectionError(
                f"HTTPSConnectionPool(host='{host}', port=443): Max retries exceeded with url: {url} "
                "(Caused by NameResolutionError: Failed to resolve (sandbox: no network))"
            )
        status, body = _sandbox_request(method, url, headers)
        return requests.Response._sandbox(url, status, body)

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)
'''
    + _TOOL_CLIENT
)

REQUESTS: Final = '''"""Sandbox stand-in for the parts of ``requests`` an AuthorizedSession answer uses.

``Response.raise_for_status`` raises HTTPError with requests' own message
("{code} Client Error: {reason} for url: {url}", requests/models.py).
"""

import http
import json

from requests import exceptions

__version__ = "2.32.4"


class Response:
    @classmethod
    def _sandbox(cls, url, status, body):
        response = cls()
        response.url = url
        response.status_code = status
        response.text = body
        try:
            response.reason = http.HTTPStatus(status).phrase
        except ValueError:
            response.reason = ""
        return response

    def json(self):
        return json.loads(self.text)

    def raise_for_status(self):
        if 400 <= self.status_code < 500:
            kind = "Client Error"
        elif 500 <= self.status_code < 600:
            kind = "Server Error"
        else:
            return
        raise exceptions.HTTPError(
            f"{self.status_code} {kind}: {self.reason} for url: {self.url}", response=self
        )
'''

REQUESTS_EXCEPTIONS: Final = '''"""Sandbox stand-in for requests.exceptions (the class names and bases requests uses)."""


class RequestException(IOError):
    def __init__(self, *args, response=None, **kwargs):
        super().__init__(*args)
        self.response = response


class HTTPError(RequestException):
    """An HTTP error occurred."""


class ConnectionError(RequestException):
    """A Connection error occurred."""
'''

POD_FILES: Final[dict[str, str]] = {
    f"{SITE_PACKAGES}/tunix/__init__.py": '"""google-tunix (sandbox stand-in)."""\n',
    f"{SITE_PACKAGES}/tunix/generate/__init__.py": "",
    VLLM_SAMPLER_PATH: VLLM_SAMPLER,
    f"{SITE_PACKAGES}/google/auth/__init__.py": GOOGLE_AUTH,
    f"{SITE_PACKAGES}/google/auth/exceptions.py": GOOGLE_AUTH_EXCEPTIONS,
    f"{SITE_PACKAGES}/google/auth/transport/__init__.py": "",
    f"{SITE_PACKAGES}/google/auth/transport/requests.py": GOOGLE_AUTH_TRANSPORT_REQUESTS,
    f"{SITE_PACKAGES}/requests/__init__.py": REQUESTS,
    f"{SITE_PACKAGES}/requests/exceptions.py": REQUESTS_EXCEPTIONS,
    UTILS_RL_PATH: UTILS_RL,
}
