"""Extra links: to the Google Cloud console (the GKE cluster, the JobSet's head job, its logs, GCS
folders) and to the run's page on the provider's runs dashboard inside Airflow (its curves).

Each link is persisted like the google provider's ``BaseGoogleLink``: the task calls
``SomeLink.persist(context, **values)`` which pushes the values to XCom under the link's key, and
``get_link`` formats the URL from them. (On Airflow 3 the worker then overwrites that XCom with the
formatted URL when the task finishes; ``get_link`` accepts both.)

URL shapes follow Cluster Toolkit's own console links (``pkg/orchestrator/gke/gke_job_orchestrator.go``,
``printConsoleLinks``): the workload's head Job is ``<name>-pathways-head-0`` (Pathways) or
``<name>-main-job-0``, and its pods carry the JobSet label ``jobset.sigs.k8s.io/jobset-name``, which
Cloud Logging shows as ``labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

from airflow_provider_tpu_rl.compat import web_base_url
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import BaseOperator, Context

    from airflow_provider_tpu_rl.compat import TaskInstanceKey

CONSOLE_URL = "https://console.cloud.google.com"
# Where the provider's plugin serves the runs dashboard, on the API server (Airflow 3) or the
# webserver (Airflow 2): the same path on both.
DASHBOARD_PREFIX = "/tpu-rl"


def run_page_path(dag_id: str, run_id: str) -> str:
    """The dashboard's page of one DAG run, from the web server's root."""
    return f"{DASHBOARD_PREFIX}/runs/{_path_segment(dag_id)}/{_path_segment(run_id)}"


def _path_segment(value: str) -> str:
    return quote(str(value), safe="")


def _logging_string(value: str) -> str:
    """A Logging query language string literal."""
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# What this process persisted, per task try and link key: Airflow 3's worker formats every link of
# a task as it finishes (``task_runner.finalize``), in the process that persisted them, so it reads
# them here instead of pulling each back through the API. Another process reads the XCom.
_PERSISTED_MEMO_SIZE = 256
_persisted: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()


def _try_key(ti: Any) -> tuple[Any, ...]:
    """(dag_id, run_id, task_id, map_index, try_number) of a task instance or its key."""
    return tuple(
        getattr(ti, name, None) for name in ("dag_id", "run_id", "task_id", "map_index", "try_number")
    )


class _XComPersistedLink(BaseOperatorLink):
    """A console link whose values a task persists to XCom under ``key``."""

    name: ClassVar[str]
    key: ClassVar[str]

    @property
    def xcom_key(self) -> str:
        return self.key

    @classmethod
    def format_url(cls, *args: Any, **values: Any) -> str:
        """Build the URL from the persisted values (keyword arguments only)."""
        raise NotImplementedError

    @classmethod
    def persist(cls, context: Context, **values: Any) -> None:
        """Push ``values`` to XCom for ``get_link``; raises at once if they cannot form a URL."""
        cls.format_url(**values)
        ti = context["ti"]
        ti.xcom_push(key=cls.key, value=values)
        _persisted[(*_try_key(ti), cls.key)] = values
        while len(_persisted) > _PERSISTED_MEMO_SIZE:
            _persisted.popitem(last=False)

    @classmethod
    def is_own_url(cls, url: str) -> bool:
        """Whether a URL stored in the link's XCom is one this link makes (Airflow 3 stores it)."""
        return url.startswith(CONSOLE_URL)

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        value = _persisted.get((*_try_key(ti_key), self.key))
        if value is None:
            value = XCom.get_value(key=self.key, ti_key=ti_key)
        if isinstance(value, str):
            return value if self.is_own_url(value) else ""
        if isinstance(value, dict):
            try:
                return self.format_url(**value)
            except (TypeError, ValueError):
                return ""
        return ""


class GKEWorkloadLink(_XComPersistedLink):
    """Console page of a gcluster workload's head Job (a JobSet's ``-pathways-head-0`` or ``-main-job-0``)."""

    name = "GKE Workload"
    key = "tpu_rl_gke_workload"

    @classmethod
    def format_url(
        cls,
        *,
        project_id: str,
        location: str,
        cluster_name: str,
        jobset_name: str,
        namespace: str = "default",
        pathways: bool = True,
    ) -> str:
        job_name = f"{jobset_name}-pathways-head-0" if pathways else f"{jobset_name}-main-job-0"
        return (
            f"{CONSOLE_URL}/kubernetes/job/{_path_segment(location)}/{_path_segment(cluster_name)}/"
            f"{_path_segment(namespace)}/{_path_segment(job_name)}/details?project={_path_segment(project_id)}"
        )


