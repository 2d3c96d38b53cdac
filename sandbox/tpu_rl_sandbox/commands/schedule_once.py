"""``python -m tpu_rl_sandbox.commands.schedule_once DAG_ID``: the scheduler's "create DAG runs"
step, once, in-process (what its loop does first), with no scheduler running: it turns queued asset
events into asset-triggered runs. Prints each run of ``DAG_ID``: ``RUN <run id> <run type>``. The
demo and the end-to-end tests run the model asset's downstream example DAG with it after
``airflow dags test`` (which never runs a scheduler). A private API (``_create_dagruns_for_dags``)
on both Airflow lines: fine in the sandbox, never in the provider."""

from __future__ import annotations

import sys

from airflow.jobs.job import Job
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from airflow.utils.sqlalchemy import prohibit_commit


def main(dag_id: str) -> None:
    runner = SchedulerJobRunner(job=Job())
    with create_session() as session, prohibit_commit(session) as guard:
        runner._create_dagruns_for_dags(guard, session)
    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id):
            print("RUN", run.run_id, getattr(run.run_type, "value", run.run_type))


if __name__ == "__main__":
    main(sys.argv[1])
