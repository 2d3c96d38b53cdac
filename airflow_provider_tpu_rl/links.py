"""Extra links to the Google Cloud console: the GKE cluster, the JobSet's head job, its logs, GCS
folders and the run's curves (a PNG object).

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

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseOperatorLink, XCom

from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import BaseOperator, Context

    from airflow_provider_tpu_rl.compat import TaskInstanceKey

CONSOLE_URL = "https://console.cloud.google.com"


def _path_segment(value: str) -> str:
    return quote(str(value), safe="")


def _logging_string(value: str) -> str:
    """A Logging query language string literal."""
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


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
        context["ti"].xcom_push(key=cls.key, value=values)

    @classmethod
    def persist_none(cls, context: Context) -> None:
        """Say there is no link for this try (an empty value): Airflow 3 resolves every extra link
        when a task ends and logs an error for a link whose XCom is missing."""
        context["ti"].xcom_push(key=cls.key, value="")

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        value = XCom.get_value(key=self.key, ti_key=ti_key)
        if isinstance(value, str):
            return value if value.startswith(CONSOLE_URL) else ""
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


class GCSObjectLink(_XComPersistedLink):
    """Console details page of one ``gs://`` object (it previews an image): the run's curves."""

    name = "Run Curves"
    key = "tpu_rl_run_curves"

    @classmethod
    def format_url(cls, *, uri: str, project_id: str | None = None) -> str:
        bucket, name = parse_gs_uri(uri)
        if not name or name.endswith("/"):
            raise ValueError(f"not an object: {uri}")
        url = f"{CONSOLE_URL}/storage/browser/_details/{_path_segment(bucket)}/{quote(name, safe='/')};tab=live_object"
        if project_id:
            url += f"?project={_path_segment(project_id)}"
        return url
