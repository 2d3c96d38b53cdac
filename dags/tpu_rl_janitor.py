"""Destroy TPU-RL clusters and VMs that are expired, unleased or orphaned by their run.

Every GKE cluster and TPU VM the pipelines create carries ``tpu-rl-managed=true`` and
``tpu-rl-expires=<epoch seconds>`` (start of the run + ``max_cluster_hours``/``max_vm_hours``). A
resource whose pipeline could not destroy it (failed teardown, ``keep_cluster``/``keep_vm``, a
killed worker, a crashed run) is destroyed here within one janitor period after it expires, its
lease expires, its run ends, or its run is orphaned for ``[tpu_rl] orphan_minutes``. Buckets are
never touched. The finding and destroying live in ``airflow_provider_tpu_rl.operators.janitor``; this DAG
only schedules them and logs what they did.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from airflow.providers.common.compat.sdk import DAG, Param, get_current_context, task

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.timeouts import dagrun_timeout, task_timeout

JANITOR_DAG_ID: Final = "tpu_rl_janitor"
GCLUSTER_CONN_ID: Final = "gcluster_default"
GCP_CONN_ID: Final = "google_cloud_default"

log = logging.getLogger(__name__)

DOC_MD = f"""
# {JANITOR_DAG_ID}

Every 30 minutes: lists the GKE clusters and Compute Engine TPU VMs labelled `tpu-rl-managed=true`
and destroys those whose `tpu-rl-expires` (epoch seconds) or lease has passed, whose DAG run has
ended (unless kept), or whose DAG run is orphaned: still `running` with no task running, queued,
scheduled, deferred or up for retry for `[tpu_rl] orphan_minutes` (default 30). A forgotten cluster
therefore bills at most one janitor period past its expiry. Buckets (and the models in them) are
never deleted here.

- `projects`: project IDs to scan; empty = the project of the `{GCP_CONN_ID}` connection plus every
  project named in the resource records (`tpu-rl/resources/*.json`) of the buckets in
  `[tpu_rl] janitor_buckets` and in the run ledger.
- `dry_run`: list what would be destroyed, destroy nothing.

A run whose resources it destroyed, or whose DAG run has ended, while its run-ledger row still says
`running` gets that row closed: `failed` (its DAG run failed) or `abandoned`, with its end, its
billed TPU time so far and why (docs/janitor.md). A row already closed is left alone.

One failed destroy does not stop the others; the run fails afterwards so it shows, and the next
run tries again.
"""


def refuse_bad_projects(projects: list[str]) -> None:
    """The ``projects`` param's rule, in one line: each a project ID, each once."""
    for index, project in enumerate(projects):
        if rules.PROJECT_ID.fullmatch(str(project)) is None:
            raise AirflowFailException(f"projects: {rules.PROJECT_ID_RULE} (got {project!r})")
        if project in projects[:index]:
            raise AirflowFailException(f"projects: each project once ({project!r} is named twice)")


def describe(resource: Any) -> Any:
    """A resource as plain JSON-able data, for the log and the XCom."""
    if dataclasses.is_dataclass(resource) and not isinstance(resource, type):
        return {k: str(v) for k, v in dataclasses.asdict(resource).items()}
    if isinstance(resource, Mapping):
        return {str(k): str(v) for k, v in resource.items()}
    return str(resource)


