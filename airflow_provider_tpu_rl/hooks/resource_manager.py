"""``ProjectPermissionsHook``: which IAM permissions the caller holds on a project.

The Resource Manager ``projects.testIamPermissions`` call through the google provider's
credentials (``GoogleBaseHook``: the GCP connection, impersonation chain, universe domain) and the
``google-cloud-resource-manager`` client. It needs no permission itself and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import requests
from airflow.providers.google.common.consts import CLIENT_INFO
from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions

from airflow_provider_tpu_rl.compat import client_options
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind
from airflow_provider_tpu_rl.hooks.credentials import SharedCredentials

if TYPE_CHECKING:
    from google.cloud.resourcemanager_v3 import ProjectsClient

# Permissions per testIamPermissions request: the IAM API's limit is 100.
MAX_PERMISSIONS_PER_CALL = 100
CALL_TIMEOUT = 60.0

_TRANSIENT = (
    api_exceptions.TooManyRequests,
    api_exceptions.InternalServerError,
    api_exceptions.BadGateway,
    api_exceptions.ServiceUnavailable,
    api_exceptions.GatewayTimeout,
    api_exceptions.DeadlineExceeded,
    api_exceptions.RetryError,
    auth_exceptions.TransportError,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


class ProjectPermissionsHook(SharedCredentials, GoogleBaseHook):
    """Tests the GCP connection's permissions on a project (Resource Manager API, REST transport).

    :param gcp_conn_id: the Google Cloud connection whose credentials are tested.
    :param impersonation_chain: service account(s) to impersonate, as in the google provider.
    :param api_endpoint: another Resource Manager endpoint (``host:port`` or ``http://host:port``),
        for an emulator; ``None`` = the default ``cloudresourcemanager.googleapis.com``.
    """

    hook_name = "Google Cloud Resource Manager (permission checks)"

    def __init__(
        self,
        gcp_conn_id: str = GoogleBaseHook.default_conn_name,
        impersonation_chain: str | Sequence[str] | None = None,
        *,
        api_endpoint: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain, **kwargs)
        self.api_endpoint = api_endpoint or None
        self._client: ProjectsClient | None = None

    @staticmethod
    def load_client_library() -> None:
        """Import the Resource Manager client library (heavy), e.g. ahead of the call, in a thread."""
        import google.cloud.resourcemanager_v3  # noqa: F401

    def get_conn(self) -> ProjectsClient:
        """The Resource Manager ``ProjectsClient`` (REST), built once."""
        if self._client is None:
            from google.cloud.resourcemanager_v3 import ProjectsClient

            try:
                credentials = self.get_credentials()
            except (auth_exceptions.GoogleAuthError, ValueError) as err:
                raise ConfigurationError(
                    f"GCP connection {self.gcp_conn_id!r}: no usable credentials: {_one_line(err)}"
                ) from err
            self._client = ProjectsClient(
                credentials=credentials,
                client_info=CLIENT_INFO,
                client_options=client_options(self, self.api_endpoint),
                transport="rest",
            )
        return self._client

    def caller_member(self) -> str | None:
        """The caller as an IAM member (``serviceAccount:...``), when its credentials name it."""
        try:
            credentials = self.get_credentials()
        except Exception:  # the permission test reports credential problems itself
            return None
        # service-account, impersonated and Compute Engine credentials name their account
        email = getattr(credentials, "service_account_email", None)
        if isinstance(email, str) and "@" in email:
            return f"serviceAccount:{email}"
        return None

    @GoogleBaseHook.quota_retry()
    def _test_chunk(self, client: ProjectsClient, resource: str, permissions: list[str]) -> list[str]:
        response = client.test_iam_permissions(
            request={"resource": resource, "permissions": permissions}, timeout=CALL_TIMEOUT
        )
        return list(response.permissions)

    def test_permissions(self, project_id: str, permissions: Sequence[str]) -> set[str]:
        """The subset of ``permissions`` the caller holds on ``project_id``.

        Asks in chunks of :data:`MAX_PERMISSIONS_PER_CALL`. A refusal (no access to the project,
        the API disabled, an unknown permission, bad credentials) is a
        :class:`ConfigurationError`; a 429/5xx, timeout or network error a transient
        :class:`CommandError`.
        """
        wanted = list(dict.fromkeys(permissions))
        if not wanted:
            return set()
        client = self.get_conn()
        resource = f"projects/{project_id}"
        granted: set[str] = set()
        try:
            for start in range(0, len(wanted), MAX_PERMISSIONS_PER_CALL):
                chunk = wanted[start : start + MAX_PERMISSIONS_PER_CALL]
                granted.update(self._test_chunk(client, resource, chunk))
        except _TRANSIENT as err:
            raise CommandError(
                f"testIamPermissions on {resource} failed (transient): {_one_line(err)}",
                FailureKind.TRANSIENT,
            ) from err
        except api_exceptions.GoogleAPICallError as err:
            raise ConfigurationError(
                f"testIamPermissions on {resource} was refused: {_one_line(err)}"
            ) from err
        except auth_exceptions.GoogleAuthError as err:
            raise ConfigurationError(
                f"GCP connection {self.gcp_conn_id!r}: credentials failed: {_one_line(err)}"
            ) from err
        return granted & set(wanted)
