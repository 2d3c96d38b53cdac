"""How long each piece of a pipeline may take: tasks, jobs, CLI calls, DAG runs.

Every bound is read from the ``[tpu_rl]`` section of the Airflow config (minutes, fractions
allowed) with the defaults below, so a deployment tunes them without editing a DAG:
``[tpu_rl] <stage>_timeout_minutes`` for a task, ``job_timeout_margin_minutes`` for the gap
between a job's bound and its task's, ``command_timeout_minutes`` for short CLI calls and
``dagrun_timeout_hours`` for a whole run.

A task's ``execution_timeout`` also bounds the time it spends deferred: Airflow gives the trigger
the task's remaining ``execution_timeout`` as its timeout (``BaseOperator.defer``), so a job
operator's bound covers the whole job wait.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Final

from airflow_provider_tpu_rl.compat import conf

SECTION: Final = "tpu_rl"

DEFAULT_TASK_MINUTES: Final[dict[str, float]] = {
    # Toolchain, API, IAM and reservation checks: a handful of short API calls.
    "preflight": 20,
    # Conf checks in the worker, no cloud call.
    "validate": 10,
    # Bucket, HF token secret, ledger record, watcher: a few API calls each.
    "short": 20,
    # gcluster deploy: Packer-free blueprint, Terraform creates a GKE cluster and its node pools.
    "deploy": 90,
    # HF -> MaxText conversion job (a 30B model downloads and rewrites ~60 GB).
    "convert": 180,
    # GRPO training job: 48 h.
    "train": 48 * 60,
    # MaxText -> HF export job.
    "export": 180,
    # gcluster destroy (Terraform destroys node pools and the cluster) or VM delete.
    "teardown": 90,
    # Waiting for a checkpoint's files in GCS once the job that writes them finished.
    "checkpoint": 120,
    # TPU VM create (queued resources can take a while to be provisioned).
    "vm_create": 60,
    # Installing MaxText and its dependencies on every worker of a TPU VM over SSH.
    "install": 90,
    # Baking the TPU VM's boot image: a CPU VM, Docker, the workload image's pull (over 10 GB), the
    # VM stopped and its 200 GB disk imaged.
    "bake": 120,
    # Copying the GKE training image into the run's repository (over 10 GB through the worker,
    # once per digest; a copy already there takes a minute).
    "copy": 60,
    # The janitor's scan and the destroys it starts.
    "janitor": 240,
}

# The stages a run goes through, each once per try: (stage, retried). A retried stage is one of
# the tasks given ``[tpu_rl] retries`` (pipelines/arguments.transient_retries); the others have none.
PIPELINE_STAGES: Final[dict[str, tuple[tuple[str, bool], ...]]] = {
    "gke": (
        ("validate", False),
        ("preflight", True),
        ("short", True),  # ensure_bucket
        ("deploy", True),
        ("short", True),  # sync_hf_token
        # copy_workload_image runs beside deploy_cluster and conversion and deploy_tpu_pool waits for
        # it: counted as if after them (a slow copy holds the cluster and the run that long)
        ("copy", True),
        ("convert", True),
        ("checkpoint", False),
        ("deploy", True),  # deploy_tpu_pool
        ("train", True),
        ("checkpoint", False),
        ("teardown", True),  # destroy_tpu_pool
        ("export", True),
        ("checkpoint", False),
        ("teardown", True),
        ("short", False),  # record_run
        ("short", False),  # watcher
    ),
    "tpu_vm": (
        ("validate", False),
        ("preflight", True),
        ("short", True),  # ensure_bucket
        ("short", True),  # sync_hf_token
        ("bake", True),  # bake_image (beside the CPU VM's tasks: counted as if after them)
        ("teardown", True),  # delete_bake_vm
        ("vm_create", True),  # create_cpu_vm
        ("install", True),  # install_cpu_vm
        ("convert", True),
        ("checkpoint", False),  # wait_converted_checkpoint
        ("vm_create", True),  # create_vm (the TPU VM)
        ("install", True),  # install_maxtext
        ("train", True),
        ("checkpoint", False),  # wait_actor_checkpoint
        ("teardown", True),  # delete_vm
        ("export", True),
        ("checkpoint", False),  # wait_hf_export
        ("teardown", True),  # delete_cpu_vm
        ("short", False),  # record_run
        ("short", False),  # watcher
    ),
    # Two branches of train/export after one conversion: counted one after the other, as a
    # pool or the scheduler may run them.
    "sweep": (
        ("preflight", False),
        ("short", False),
        ("deploy", False),
        ("short", False),
        ("convert", False),
        *((("train", False), ("checkpoint", False), ("export", False), ("checkpoint", False)) * 2),
        ("teardown", False),
    ),
    "janitor": (("janitor", False),),
}
_STAGE_ALIASES: Final = {"destroy": "teardown", "conversion": "convert", "training": "train"}

# A job's bound leaves its task this long to cancel the job and fail cleanly.
DEFAULT_JOB_MARGIN_MINUTES: Final = 10.0
DEFAULT_COMMAND_MINUTES: Final = 20.0
DEFAULT_KILL_GRACE_SECONDS: Final = 30.0
DEFAULT_TERRAFORM_LOCK_MINUTES: Final = 5.0
# A job that has not started on its nodes this long after its creation is cancelled.
DEFAULT_ADMISSION_MINUTES: Final = 30.0
# The least admission bound: the job's wait reads the JobSet every poll_interval (60 s by default),
# and a job that is admitted at once still needs Kueue's admission, the scheduler's placement and
# the kubelet's start of its first pod; below this, every job would be cancelled before it could start.
MIN_ADMISSION_MINUTES: Final = 5.0
# A new or started VM's guest boots after it is RUNNING; its sshd refuses connections meanwhile.
# gcloud's own SSH poll (only for a newly added key) tries every 5 s for 60 s (command_lib/util/ssh/
# ssh.py SSHPoller, compute/ssh_utils.SSH_KEY_PROPAGATION_TIMEOUT_MS): the provider's wait polls as
# often, for longer.
# A flex-start TPU pool followed by other kinds in an ordered capacity is proved by a placeholder
# pod its nodes must come up for (operators/gke.py ``flex_start_refusal``): how long that waits,
# inside ``deploy_tpu_pool``'s own bound. The cluster autoscaler scans every 10 s and gives up on
# nodes that do not appear in 15 min (kubernetes/autoscaler cluster-autoscaler/FAQ.md, its
# parameters table: ``scan-interval``, ``max-node-provision-time``); a stockout's FailedScaleUp
# comes with the first failed resize, a slice that comes registers its nodes in minutes.
DEFAULT_FLEX_START_PROBE_MINUTES: Final = 10.0
DEFAULT_SSH_BOOT_WAIT_MINUTES: Final = 5.0
DEFAULT_SSH_BOOT_POLL_SECONDS: Final = 5.0
# Added to the sum of a DAG run's stages: scheduling, queueing, retry delays.
DAGRUN_MARGIN: Final = timedelta(hours=2)
# pipelines/arguments.transient_retries: max_retry_delay.
MAX_RETRY_DELAY: Final = timedelta(minutes=30)


def _minutes(option: str, default: float, least: float = 0.0) -> float:
    """``[tpu_rl] <option>`` in minutes: a finite number above 0 (and at least ``least``); else
    a one-line ValueError naming the option (``inf`` would overflow a ``timedelta``)."""
    value = conf.getfloat(SECTION, option, fallback=default)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"[{SECTION}] {option} must be a positive, finite number of minutes, not {value}")
    if value < least:
        raise ValueError(f"[{SECTION}] {option} must be at least {least:g} minutes, not {value:g}")
    return value


def task_timeout(stage: str) -> timedelta:
    """``execution_timeout`` of a task of ``stage``: ``[tpu_rl] <stage>_timeout_minutes``.

    ``stage`` is one of :data:`DEFAULT_TASK_MINUTES` (``destroy`` is ``teardown``).
    """
    stage = _STAGE_ALIASES.get(stage, stage)
    if stage not in DEFAULT_TASK_MINUTES:
        raise ValueError(f"unknown stage {stage!r}; known: {sorted(DEFAULT_TASK_MINUTES)}")
    return timedelta(minutes=_minutes(f"{stage}_timeout_minutes", DEFAULT_TASK_MINUTES[stage]))


def job_timeout(stage: str) -> timedelta:
    """Default ``job_timeout`` of a job operator of ``stage`` (``convert``, ``train``, ``export``).

    The task's bound minus ``[tpu_rl] job_timeout_margin_minutes`` (default 10, at most a tenth
    of the task's bound), so the operator cancels the job and fails before Airflow kills the task;
    the teardown then runs as after any failure.
    """
    task = task_timeout(stage)
    margin = timedelta(minutes=_minutes("job_timeout_margin_minutes", DEFAULT_JOB_MARGIN_MINUTES))
    return task - min(margin, task / 10)


def admission_timeout() -> timedelta:
    """How long a job may wait to start: ``[tpu_rl] admission_timeout_minutes`` (default 30).

    From the JobSet's creation until a pod of it is on a node: a job that Kueue keeps suspended
    (no quota) or whose pods no node can take (no capacity) is cancelled after this, with one
    line saying what it waited for, instead of waiting out its ``job_timeout``. At least
    :data:`MIN_ADMISSION_MINUTES` (5): a smaller bound would cancel jobs that are about to start.
    """
    return timedelta(
        minutes=_minutes("admission_timeout_minutes", DEFAULT_ADMISSION_MINUTES, MIN_ADMISSION_MINUTES)
    )


def stage_command_timeout(stage: str) -> float:
    """Seconds the one long CLI call of a task of ``stage`` may take (``gcluster deploy``/``destroy``).

    Same margin as :func:`job_timeout`: the command is stopped and the task fails with a one-line
    "timed out" before Airflow's ``execution_timeout`` interrupts it.
    """
    return job_timeout(stage).total_seconds()


def kill_grace_seconds() -> float:
    """Seconds between SIGTERM and SIGKILL of a stopped command: ``[tpu_rl] kill_grace_seconds``.

    Long enough for Terraform, once interrupted, to write its state and release its lock.
    """
    value = conf.getfloat(SECTION, "kill_grace_seconds", fallback=DEFAULT_KILL_GRACE_SECONDS)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"[{SECTION}] kill_grace_seconds must be a finite number >= 0, not {value}")
    return value


def terraform_lock_timeout() -> float:
    """Seconds Terraform's ``apply`` waits for a held state lock: ``[tpu_rl] terraform_lock_timeout_minutes``."""
    return _minutes("terraform_lock_timeout_minutes", DEFAULT_TERRAFORM_LOCK_MINUTES) * 60


