"""The watcher's one line: which tasks failed and the first line of each one's error."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError
from airflow_provider_tpu_rl.pipelines.failures import (
    ERROR_XCOM_KEY,
    OneLineFailure,
    fail_in_one_line,
    failure_summary,
    first_line,
    note_failure,
)
from airflow_provider_tpu_rl.spec.preflight import failure_message as preflight_failure_message

ORDER = ["validate", "ensure_bucket", "deploy_cluster", "train", "destroy_cluster", "record_run", "watcher"]


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            AirflowFailException("invalid pipeline conf: zone: zone must be inside region"),
            "invalid pipeline conf: zone: zone must be inside region",
        ),
        (ValueError("first\nsecond"), "first"),
        (ValueError("\n\n  padded  \nrest"), "padded"),
        (
            ValueError("deploy failed with exit code 1 (config); last output:\nError: quota\nmore"),
            "deploy failed with exit code 1 (config); last output: Error: quota",
        ),
        (ValueError(""), "ValueError"),
        (None, ""),
        ("a plain string", "a plain string"),
    ],
)
def test_first_line(error: Any, line: str) -> None:
    assert first_line(error) == line


def test_first_line_is_bounded() -> None:
    line = first_line(RuntimeError("x" * 5000))
    assert len(line) == 500
    assert line.endswith("…")


def test_summary_names_each_failed_task_in_dag_order_with_its_error() -> None:
    states = {
        "validate": "success",
        "deploy_cluster": "failed",
        "train": "upstream_failed",
        "destroy_cluster": "failed",
        "record_run": "success",
        "watcher": "running",
    }
    errors = {
        "deploy_cluster": "gcluster deploy failed with exit code 1 (capacity); last output:",
        "destroy_cluster": "terraform destroy failed\nmore",
    }

    summary = failure_summary(states, errors.get, order=ORDER, ignored=("watcher",))

    assert summary == (
        "2 tasks failed: deploy_cluster: gcluster deploy failed with exit code 1 (capacity); last output:; "
        "destroy_cluster: terraform destroy failed"
    )


def test_a_preflight_refusal_is_named_with_its_first_problem_and_the_task_id_once() -> None:
    problems = [
        "p: the API tpu-rl needs is not enabled: gcloud services enable container.googleapis.com",
        "reservation res-1 is not READY",
    ]
    error = AirflowFailException(preflight_failure_message(problems))
    ti = mock.MagicMock()
    note_failure({"ti": ti, "exception": error})
    noted = ti.xcom_push.call_args.kwargs["value"]

    summary = failure_summary({"validate": "success", "preflight": "failed"}, {"preflight": noted}.get)

    assert summary == (
        "1 task failed: preflight: 2 problems before anything is created: p: the API tpu-rl needs is "
        "not enabled: gcloud services enable container.googleapis.com"
    )


def test_an_error_that_names_its_task_does_not_name_it_twice() -> None:
    errors = {"deploy_cluster": "deploy_cluster: invalid argument: zone: bad"}
    assert failure_summary({"deploy_cluster": "failed"}, errors.get) == (
        "1 task failed: deploy_cluster: invalid argument: zone: bad"
    )


def test_a_failed_task_that_left_no_error_points_at_its_log() -> None:
    def unreadable(task_id: str) -> Any:
        raise RuntimeError("xcom backend down")

    assert failure_summary({"b": "failed", "a": "failed"}, lambda t: None) == (
        "2 tasks failed: a (see its log); b (see its log)"
    )
    assert failure_summary({"a": "failed"}, unreadable) == "1 task failed: a (see its log)"


def test_only_upstream_failed_tasks_are_named_as_such() -> None:
    summary = failure_summary({"train": "upstream_failed", "export": "upstream_failed"}, lambda t: None)
    assert summary == "upstream failed (no task failed itself): export, train"


def test_the_watcher_itself_is_not_named() -> None:
    summary = failure_summary({"watcher": "failed"}, lambda t: "x", ignored=("watcher",))
    assert summary == "a task of this run failed; see the task logs"


def test_note_failure_pushes_the_first_line_for_the_watcher() -> None:
    ti = mock.MagicMock()
    error = CommandError(
        "recreate the deployment folder failed with exit code 1 (config); last output:\nError: x"
    )

    note_failure({"ti": ti, "exception": error})

    ti.xcom_push.assert_called_once_with(
        key=ERROR_XCOM_KEY,
        value="recreate the deployment folder failed with exit code 1 (config); last output: Error: x",
    )


def test_note_failure_never_raises() -> None:
    ti = mock.MagicMock()
    ti.xcom_push.side_effect = RuntimeError("api server down")

    note_failure({"ti": ti, "exception": ValueError("boom")})  # logged, not raised
    note_failure({"ti": ti})  # no exception in the context: nothing to note
    assert ti.xcom_push.call_count == 1


def test_fail_in_one_line_fails_with_the_message_and_no_cause() -> None:
    with pytest.raises(OneLineFailure) as raised:
        fail_in_one_line("invalid pipeline conf: zone: bad")

    assert str(raised.value) == "invalid pipeline conf: zone: bad"
    assert raised.value.code == "invalid pipeline conf: zone: bad"
    assert isinstance(raised.value, SystemExit)
    assert not isinstance(raised.value, Exception)  # Airflow 3 logs every Exception with its traceback
    assert raised.value.__cause__ is None
