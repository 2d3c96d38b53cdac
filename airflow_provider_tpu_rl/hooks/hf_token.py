"""``HuggingFaceTokenHook``: the Hugging Face token, from an Airflow connection or Secret Manager.

The value is masked the moment it is read and returned only for the runner to write on a process's
stdin; it is never logged, put in argv, env, XCom or a file.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseHook

from airflow_provider_tpu_rl.compat import AirflowException, mask_secret
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind
from airflow_provider_tpu_rl.hooks.connection_fields import (
    HUGGINGFACE_CONN_FIELDS,
    HUGGINGFACE_UI_FIELD_BEHAVIOUR,
    legacy_field_behaviour,
    legacy_form_widgets,
)
from airflow_provider_tpu_rl.toolchain.failures import classify_failure

# HTTP/gRPC statuses of a Secret Manager call that a retry may get past.
_TRANSIENT_HTTP_CODES = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_GRPC_NAMES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "ABORTED"}
)
# google.api_core's retry giving up, google.auth's transport failing.
_TRANSIENT_ERROR_NAMES = frozenset({"RetryError", "TransportError"})


def secret_read_failure_kind(err: BaseException) -> FailureKind:
    """Whether a failed Secret Manager read may pass (5xx, 429, timeout, network) or not (403, 404)."""
    code = getattr(err, "code", None)
    if isinstance(code, int) and code in _TRANSIENT_HTTP_CODES:
        return FailureKind.TRANSIENT
    grpc_status = getattr(err, "grpc_status_code", None)
    if getattr(grpc_status, "name", None) in _TRANSIENT_GRPC_NAMES:
        return FailureKind.TRANSIENT
    if isinstance(err, TimeoutError | ConnectionError) or type(err).__name__ in _TRANSIENT_ERROR_NAMES:
        return FailureKind.TRANSIENT
    if isinstance(err, PermissionError | FileNotFoundError):
        return FailureKind.CONFIG
    return classify_failure(f"{type(err).__name__}: {err}")


class HuggingFaceTokenHook(BaseHook):
    """Reads the Hugging Face access token.

    :param hf_conn_id: connection holding the token in its password field (or extra ``token``).
    :param secret_id: when set, read the token from Google Secret Manager instead.
    :param secret_project_id: the secret's project (default: the Google connection's project).
    :param secret_version: the secret version (default ``latest``).
    :param gcp_conn_id: Google connection used for Secret Manager.
    """

    conn_name_attr = "hf_conn_id"
    default_conn_name = "huggingface_default"
    conn_type = "huggingface"
    hook_name = "Hugging Face token"

    def __init__(
        self,
        hf_conn_id: str = default_conn_name,
        *,
        secret_id: str | None = None,
        secret_project_id: str | None = None,
        secret_version: str = "latest",
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.hf_conn_id = hf_conn_id
        self.secret_id = secret_id
        self.secret_project_id = secret_project_id
        self.secret_version = secret_version
        self.gcp_conn_id = gcp_conn_id

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        return legacy_form_widgets(HUGGINGFACE_CONN_FIELDS)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return legacy_field_behaviour(HUGGINGFACE_UI_FIELD_BEHAVIOUR)

    def get_conn(self) -> str:
        return self.get_token()

    def get_token(self) -> str:
        """The token, masked in every log from now on.

        Raises :class:`ConfigurationError` when the connection or secret is missing or empty, and
        :class:`CommandError` when Secret Manager cannot be read (``retryable`` for a 5xx/429/timeout).
        """
        if self.secret_id:
            token = self._token_from_secret_manager()
            source = f"Secret Manager secret {self.secret_id!r}"
        else:
            token = self._token_from_connection()
            source = f"connection {self.hf_conn_id!r}"
        token = token.strip()
        if not token:
            raise ConfigurationError(f"Hugging Face token: {source} is empty")
        mask_secret(token)
        self.log.info("Hugging Face token read from %s", source)
        return token

    def _token_from_connection(self) -> str:
        try:
            conn = self.get_connection(self.hf_conn_id)
        except AirflowException as err:
            raise ConfigurationError(
                f"Hugging Face token: connection {self.hf_conn_id!r} is not defined; create it with the "
                "token as its password, or name a Secret Manager secret (secret_id)"
            ) from err
        token = conn.password or ""
        if token:
            mask_secret(token)
            return token
        extra = conn.extra_dejson or {}
        token = str(extra.get("token") or extra.get("extra__huggingface__token") or "")
        if token:
            mask_secret(token)
            return token
        raise ConfigurationError(
            f"Hugging Face token: connection {self.hf_conn_id!r} has neither a password nor an extra 'token'"
        )

    def _token_from_secret_manager(self) -> str:
        from airflow.providers.google.cloud.hooks.secret_manager import GoogleCloudSecretManagerHook

        from airflow_provider_tpu_rl.hooks.credentials import shared_hook_class

        assert self.secret_id is not None
        hook = shared_hook_class(GoogleCloudSecretManagerHook)(gcp_conn_id=self.gcp_conn_id)
        try:
            response = hook.access_secret(
                project_id=self.secret_project_id,  # None → the connection's project
                secret_id=self.secret_id,
                secret_version=self.secret_version,
            )
        except Exception as err:
            message = (
                f"Hugging Face token: cannot read Secret Manager secret {self.secret_id!r} "
                f"(project {self.secret_project_id or 'of ' + self.gcp_conn_id}, "
                f"version {self.secret_version}): {type(err).__name__}: {str(err)[:300]}"
            )
            kind = secret_read_failure_kind(err)
            if kind.retryable:
                raise CommandError(message, kind) from err
            raise ConfigurationError(message) from err
        data = response.payload.data
        token = data.decode("utf-8") if isinstance(data, bytes) else str(data)
        if token:
            mask_secret(token)
        return token


def get_hf_token(
    hf_conn_id: str = HuggingFaceTokenHook.default_conn_name,
    *,
    secret_id: str | None = None,
    secret_project_id: str | None = None,
    gcp_conn_id: str = "google_cloud_default",
) -> str:
    """Shortcut for ``HuggingFaceTokenHook(...).get_token()``."""
    return HuggingFaceTokenHook(
        hf_conn_id, secret_id=secret_id, secret_project_id=secret_project_id, gcp_conn_id=gcp_conn_id
    ).get_token()


def token_digest(token: str, salt: bytes | None = None) -> str:
    """``<salt hex>.<HMAC-SHA256(salt, token) hex>``: what the secret's annotation keeps.

    A fresh random salt each time a version is stored; the token itself is never written anywhere
    but the secret version.
    """
    import hashlib
    import hmac
    import secrets

    key = salt if salt is not None else secrets.token_bytes(16)
    return f"{key.hex()}.{hmac.new(key, token.encode(), hashlib.sha256).hexdigest()}"


def token_matches_digest(token: str, digest: str | None) -> bool:
    """Whether ``digest`` (from :func:`token_digest`) was made from ``token``; junk is no match."""
    import hmac

    salt_hex, _, _ = (digest or "").partition(".")
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    return bool(salt) and hmac.compare_digest(token_digest(token, salt), str(digest))