def flex_start_probe_timeout() -> float:
    """Seconds a flex-start TPU pool's placeholder pod may wait for its nodes before the pool
    counts as refused: ``[tpu_rl] flex_start_probe_timeout_minutes`` (default 10)."""
    return _minutes("flex_start_probe_timeout_minutes", DEFAULT_FLEX_START_PROBE_MINUTES) * 60


def ssh_boot_wait() -> tuple[float, float]:
    """Seconds a ``gcloud compute ssh`` refused by a booting guest is tried again for, and between
    tries: ``[tpu_rl] ssh_boot_wait_minutes`` (5) and ``ssh_boot_poll_seconds`` (5)."""
    poll = conf.getfloat(SECTION, "ssh_boot_poll_seconds", fallback=DEFAULT_SSH_BOOT_POLL_SECONDS)
    if not (poll > 0 and math.isfinite(poll)):
        raise ValueError(f"[{SECTION}] ssh_boot_poll_seconds must be a finite number > 0, not {poll}")
    return _minutes("ssh_boot_wait_minutes", DEFAULT_SSH_BOOT_WAIT_MINUTES) * 60, poll


def command_timeout() -> float:
    """Seconds a short CLI call may take: ``[tpu_rl] command_timeout_minutes`` (default 20)."""
    return _minutes("command_timeout_minutes", DEFAULT_COMMAND_MINUTES) * 60


