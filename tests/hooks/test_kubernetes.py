"""The pure rules of hooks/kubernetes.py: JobSet state as gcluster derives it, the head pod, the log cursor."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.hooks.kubernetes import (
    RUN_DIR_ANNOTATION,
    RUN_ID_ANNOTATION,
    LogCursor,
    accelerator_start,
    command_run_dir,
    container_phase,
    format_since_time,
    head_pod,
    jobset_run_dir,
    jobset_run_id,
    jobset_state,
    pod_scheduled,
    scale_up_refusal,
    split_timestamp,
    workload_container,
)
from airflow_provider_tpu_rl.toolchain.job_output import JobState


def _cond(kind: str, status: str = "True", at: str = "2026-12-01T10:00:00Z") -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": at}


@pytest.mark.parametrize(
    ("obj", "state", "completed"),
    [
        ({}, JobState.UNKNOWN, None),
        ({"spec": {"suspend": True}}, JobState.SUSPENDED, None),
        ({"spec": {"suspend": False}, "status": {}}, JobState.RUNNING, None),
        # a condition that is not True changes nothing
        (
            {"spec": {"suspend": False}, "status": {"conditions": [_cond("Failed", "False")]}},
            JobState.RUNNING,
            None,
        ),
        (
            {"spec": {"suspend": False}, "status": {"conditions": [_cond("Completed")]}},
            JobState.SUCCEEDED,
            "2026-12-01T10:00:00Z",
        ),
        (
            {
                "spec": {},
                "status": {"conditions": [_cond("Failed")], "completionTime": "2026-12-01T11:00:00Z"},
            },
            JobState.FAILED,
            "2026-12-01T11:00:00Z",
        ),
        # Kueue suspended it again (preempted): the Suspended condition wins over spec.suspend=false
        (
            {"spec": {"suspend": False}, "status": {"conditions": [_cond("Suspended")]}},
            JobState.SUSPENDED,
            None,
        ),
        # in list order, as parseConditions walks them
        (
            {"spec": {"suspend": False}, "status": {"conditions": [_cond("Suspended"), _cond("Completed")]}},
            JobState.SUCCEEDED,
            "2026-12-01T10:00:00Z",
        ),
    ],
)
def test_jobset_state_follows_gcluster_parse_job_status(
    obj: dict[str, Any], state: JobState, completed: str | None
) -> None:
    assert jobset_state(obj) == (state, completed)


def _pod(
    name: str, rjob: str, job: str = "0", index: str = "0", attempt: str = "0", **extra: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": extra.pop("created", "2026-12-01T10:00:00Z"),
            "labels": {
                "jobset.sigs.k8s.io/replicatedjob-name": rjob,
                "jobset.sigs.k8s.io/job-index": job,
                "batch.kubernetes.io/job-completion-index": index,
                "jobset.sigs.k8s.io/restart-attempt": attempt,
            },
        },
        **extra,
    }


def test_head_pod_is_job_zero_index_zero_of_the_newest_restart_attempt() -> None:
    pods = [
        _pod("w-0", "worker"),
        _pod("w-1", "worker", index="1"),
        _pod("head-a0", "pathways-head", attempt="0"),
        _pod("head-a1", "pathways-head", attempt="1"),
        _pod("head-other-job", "pathways-head", job="1", attempt="2"),
    ]
    chosen = head_pod(pods, "pathways-head")
    assert chosen is not None
    assert chosen["metadata"]["name"] == "head-a1"
    assert head_pod(pods, "main-job") is None


def test_workload_container_pathways_and_plain() -> None:
    pathways = {
        "spec": {
            "initContainers": [{"name": "pathways-proxy"}],
            "containers": [{"name": "workload-container"}],
        }
    }
    plain = {"spec": {"containers": [{"name": "qwen-rl-abc"}, {"name": "sidecar"}]}}
    assert workload_container(pathways, pathways=True) == "workload-container"
    assert workload_container(plain, pathways=False) == "qwen-rl-abc"
    assert workload_container(plain, pathways=True) is None


@pytest.mark.parametrize(
    ("state", "phase"),
    [
        ({"waiting": {"reason": "ContainerCreating"}}, "waiting"),
        ({"running": {}}, "running"),
        ({"terminated": {"exitCode": 0}}, "terminated"),
    ],
)
def test_container_phase(state: dict[str, Any], phase: str) -> None:
    pod = {
        "status": {
            "containerStatuses": [{"name": "other", "state": {"running": {}}}, {"name": "c", "state": state}]
        }
    }
    assert container_phase(pod, "c") == phase
    assert container_phase({"status": {}}, "c") == "waiting"


def test_split_timestamp_reads_rfc3339nano_with_trimmed_zeros() -> None:
    assert split_timestamp("2026-12-01T10:00:00.5Z Pre RL Training: x") == (
        1_796_119_200_500_000_000,
        "Pre RL Training: x",
    )
    assert split_timestamp("2026-12-01T10:00:00.000000001Z a") == (1_796_119_200_000_000_001, "a")
    assert split_timestamp("2026-12-01T11:00:00+01:00 b") == (1_796_119_200_000_000_000, "b")
    assert split_timestamp("no timestamp") is None
    assert format_since_time(1_796_119_200_999_999_999) == "2026-12-01T10:00:00Z"


def test_cursor_skips_what_it_relayed_when_a_read_restarts_from_since_time() -> None:
    t = 1_796_119_200_000_000_000
    cursor = LogCursor(pod_uid="p")
    first_read = [t, t + 1, t + 1, t + 2]
    assert [cursor.accept(n) for n in first_read] == [True, True, True, True]
    # two lines share the last time: a re-read from the whole second repeats all four
    cursor = LogCursor(pod_uid="p")
    for n in [t, t + 1, t + 2, t + 2]:
        cursor.accept(n)
    assert cursor.since_time() == "2026-12-01T10:00:00Z"
    restored = LogCursor.from_dict(cursor.as_dict())
    restored.rewind()
    again = [t, t + 1, t + 2, t + 2, t + 2, t + 3]
    assert [restored.accept(n) for n in again] == [False, False, False, False, True, True]
    assert restored.lines == 6


# ------------------------------------------------------------------------------- run directories
TRAIN = (
    "export VLLM_ENABLE_V1_MULTIPROCESSING=0 && JAX_PLATFORMS=proxy,cpu python3 -m "
    "maxtext.trainers.post_train.rl.train_rl 'run_name=rl-1' "
    "'base_output_directory=gs://b/m/trained/' model_name=qwen3-30b-a3b"
)
EXPORT = (
    "python3 -m maxtext.checkpoint_conversion.to_huggingface model_name=q "
    "load_parameters_path=gs://b/m/trained/rl-1/checkpoints/actor/50/model_params/ "
    "base_output_directory=gs://b/m/hf-trained/rl-1 run_name=ignored"
)


@pytest.mark.parametrize(
    ("script", "directory"),
    [
        (TRAIN, "gs://b/m/trained/rl-1/"),
        # a conversion writes base_output_directory itself, whatever run_name says
        (EXPORT, "gs://b/m/hf-trained/rl-1/"),
        ("python3 train.py --base_output_directory=gs://b/x --run_name=r", "gs://b/x/r/"),
        ("echo hello", None),
        ("unbalanced 'quote base_output_directory=gs://b/y", "gs://b/y/"),
    ],
)
def test_command_run_dir(script: str, directory: str | None) -> None:
    assert command_run_dir(script) == directory


def _jobset(script: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "workload-container", "command": ["/bin/bash", "-c", script]}
    return {
        "metadata": {"name": "j", "annotations": annotations or {}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "worker",
                    "template": {"spec": {"template": {"spec": {"containers": [{"name": "w"}]}}}},
                },
                {
                    "name": "pathways-head",
                    "template": {"spec": {"template": {"spec": {"containers": [container]}}}},
                },
            ]
        },
    }


def test_jobset_run_dir_prefers_the_annotation_and_falls_back_to_the_command() -> None:
    plain = _jobset(TRAIN)
    assert jobset_run_dir(plain) == "gs://b/m/trained/rl-1/"
    assert jobset_run_id(plain) is None
    annotated = _jobset(TRAIN, {RUN_DIR_ANNOTATION: "gs://b/other", RUN_ID_ANNOTATION: "dag/run"})
    assert jobset_run_dir(annotated) == "gs://b/other/"
    assert jobset_run_id(annotated) == "dag/run"
    assert jobset_run_dir({"metadata": {}, "spec": {}}) is None


def test_accelerator_start_is_the_first_tpu_pods_start() -> None:
    def pod(start: str | None, tpu: bool) -> dict[str, Any]:
        limits = {"google.com/tpu": "4"} if tpu else {"cpu": "8"}
        return {
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"startTime": start} if start else {},
        }

    pods = [
        pod("2026-03-01T08:00:00Z", tpu=False),  # the Pathways head on the CPU pool, first up
        pod("2026-03-01T08:05:09Z", tpu=True),
        pod("2026-03-01T08:04:59Z", tpu=True),
        pod(None, tpu=True),  # not started yet
    ]
    assert accelerator_start(pods) == "2026-03-01T08:04:59Z"
    assert accelerator_start(pods[:1]) == "2026-03-01T08:00:00Z"  # a CPU job: its own pods
    assert accelerator_start([pod(None, tpu=True)]) is None
    assert accelerator_start([]) is None


def _event(reason: str, message: str, at: str = "2026-12-01T10:00:00Z") -> dict[str, str]:
    return {"reason": reason, "message": message, "lastTimestamp": at}


def test_a_scale_up_refusal_is_the_autoscalers_out_of_resources_or_quota_event() -> None:
    out = "Node scale up in zones us-east5-b associated with this pod failed: GCE out of resources. Pod is at risk of not being scheduled."
    quota = "Node scale up in zones us-east5-b associated with this pod failed: GCE quota exceeded. Pod is at risk of not being scheduled."
    assert scale_up_refusal([]) is None
    # the scheduler's own warning and the autoscaler's undecided failures decide nothing
    assert (
        scale_up_refusal(
            [
                _event(
                    "FailedScheduling",
                    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
                ),
                _event(
                    "FailedScaleUp",
                    "Node scale up in zones us-east5-b associated with this pod failed: Internal error. Pod is at risk of not being scheduled.",
                ),
                _event("TriggeredScaleUp", "pod triggered scale-up: [{gke-tpu 0->8 (max: 8)}]"),
            ]
        )
        is None
    )
    assert scale_up_refusal([_event("FailedScaleUp", out)]) == f"FailedScaleUp: {out}"
    latest = scale_up_refusal(
        [
            _event("FailedScaleUp", out, "2026-12-01T10:00:00Z"),
            _event("FailedScaleUp", quota, "2026-12-01T10:05:00Z"),
        ]
    )
    assert latest == f"FailedScaleUp: {quota}"


def test_a_pod_is_scheduled_when_its_pod_scheduled_condition_is_true() -> None:
    assert pod_scheduled({"status": {"conditions": [_cond("PodScheduled")]}})
    assert not pod_scheduled({"status": {"conditions": [_cond("PodScheduled", "False")]}})
    assert not pod_scheduled({"status": {"phase": "Pending"}})
    assert not pod_scheduled({})
