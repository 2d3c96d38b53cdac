"""Fake Airflow objects for ledger tests: plain objects with the attributes Airflow provides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=3)
BUCKET = "gs://bucket/qwen3-30b-a3b"
LEDGER_TASK = "record_ledger"


@dataclass
class FakeTaskInstance:
    task_id: str
    state: str | None
    try_number: int = 1
    start_date: datetime | None = None
    end_date: datetime | None = None
    map_index: int = -1
    duration: float | None = None
    queued_dttm: datetime | None = None


@dataclass
class FakeDagRun:
    task_instances: list[FakeTaskInstance]
    dag_id: str = "tpu_rl_gke_pipeline"
    run_id: str = "manual__2026-03-01T08:00:00+00:00"
    conf: dict[str, Any] = field(default_factory=lambda: {"model": "qwen3-30b-a3b", "hf_token": "hf_x"})
    start_date: datetime | None = T0
    end_date: datetime | None = None
    state: str = "running"

    def get_task_instances(self) -> list[FakeTaskInstance]:
        return self.task_instances


@dataclass
class FakeAirflow3DagRun:
    """Airflow 3's DagRun in a task context: no access to other task instances."""

    dag_id: str = "tpu_rl_gke_pipeline"
    run_id: str = "manual__a3"
    conf: dict[str, Any] = field(default_factory=dict)
    start_date: datetime | None = T0
    end_date: datetime | None = None
    state: str = "running"


@dataclass
class FakeLedgerTaskInstance:
    """The ledger task's own task instance: XComs of the other tasks, and (Airflow 3) their states."""

    xcoms: Mapping[str, Any]
    task_states: Mapping[str, str | None] | None = None
    task_id: str = LEDGER_TASK
    pulled: list[tuple[str, str]] = field(default_factory=list)

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        self.pulled.append((task_ids, key))
        value = self.xcoms.get(task_ids)
        if isinstance(value, Exception):
            raise value
        return value

    def get_task_states(self, dag_id: str, run_ids: list[str]) -> dict[str, dict[str, Any]]:
        assert self.task_states is not None
        return {run_ids[0]: dict(self.task_states)}


@dataclass
class FakeTask:
    task_id: str
    is_teardown: bool = False


@dataclass
class FakeDag:
    tasks: list[FakeTask]


def minutes(count: float) -> datetime:
    return T0 + timedelta(minutes=count)


def train_result(completed: bool = True) -> dict[str, Any]:
    return {
        "job_name": "rl-qwen-0301-train",
        "metrics": {
            "pre": {"mean_reward": 0.12, "accuracy": 10.0, "format_accuracy": 55.5, "note": "text"},
            "post": {"mean_reward": 0.34, "accuracy": 25.0} if completed else None,
            "intermediate": [{"step": 25, "mean_reward": 0.2, "accuracy": 15.0}],
            "loss": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}],
            "last_step": 50 if completed else 12,
            "completed": completed,
        },
    }


def billed_result(start: float, end: float | None, machines: int = 8, chips: int = 4) -> dict[str, Any]:
    """What the task deleting the TPU capacity returns: ``machines`` node VMs of ``chips`` chips, each
    RUNNING from minute ``start`` to minute ``end`` (None: still running), by their own clocks."""
    return {
        "billed": {
            "spans": [
                {
                    "machine": f"gke-c1-tpu-pool-1a2b3c4d-n{index:03d}",
                    "id": str(1000 + index),
                    "chips": chips,
                    "started_at": minutes(start).isoformat(),
                    "ended_at": None if end is None else minutes(end).isoformat(),
                    "ended_by": None if end is None else "delete",
                }
                for index in range(machines)
            ]
        }
    }


def bake_result(start: float, end: float) -> dict[str, Any]:
    """What ``bake_image`` returns after a bake: its bake VM's span, from minute ``start`` to ``end``."""
    span = {
        "name": "tpu-rl-bake-0301",
        "zone": "us-east5-b",
        "machine_type": "n2-standard-8",
        "started": minutes(start).isoformat(),
        "ended": minutes(end).isoformat(),
    }
    return {"boot_image_family": "tpu-rl-1a2b", "baked": True, "vm_spans": [span]}


# The TPU pool's deploy runs from minute 36 to 41 and its destroy from 121 to 126 (the capacity
# held: 90 minutes); its 8 node VMs run (billed) from minute 38 to 124: 86 minutes.
BILLED_MINUTES = 86

SUCCESS_XCOMS: dict[str, Any] = {
    "destroy_tpu_pool": billed_result(38, 124),
    "convert_to_maxtext": {"job_name": "rl-qwen-0301-convert"},
    "train": train_result(),
    "export_to_huggingface": {"job_name": "rl-qwen-0301-export"},
    "wait_converted_checkpoint": {
        "uris": [f"{BUCKET}/max-text-format/0/items/_METADATA"],
        "step": 0,
        "checkpoint_uri": f"{BUCKET}/max-text-format/0/items/",
    },
    "wait_actor_checkpoint": {
        "uris": [f"{BUCKET}/trained/rl/checkpoints/actor/50/commit_success.txt"],
        "step": 50,
        "checkpoint_uri": f"{BUCKET}/trained/rl/checkpoints/actor/50/",
    },
    "wait_hf_export": {
        "uris": [f"{BUCKET}/hf-trained/config.json", f"{BUCKET}/hf-trained/model.safetensors"],
        "export_uri": f"{BUCKET}/hf-trained/",
    },
}

GKE_DAG = FakeDag(
    [
        FakeTask("deploy_cluster"),
        FakeTask("convert_to_maxtext"),
        FakeTask("deploy_tpu_pool"),
        FakeTask("train"),
        FakeTask("destroy_tpu_pool", is_teardown=True),
        FakeTask("export_to_huggingface"),
        FakeTask("destroy_cluster", is_teardown=True),
        FakeTask(LEDGER_TASK, is_teardown=True),
    ]
)


def gke_task_instances(**states: str) -> list[FakeTaskInstance]:
    """A full GKE run, every task successful unless given another state."""
    plan = [
        ("deploy_cluster", 0, 20),
        ("convert_to_maxtext", 20, 35),
        ("wait_converted_checkpoint", 35, 36),
        # the TPU node pool: created at 36, deleted at 126 (the billed span)
        ("deploy_tpu_pool", 36, 41),
        ("train", 41, 120),
        ("wait_actor_checkpoint", 120, 121),
        ("destroy_tpu_pool", 121, 126),
        ("export_to_huggingface", 126, 150),
        ("wait_hf_export", 150, 151),
        ("destroy_cluster", 151, 170),
    ]
    instances = [
        FakeTaskInstance(task_id, states.get(task_id, "success"), 1, minutes(start), minutes(end))
        for task_id, start, end in plan
    ]
    instances.append(FakeTaskInstance(LEDGER_TASK, "running", 1, minutes(171), None))
    return instances


def context_for(dag_run: Any, xcoms: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {"dag_run": dag_run, "ti": FakeLedgerTaskInstance(xcoms, **extra), "dag": GKE_DAG}


@dataclass
class BareTaskInstance:
    """A task instance that can pull XComs and nothing else."""

    task_id: str = LEDGER_TASK

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return None
