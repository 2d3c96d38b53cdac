"""Destroy TPU-RL clusters and VMs whose ``tpu-rl-expires`` label has passed.

Every GKE cluster and TPU VM the pipelines create carries ``tpu-rl-managed=true`` and
``tpu-rl-expires=<epoch seconds>`` (start of the run + ``max_cluster_hours``/``max_vm_hours``). A
resource whose pipeline could not destroy it (failed teardown, ``keep_cluster``/``keep_vm``, a
killed worker) is destroyed here within one janitor period after it expires. Buckets are never
touched. The finding and destroying live in ``airflow_provider_tpu_rl.operators.janitor``; this DAG
only schedules them and logs what they did.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from airflow.providers.common.compat.sdk import DAG, AirflowException, Param, get_current_context, task

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.spec import rules

JANITOR_DAG_ID: Final = "tpu_rl_janitor"
GCLUSTER_CONN_ID: Final = "gcluster_default"
GCP_CONN_ID: Final = "google_cloud_default"

log = logging.getLogger(__name__)

DOC_MD = f"""
# {JANITOR_DAG_ID}

Every 30 minutes: lists the GKE clusters and Compute Engine TPU VMs labelled `tpu-rl-managed=true`
in the given projects and destroys those whose `tpu-rl-expires` (epoch seconds) has passed. A
forgotten cluster therefore bills at most one janitor period past its expiry. Buckets (and the
models in them) are never deleted here.

- `projects`: project IDs to scan; empty = the project of the `{GCP_CONN_ID}` connection.
- `dry_run`: list what would be destroyed, destroy nothing.

One failed destroy does not stop the others; the run fails afterwards so it shows, and the next
run tries again.
"""


def describe(resource: Any) -> Any:
    """A resource as plain JSON-able data, for the log and the XCom."""
    if dataclasses.is_dataclass(resource) and not isinstance(resource, type):
        return {k: str(v) for k, v in dataclasses.asdict(resource).items()}
    if isinstance(resource, Mapping):
        return {str(k): str(v) for k, v in resource.items()}
    return str(resource)


def projects_to_scan(projects: list[str] | None) -> list[str]:
    """The ``projects`` param, or the default Google Cloud connection's project when it is empty."""
    if projects:
        return list(dict.fromkeys(projects))
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    project = GoogleBaseHook(gcp_conn_id=GCP_CONN_ID).project_id
    if not project:
        raise AirflowException(f"no projects given and connection {GCP_CONN_ID!r} names no project")
    return [project]


with DAG(
    dag_id=JANITOR_DAG_ID,
    description="Destroy expired tpu-rl clusters and TPU VMs (label tpu-rl-expires).",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=6),
    tags=["tpu-rl", "janitor"],
    doc_md=DOC_MD,
    params={
        "projects": Param(
            [],
            title="Projects",
            description="Project IDs to scan; empty = the project of the google_cloud_default connection.",
            type="array",
            items={"type": "string", "pattern": rules.PROJECT_ID.pattern},
            uniqueItems=True,
        ),
        "dry_run": Param(
            False,
            title="Dry run",
            description="Only log the expired resources; destroy nothing.",
            type="boolean",
        ),
    },
    default_args={"owner": "tpu-rl", "retries": 0},
) as dag:

    @task(task_id="destroy_expired", retries=0)
    def destroy_expired() -> dict[str, list[Any]]:
        """Find the expired resources of every project, destroy each; fail after trying them all."""
        from airflow_provider_tpu_rl.operators.janitor import destroy_resource, find_expired_resources

        context = get_current_context()
        params = context["params"]
        hook = GclusterHook(gcluster_conn_id=GCLUSTER_CONN_ID)
        now = int(time.time())
        # Airflow 3.1+: the state of the run that created a resource (None on older Airflow: the
        # janitor then goes by the expiry label alone).
        run_state = getattr(context.get("ti"), "get_dagrun_state", None)
        report: dict[str, list[Any]] = {"found": [], "destroyed": [], "failed": []}
        for project in projects_to_scan(params["projects"]):
            expired = list(find_expired_resources(hook, project, now, run_state=run_state))
            log.info("%s: %d expired tpu-rl resource(s)", project, len(expired))
            for resource in expired:
                report["found"].append(describe(resource))
                if params["dry_run"]:
                    log.warning("dry run: would destroy %s", describe(resource))
                    continue
                log.warning("destroying expired %s", describe(resource))
                try:
                    destroy_resource(hook, resource)
                except Exception:
                    log.exception("could not destroy %s", describe(resource))
                    report["failed"].append(describe(resource))
                else:
                    report["destroyed"].append(describe(resource))
        log.info(
            "janitor: %d expired, %d destroyed, %d failed",
            len(report["found"]),
            len(report["destroyed"]),
            len(report["failed"]),
        )
        if report["failed"]:
            raise AirflowException(f"{len(report['failed'])} expired resource(s) could not be destroyed")
        return report

    destroy_expired()
