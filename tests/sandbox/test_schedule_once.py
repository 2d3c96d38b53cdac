"""The scheduler's one step the demo and the end-to-end tests run after ``airflow dags test``:
a step that hangs is killed at its bound and says so, with what it printed."""

from __future__ import annotations

import os
import sys

from tpu_rl_sandbox.commands.schedule_once import run_queued_task


def test_a_step_past_its_bound_is_killed_and_says_so() -> None:
    # a bound no interpreter starts within: the step (python -m ...schedule_once) is killed
    queued = run_queued_task(dict(os.environ), "some_dag", "some_task", timeout=0.001)
    assert (queued.runs, queued.step_code, queued.task_code) == ([], -9, None)
    last = queued.step_output.rstrip().splitlines()[-1]
    assert last == f"{sys.executable} -m tpu_rl_sandbox.commands.schedule_once some_dag: killed after 0.001 s"
