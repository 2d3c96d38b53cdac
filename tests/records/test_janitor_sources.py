"""Where the janitor finds what to scan and how runs stand (records/janitor_sources.py): on Airflow 3
the run and task states come from the Task SDK, an unknown run is unknown.

The projects and buckets it discovers are read against the sandbox in
tests/operators/test_janitor_orphans.py; the Task SDK reader runs end to end in
tests/e2e/test_janitor.py."""

from __future__ import annotations

from typing import Any


class _SdkTi:
    """The two Task SDK calls of a ``RuntimeTaskInstance`` the janitor uses (static methods there)."""

    def __init__(self, dag_runs: dict[str, str], tasks: dict[str, dict[str, Any]]) -> None:
        self.dag_runs = dag_runs
        self.tasks = tasks
        self.asked: list[dict[str, Any]] = []

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        if f"{dag_id}/{run_id}" not in self.dag_runs:
            raise RuntimeError("DagRun not found")  # what a 404 of the execution API becomes
        return self.dag_runs[f"{dag_id}/{run_id}"]

    def get_task_states(self, dag_id: str, run_ids: list[str]) -> dict[str, Any]:
        self.asked.append({"dag_id": dag_id, "run_ids": run_ids})
        return {run_id: self.tasks.get(f"{dag_id}/{run_id}", {}) for run_id in run_ids}


def test_on_airflow_3_run_states_come_from_the_task_sdk_and_an_unknown_run_is_unknown() -> None:
    from airflow.utils.state import TaskInstanceState

    from airflow_provider_tpu_rl.records.janitor_sources import TaskSdkRuns, run_probe

    ti = _SdkTi({"d/r": "running"}, {"d/r": {"train": TaskInstanceState.DEFERRED, "export": None}})
    probe = run_probe({"ti": ti})

    assert isinstance(probe, TaskSdkRuns)
    assert probe.dagrun_state("d", "r") == "running"
    assert probe.dagrun_state("d", "gone") is None
    assert probe.task_states("d", "r") == {"train": "deferred", "export": None}
    assert ti.asked == [{"dag_id": "d", "run_ids": ["r"]}]
