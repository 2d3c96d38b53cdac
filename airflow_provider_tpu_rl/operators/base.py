"""What every operator of this provider shares: connections, the gcluster hook, fail-fast errors."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import ClassifiedError, ConfigurationError
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
    """

    def __init__(
        self,
        *,
        gcluster_conn_id: str = GCLUSTER_CONN_ID,
        gcp_conn_id: str = GCP_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gcluster_conn_id = gcluster_conn_id
        self.gcp_conn_id = gcp_conn_id
        self._hook: GclusterHook | None = None

    @property
    def hook(self) -> GclusterHook:
        if self._hook is None:
            from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

            self._hook = GclusterHook(gcluster_conn_id=self.gcluster_conn_id)
        return self._hook

    def run_ids(self, context: Context) -> tuple[str, str]:
        """``(dag_id, run_id)`` of the running task: what retry-stable names derive from."""
        return self.dag_id, str(context["run_id"])

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.terminate()