def _retries() -> tuple[int, timedelta]:
    """``[tpu_rl] retries`` and the most their delays add up to (each at most 30 minutes)."""
    retries = conf.getint(SECTION, "retries", fallback=3)
    return retries, MAX_RETRY_DELAY * retries


# The stages a pipeline's cluster (or VM) lives through: from its creation to its teardown (on the
# TPU VM pipeline the CPU VM's, the longer: the first create to the last teardown).
RESOURCE_STAGES: Final[dict[str, tuple[str, str]]] = {
    "gke": ("deploy", "teardown"),
    "tpu_vm": ("vm_create", "teardown"),
}


def resource_stage_bounds(kind: str) -> list[tuple[str, timedelta]]:
    """Each stage a ``gke``/``tpu_vm`` run waits for while its cluster (VM) exists, with its task
    bound (one try each): the least the cluster's expiry (``max_cluster_hours``/``max_vm_hours``)
    must cover, so the janitor never finds a working run's cluster expired."""
    first, last = RESOURCE_STAGES[kind]
    stages = [stage for stage, _ in PIPELINE_STAGES[kind]]
    span = stages[stages.index(first) : len(stages) - stages[::-1].index(last)]
    return [(stage, task_timeout(stage)) for stage in span]


def resource_hours(kind: str) -> int:
    """:func:`resource_stage_bounds` summed, in whole hours (rounded up)."""
    total = sum((bound for _, bound in resource_stage_bounds(kind)), timedelta())
    return math.ceil(total / timedelta(hours=1))