with DAG(
    dag_id=JANITOR_DAG_ID,
    description="Destroy expired, unleased or orphaned tpu-rl clusters and TPU VMs.",
    schedule="*/30 * * * *",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    # Its one task ends itself first (janitor_timeout_minutes); a timed-out run only skips it.
    dagrun_timeout=dagrun_timeout("janitor"),
    tags=["tpu-rl", "janitor"],
    doc_md=DOC_MD,
    params={
        "projects": Param(
            [],
            title="Projects",
            description=(
                "Project IDs to scan; empty = the google_cloud_default connection's project and every "
                "project named in the resource records of the known buckets ([tpu_rl] janitor_buckets, "
                f"the ledger). Rule: {rules.PROJECT_ID_RULE}; each once."
            ),
            # the rule is checked by the task (refuse_bad_projects), in one line: a pattern here
            # would be refused by Airflow with jsonschema's message and the schema dumped
            type="array",
            items={"type": "string"},
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

    @task(task_id="destroy_expired", retries=0, execution_timeout=task_timeout("janitor"))
    def destroy_expired() -> dict[str, list[Any]]:
        """Find the stale resources of every project, destroy each; fail after trying them all."""
        from airflow_provider_tpu_rl.operators.janitor import (
            close_ledger_rows,
            destroy_resource,
            discover_sources,
            find_expired_resources,
            run_probe,
        )

        context = get_current_context()
        params = context["params"]
        refuse_bad_projects(params["projects"])
        hook = GclusterHook(gcluster_conn_id=GCLUSTER_CONN_ID)
        now = int(time.time())
        # The buckets of [tpu_rl] janitor_buckets and the ledger, and the projects their resource
        # records name (or exactly the `projects` param).
        sources = discover_sources(params["projects"], gcp_conn_id=GCP_CONN_ID)
        # DAG-run and task states of the runs holding the resources: the Task SDK on Airflow 3.1+,
        # the metadata database on Airflow 2 (None on 3.0: expiry labels and leases alone).
        runs = run_probe(context)
        report: dict[str, list[Any]] = {"found": [], "destroyed": [], "failed": [], "closed": []}
        ends: list[Any] = []  # what was ended of each run, for its ledger row
        for project in sources.projects:
            try:
                expired = list(
                    find_expired_resources(
                        hook, project, now, runs=runs, sources=sources, gcp_conn_id=GCP_CONN_ID
                    )
                )
            except Exception:
                log.exception("could not scan project %s", project)
                report["failed"].append({"project": project})
                continue
            log.info("%s: %d expired tpu-rl resource(s)", project, len(expired))
            for resource in expired:
                report["found"].append(describe(resource))
                if params["dry_run"]:
                    log.warning("dry run: would destroy %s", describe(resource))
                    continue
                log.warning("destroying expired %s", describe(resource))
                try:
                    end = destroy_resource(
                        hook, resource, gcp_conn_id=GCP_CONN_ID, janitor_run_id=str(context["run_id"])
                    )
                except Exception:
                    log.exception("could not destroy %s", describe(resource))
                    report["failed"].append(describe(resource))
                else:
                    report["destroyed"].append(describe(resource))
                    if end is not None:
                        ends.append(end)
        # Runs' own node pools on clusters the provider did not create (their records say which):
        # deleted when the run has ended or they expired and their labels prove them its.
        from airflow_provider_tpu_rl.operators.existing_cluster import sweep_run_pools

        pools = sweep_run_pools(
            hook,
            GCP_CONN_ID,
            sources.buckets,
            now,
            lambda dag_id, run_id: runs.dagrun_state(dag_id, run_id) if runs is not None else None,
            dry_run=params["dry_run"],
        )
        report["found"] += [{"node_pool": p} for p in pools["deleted"]]
        report["destroyed"] += [] if params["dry_run"] else [{"node_pool": p} for p in pools["deleted"]]
        report["failed"] += [{"node_pool": p} for p in pools["failed"]]
        if not params["dry_run"]:
            # The ledger rows still `running` of the runs it ended, or whose DAG run has ended.
            try:
                report["closed"] = close_ledger_rows(ends, runs)
            except Exception:
                log.exception("could not close the ledger rows of ended runs")
                report["failed"].append({"ledger": "close_ledger_rows"})
        log.info(
            "janitor: %d expired, %d destroyed, %d failed, %d ledger rows closed",
            len(report["found"]),
            len(report["destroyed"]),
            len(report["failed"]),
            len(report["closed"]),
        )
        if report["failed"]:
            raise AirflowException(
                f"{len(report['failed'])} expired resource(s), project(s) or ledger closes could not be destroyed, scanned or closed"
            )
        return report

    destroy_expired()