class GKEClusterLink(_XComPersistedLink):
    """Console page of a GKE cluster.

    The URL is the google provider's ``KubernetesEngineClusterLink``
    (``providers/google/cloud/links/kubernetes_engine.py``, ``KUBERNETES_CLUSTER_LINK``).
    """

    name = "GKE Cluster"
    key = "tpu_rl_gke_cluster"

    @classmethod
    def format_url(cls, *, project_id: str, location: str, cluster_name: str) -> str:
        if not (project_id and location and cluster_name):
            raise ValueError("project_id, location and cluster_name are required")
        return (
            f"{CONSOLE_URL}/kubernetes/clusters/details/{_path_segment(location)}/"
            f"{_path_segment(cluster_name)}/details?project={_path_segment(project_id)}"
        )


class GCSBrowserLink(_XComPersistedLink):
    """Console storage browser at a ``gs://`` folder."""

    name = "GCS Folder"
    key = "tpu_rl_gcs_browser"

    @classmethod
    def format_url(cls, *, uri: str, project_id: str | None = None) -> str:
        bucket, prefix = parse_gs_uri(uri)
        url = f"{CONSOLE_URL}/storage/browser/{_path_segment(bucket)}"
        if prefix:
            url += "/" + quote(prefix, safe="/")
        if project_id:
            url += f"?project={_path_segment(project_id)}"
        return url


class CloudLoggingJobLink(_XComPersistedLink):
    """Logs Explorer query for the containers of every pod of a JobSet."""

    name = "Workload Logs"
    key = "tpu_rl_cloud_logging_job"

    @classmethod
    def logging_filter(
        cls,
        *,
        project_id: str,
        jobset_name: str,
        location: str | None = None,
        cluster_name: str | None = None,
        namespace: str = "default",
    ) -> str:
        """The Logging query, one clause a line (clauses on separate lines are ANDed)."""
        clauses = [
            'resource.type="k8s_container"',
            f"resource.labels.project_id={_logging_string(project_id)}",
        ]
        if location:
            clauses.append(f"resource.labels.location={_logging_string(location)}")
        if cluster_name:
            clauses.append(f"resource.labels.cluster_name={_logging_string(cluster_name)}")
        clauses.append(f"resource.labels.namespace_name={_logging_string(namespace)}")
        clauses.append(f'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"={_logging_string(jobset_name)}')
        return "\n".join(clauses)

    @classmethod
    def format_url(
        cls,
        *,
        project_id: str,
        jobset_name: str,
        location: str | None = None,
        cluster_name: str | None = None,
        namespace: str = "default",
        duration: str = "P1D",
    ) -> str:
        query = cls.logging_filter(
            project_id=project_id,
            jobset_name=jobset_name,
            location=location,
            cluster_name=cluster_name,
            namespace=namespace,
        )
        return (
            f"{CONSOLE_URL}/logs/query;query={quote(query, safe='')};storageScope=project;"
            f"duration={_path_segment(duration)}?project={_path_segment(project_id)}"
        )


class RunDashboardLink(_XComPersistedLink):
    """The run's page on the provider's runs dashboard in Airflow: its rewards, TPU time and curves.

    The URL starts at ``[api] base_url`` (Airflow 2: ``[webserver] base_url``); without one it is
    the path alone, which the browser resolves against the Airflow UI it is on.
    """

    name = "Run Curves"
    key = "tpu_rl_run_curves"

    @classmethod
    def format_url(cls, *, dag_id: str, run_id: str) -> str:
        if not (dag_id and run_id):
            raise ValueError("dag_id and run_id are required")
        return web_base_url() + run_page_path(dag_id, run_id)

    @classmethod
    def is_own_url(cls, url: str) -> bool:
        return url.startswith(web_base_url() + DASHBOARD_PREFIX + "/runs/")