def duration_text(bound: timedelta) -> str:
    """``90 min``, ``48 h``: a bound as a user reads it."""
    minutes = bound.total_seconds() / 60
    return f"{minutes:g} min" if minutes < 120 else f"{minutes / 60:g} h"


def dagrun_timeout(kind: str) -> timedelta:
    """``dagrun_timeout`` of a DAG (``gke``, ``tpu_vm``, ``sweep``, ``janitor``): a backstop.

    ``[tpu_rl] dagrun_timeout_hours`` when set; otherwise the longest a run can take when every
    task uses its whole ``execution_timeout`` on every try (with the retry delays), plus
    :data:`DAGRUN_MARGIN`. A DAG run that times out has its unfinished tasks set to skipped by the
    scheduler, a running or pending teardown included (airflow-core ``scheduler_job_runner.py``
    ``_schedule_dag_run``: ``task_instance.state = TaskInstanceState.SKIPPED`` for every
    unfinished one), so the cluster would be left billing: the run's bound is therefore larger
    than its tasks', which end the run first, and catches only a run whose tasks cannot end
    themselves (a task lost between states). Setting ``dagrun_timeout_hours`` below that sum
    trades the teardown for a shorter bound.
    """
    if kind not in PIPELINE_STAGES:
        raise ValueError(f"unknown DAG kind {kind!r}; known: {sorted(PIPELINE_STAGES)}")
    hours = conf.getfloat(SECTION, "dagrun_timeout_hours", fallback=0.0)
    if not math.isfinite(hours):
        raise ValueError(f"[{SECTION}] dagrun_timeout_hours must be a finite number of hours, not {hours}")
    if hours > 0:
        return timedelta(hours=hours)
    retries, waits = _retries()
    total = timedelta()
    for stage, retried in PIPELINE_STAGES[kind]:
        total += task_timeout(stage) * (retries + 1 if retried else 1) + (waits if retried else timedelta())
    return total + task_timeout("short") * asset_tasks(kind) + DAGRUN_MARGIN


def asset_tasks(kind: str) -> int:
    """The short tasks of a pipeline's assets, not in :data:`PIPELINE_STAGES` (their number follows
    the presets): ``promote_model``, and a ``publish_converted_<preset>`` and a
    ``publish_<preset>`` per model the pipeline offers."""
    from airflow_provider_tpu_rl.spec.presets import Runner, presets_for

    runner = {"gke": Runner.GKE, "tpu_vm": Runner.TPU_VM}.get(kind)
    return 0 if runner is None else 1 + 2 * len(presets_for(runner))
