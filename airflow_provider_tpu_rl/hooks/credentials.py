"""One set of Google credentials per connection per process, shared by the provider's hooks.

Every ``GoogleBaseHook`` builds its credentials from the connection on first use: the key file's
RSA key parsed, then a token fetched on the first call. A task makes several hooks (GCS reads and
writes, the GKE API, the Kubernetes API token, Resource Manager) and a triggerer or ``airflow
dags test`` process many more, so the same key was parsed tens of times and a token fetched for
each. :class:`SharedCredentials` keeps what ``get_credentials_and_project_id`` returned, keyed by
everything it is built from (connection id and extras, impersonation chain, scopes, quota
project), for :data:`REUSE_SECONDS`; google-auth refreshes the shared credentials' token when it
expires. The hooks stay the google provider's own (:func:`gcs_hook`, :func:`shared_hook_class`).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar, cast

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.spec.errors import SpecError

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from google.auth.credentials import Credentials

_H = TypeVar("_H")

REUSE_SECONDS = 1800.0  # a changed key file is read again after this, as a fresh process would

_lock = threading.Lock()
_shared: dict[tuple[Any, ...], tuple[float, Any, str | None, Any]] = {}


def impersonation(chain: Any) -> str | list[str] | None:
    """An ``impersonation_chain`` as every hook of this provider passes it on: none (empty), one
    account (a string) or a delegation chain (a list, the last account impersonated), read as
    gcloud and the google provider both read it
    (:func:`~airflow_provider_tpu_rl.spec.rules.impersonation_accounts`: ``"a,b"`` is the chain
    ``["a", "b"]``); anything else is a one-line :class:`SpecError`."""
    from airflow_provider_tpu_rl.spec.rules import impersonation_accounts

    accounts = impersonation_accounts("impersonation_chain", chain)
    if not accounts:
        return None
    return accounts[0] if len(accounts) == 1 else list(accounts)


def _key(hook: Any) -> tuple[Any, ...]:
    chain = hook.impersonation_chain
    return (
        hook.gcp_conn_id,
        json.dumps(hook.extras, sort_keys=True, default=str),
        chain if chain is None or isinstance(chain, str) else tuple(chain),
        tuple(hook.scopes or ()),
        getattr(hook, "quota_project_id", None),
    )


def clear() -> None:
    """Forget every shared credential (tests; a process that changed a connection)."""
    with _lock:
        _shared.clear()


class SharedCredentials:
    """Mixin for a ``GoogleBaseHook`` subclass: credentials built once per connection per process."""

    def get_credentials_and_project_id(self) -> tuple[Credentials, str | None]:
        hook: Any = self
        try:  # one reading of the chain, whatever hook or trigger got it (a string from a template)
            hook.impersonation_chain = impersonation(hook.impersonation_chain)
        except SpecError as err:
            raise ConfigurationError(str(err)) from None
        key = _key(hook)
        with _lock:
            hit = _shared.get(key)
        if hit is not None and time.monotonic() - hit[0] < REUSE_SECONDS:
            _, credentials, project_id, chain = hit
            if not hook.impersonation_chain:  # what the provider's method sets from the connection
                hook.impersonation_chain = chain
            return credentials, project_id
        credentials, project_id = super().get_credentials_and_project_id()  # type: ignore[misc]
        with _lock:
            _shared[key] = (time.monotonic(), credentials, project_id, hook.impersonation_chain)
        return credentials, project_id


def shared_hook_class(hook_class: type[_H]) -> type[_H]:
    """``hook_class`` (a ``GoogleBaseHook``) with :class:`SharedCredentials` (one class per hook class)."""
    return cast("type[_H]", _with_shared_credentials(cast("type", hook_class)))


@functools.cache
def _with_shared_credentials(hook_class: type) -> type:
    return type(hook_class.__name__, (SharedCredentials, hook_class), {"__module__": __name__})


def gcs_hook(gcp_conn_id: str, impersonation_chain: str | Any | None = None) -> GCSHook:
    """The google provider's ``GCSHook`` for ``gcp_conn_id``, on this process's shared credentials."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    return shared_hook_class(GCSHook)(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain)
