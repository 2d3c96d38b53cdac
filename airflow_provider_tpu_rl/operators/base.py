"""What every operator of this provider shares: connections, the gcluster hook, fail-fast errors."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import ClassifiedError, ConfigurationError
from airflow_provider_tpu_rl.hooks.credentials import impersonation
from airflow_provider_tpu_rl.spec.errors import SpecError

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

F = TypeVar("F", bound=Callable[..., Any])

GCLUSTER_CONN_ID = "gcluster_default"
GCP_CONN_ID = "google_cloud_default"


def fail_fast(method: F) -> F:
    """Turn errors a retry cannot fix into ``AirflowFailException`` (no retry is spent on them).

    A bad argument (:class:`SpecError`), a :class:`ConfigurationError` and a non-retryable
    :class:`CommandError` or :class:`KubernetesApiError` are fatal; a retryable one (capacity,
    network, 5xx, timeout) propagates as is, so the task's retries apply.
    """

    @functools.wraps(method)
    def wrapper(self: BaseOperator, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except SpecError as err:
            raise AirflowFailException(f"{self.task_id}: invalid argument: {err}") from None
        except ConfigurationError as err:
            raise AirflowFailException(str(err)) from err
        except ClassifiedError as err:  # a gcluster/gcloud command, a GKE or Kubernetes API call
            if err.retryable:
                raise
            raise AirflowFailException(str(err)) from err

    return wrapper  # type: ignore[return-value]


def chain_of(impersonation_chain: str | Sequence[str] | None) -> str | list[str] | None:
    """A rendered ``impersonation_chain``: empty (``""``, ``[]``, ``None``) is none; one account is
    a string; a delegation chain a list, each account impersonating the next, the last one's token
    used (as the google provider reads a list).

    A string is read as gcloud reads it (a comma-separated chain): ``"a,b"`` is the chain
    ``["a", "b"]`` for every hook, never the one account "a,b" for the google provider and a
    two-account chain for gcloud. Anything else than service accounts: a one-line SpecError
    (:func:`~airflow_provider_tpu_rl.hooks.credentials.impersonation`).
    """
    return impersonation(impersonation_chain)


def connection_project(gcp_conn_id: str, impersonation_chain: str | Sequence[str] | None) -> str:
    """The project of the Google Cloud connection, as the google provider's hooks default it.

    ``GoogleBaseHook.project_id``: the connection's ``project`` extra, else the key file's (or the
    ADC's) project. A one-line :class:`ConfigurationError` when there is none.
    """
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    from airflow_provider_tpu_rl.hooks.credentials import shared_hook_class

    try:
        hook = shared_hook_class(GoogleBaseHook)(
            gcp_conn_id=gcp_conn_id, impersonation_chain=chain_of(impersonation_chain)
        )
        project = hook.project_id
    except Exception as err:  # no such connection, unreadable key file, no ADC
        raise ConfigurationError(
            f"project_id is empty and the project of connection {gcp_conn_id!r} cannot be read: {err}"
        ) from err
    if not project:
        raise ConfigurationError(
            f"project_id is empty and connection {gcp_conn_id!r} names no project: "
            "pass project_id or set the connection's project"
        )
    return str(project)


def expiry_of_run(context: Context, hours: int) -> int:
    """Expiry label: the run's start plus the allowed hours (the same value on every retry)."""
    dag_run = context.get("dag_run")
    start = getattr(dag_run, "start_date", None) or getattr(dag_run, "logical_date", None)
    started = start.timestamp() if start is not None else time.time()
    return int(started + int(hours) * 3600)


class GclusterBaseOperator(BaseOperator):
    """Base of the operators that run ``gcluster``/``gcloud`` through :class:`GclusterHook`.

    :param gcluster_conn_id: the ``gcluster`` connection (tool paths, bundle, inherited env).
    :param gcp_conn_id: the Google Cloud connection for GCS reads and writes.
    :param impersonation_chain: service account to impersonate, or a delegation chain (a list, the
        last account's token used), as in the google provider's operators. The provider's Google
        API calls (GCS, GKE, Kubernetes) use it through the google provider's hooks; ``gcloud``
        and ``gcluster`` get it as ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT``, Terraform (under
        ``gcluster deploy``/``destroy``) as ``GOOGLE_IMPERSONATE_SERVICE_ACCOUNT``
        (:func:`~airflow_provider_tpu_rl.hooks.gcluster.impersonation_env`). Empty: none.
    """

    project_id: str | None  # set by the operators that take one

    def __init__(
        self,
        *,
        gcluster_conn_id: str = GCLUSTER_CONN_ID,
        gcp_conn_id: str = GCP_CONN_ID,
        impersonation_chain: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gcluster_conn_id = gcluster_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._hook: GclusterHook | None = None

    @property
    def chain(self) -> str | list[str] | None:
        """The rendered ``impersonation_chain``, ``None`` when empty."""
        return chain_of(self.impersonation_chain)

    @property
    def hook(self) -> GclusterHook:
        if self._hook is None:
            from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

            self._hook = GclusterHook(gcluster_conn_id=self.gcluster_conn_id, impersonation_chain=self.chain)
        return self._hook

    def resolve_project_id(self) -> str:
        """``project_id`` as rendered, or (empty) the GCP connection's project; set on the task.

        Called at the start of ``execute`` (templates are rendered by then), as the google
        provider's operators fall back to ``GoogleBaseHook.project_id``.
        """
        if not self.project_id:
            self.project_id = connection_project(self.gcp_conn_id, self.chain)
            self.log.info(
                "project_id is empty: using connection %s's project %s", self.gcp_conn_id, self.project_id
            )
        return str(self.project_id)

    def run_ids(self, context: Context) -> tuple[str, str]:
        """``(dag_id, run_id)`` of the running task: what retry-stable names derive from."""
        return self.dag_id, str(context["run_id"])

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.terminate()
