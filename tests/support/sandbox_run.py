"""Run the real operators in-process against the session sandbox (fake gcluster/gcloud + GCS emulator).

Nothing here mocks the hook or the tools: the operators start the sandbox's ``gcluster``/``gcloud``
shims as subprocesses and read/write the fake-gcs-server, exactly as a worker would. What a test
checks comes from the sandbox's own records (``calls.jsonl``, ``state/*.json``, job logs, objects).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
from airflow.providers.common.compat.sdk import DAG, BaseOperator, Context

from airflow_provider_tpu_rl.compat import TaskDeferred
from airflow_provider_tpu_rl.operators.existing_cluster import MODE_FIELDS
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import MaxTextConvertOperator
from airflow_provider_tpu_rl.operators.tpu_vm import CpuVmCreateOperator, TpuVmStageOperator
from airflow_provider_tpu_rl.pipelines.arguments import gke_task_arguments, tpu_vm_task_arguments
from airflow_provider_tpu_rl.spec import (
    GKE_DAG_ID,
    TPU_VM_DAG_ID,
    gke_pipeline_from_conf,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.triggers.jobset import first_event
from tests.support.waiting import HANG_BOUND, wait_until
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.apis.api_server import api_server_url, start_api_server, stop_api_server
from tpu_rl_sandbox.apis.gcs_client import GcsApi
from tpu_rl_sandbox.apis.gcs_emulator import api_for
from tpu_rl_sandbox.apis.kube_api import POD_HOLD_ENV
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.machines.hosts import VmHost
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.faults import reset_faults
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore

DEFAULT_RUN_ID = "manual__2026-03-01T00:00:00+00:00"
STEP_SECONDS = "0.05"
POLL_INTERVAL = "0.2"
REGION = "us-east5"
ZONE = "us-east5-b"
TRIGGER_DEADLINE_SECONDS = 120.0
# The TPU VM pipeline's tasks up to the converted checkpoint in GCS (before any TPU VM exists).
TPU_VM_CONVERSION_TASKS: tuple[tuple[str, type[BaseOperator]], ...] = (
    ("ensure_bucket", EnsureBucketOperator),
    ("sync_hf_token", HfTokenSecretOperator),
    ("create_cpu_vm", CpuVmCreateOperator),
    ("install_cpu_vm", TpuVmStageOperator),
    ("convert_to_maxtext", TpuVmStageOperator),
)
# Env knobs of the fakes that a test may set; none may leak in from the outside.
SANDBOX_KNOBS = (
    "TPU_RL_SANDBOX_FAIL",
    "TPU_RL_SANDBOX_HOLD_FILE",
    "TPU_RL_SANDBOX_TTL_SCALE",
    "TPU_RL_SANDBOX_POD_HOLD_FILE",
    "HF_TOKEN",
)

OperatorT = TypeVar("OperatorT", bound=BaseOperator)


class RecordingTI:
    """Stands in for the task instance in the context: keeps every ``xcom_push``."""

    def __init__(self, try_number: int = 1) -> None:
        self.try_number = try_number
        self.pushed: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any, **_: Any) -> None:
        self.pushed.append((key, value))

    def pulled(self, key: str) -> Any:
        """The last value pushed under ``key``."""
        return next(value for k, value in reversed(self.pushed) if k == key)


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = HANG_BOUND) -> Any:
    """Poll ``predicate`` until it is truthy (a bound against hangs, not a timing assertion)."""
    return wait_until(predicate, what, timeout)


def defer(operator: BaseOperator, context: Context) -> TaskDeferred:
    """``operator.execute`` must hand over to a trigger; return the ``TaskDeferred`` it raised.

    The job's pods stay pending (waiting containers) until the operator has deferred, so a job
    that would end within a second is still running when the operator looks at it before
    deferring (else it would rightly finish in the worker).
    """
    hold = Path(tempfile.mkdtemp(prefix="pods-pending-")) / "hold"
    hold.write_text("hold")
    previous = os.environ.get(POD_HOLD_ENV)
    os.environ[POD_HOLD_ENV] = str(hold)
    try:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(context)
    finally:
        if previous is None:
            os.environ.pop(POD_HOLD_ENV, None)
        else:
            os.environ[POD_HOLD_ENV] = previous
        hold.unlink(missing_ok=True)
    return deferred.value


def run_trigger(trigger: Any, alongside: Callable[[], Awaitable[None]] | None = None) -> dict[str, Any]:
    """Run the trigger's ``run()`` to its first event (optionally with a helper coroutine)."""

    async def main() -> dict[str, Any]:
        if alongside is None:
            return await asyncio.wait_for(first_event(trigger), TRIGGER_DEADLINE_SECONDS)
        helper = asyncio.ensure_future(alongside())
        try:
            return await asyncio.wait_for(first_event(trigger), TRIGGER_DEADLINE_SECONDS)
        finally:
            if not helper.done():
                helper.cancel()
            else:
                helper.result()  # re-raise a failed helper

    return asyncio.run(main())


def argv_has(call: dict[str, Any], *words: str) -> bool:
    return all(word in call["argv"] for word in words)


@dataclass
class SandboxRun:
    """One test's view of the shared sandbox: its own names, contexts and the sandbox records."""

    info: SandboxInfo
    work_dir: Path
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    # -- names -----------------------------------------------------------------------------
    @property
    def project(self) -> str:
        return f"proj-{self.suffix}"

    @property
    def cluster(self) -> str:
        return f"c{self.suffix}"

    @property
    def bucket(self) -> str:
        return f"bkt-{self.suffix}"

    @property
    def vm(self) -> str:
        return f"vm-{self.suffix}"

    def gke_conf(self, **overrides: Any) -> dict[str, Any]:
        """A small GKE pipeline conf (3 batches) naming this test's project, cluster and bucket."""
        conf: dict[str, Any] = {
            "model": "gemma4-26b",
            "project": self.project,
            "region": REGION,
            "zone": ZONE,
            "cluster_name": self.cluster,
            "bucket": self.bucket,
            "reservation": "res-1",
            "num_batches": 3,
        }
        conf.update(overrides)
        return conf

    def tpu_vm_conf(self, **overrides: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "model": "llama3.1-8b-Instruct",
            "project": self.project,
            "zone": ZONE,
            "vm_name": self.vm,
            "bucket": self.bucket,
            "reservation": "res-8",
            "num_batches": 3,
        }
        conf.update(overrides)
        return conf

    # -- operators and contexts ---------------------------------------------------------------
    def task_arguments(self, dag_id: str, task_id: str, conf: dict[str, Any], run_id: str) -> dict[str, Any]:
        """The arguments the pipeline DAG gives ``task_id`` for ``conf`` (validate's resolved values)."""
        if dag_id == TPU_VM_DAG_ID:
            resolved = tpu_vm_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id).resolved()
            return tpu_vm_task_arguments(resolved.__getitem__).get(task_id, {})
        resolved = gke_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id).resolved()
        return gke_task_arguments(resolved.__getitem__).get(task_id, {})

    def operator(
        self,
        factory: Callable[..., OperatorT],
        dag_id: str = GKE_DAG_ID,
        *,
        conf: dict[str, Any] | None = None,
        run_id: str = DEFAULT_RUN_ID,
        **kwargs: Any,
    ) -> OperatorT:
        """A fresh operator in a fresh DAG object (a new worker process would build it anew), with
        the arguments the pipeline DAG gives its task (for this test's default conf unless given)."""
        if conf is None:
            conf = self.tpu_vm_conf() if dag_id == TPU_VM_DAG_ID else self.gke_conf()
        arguments = self.task_arguments(dag_id, kwargs["task_id"], conf, run_id)
        if not isinstance(factory, type) or not set(MODE_FIELDS) <= set(
            getattr(factory, "template_fields", ())
        ):
            # the Gcluster cluster operators themselves (the DAG's ClusterMode* subclasses take the mode)
            arguments = {key: value for key, value in arguments.items() if key not in MODE_FIELDS}
        return factory(dag=DAG(dag_id, schedule=None), **{**arguments, **kwargs})

    def context(
        self,
        operator: BaseOperator,
        conf: dict[str, Any],
        *,
        run_id: str = DEFAULT_RUN_ID,
        start_date: datetime | None = None,
        ti: RecordingTI | None = None,
        apply_arguments: bool = True,
    ) -> Context:
        """What the operators read from an Airflow context, with a recording task instance.

        As rendering the DAG's templates would, the operator's arguments are set from ``conf``
        (``apply_arguments=False``: the test renders the operator's own templates instead).
        """
        if apply_arguments:
            for name, value in self.task_arguments(operator.dag_id, operator.task_id, conf, run_id).items():
                setattr(operator, name, value)
        started = start_date or datetime.now(UTC)
        values = {
            "params": dict(conf),
            "run_id": run_id,
            "dag": operator.dag,
            "task": operator,
            "ti": ti or RecordingTI(),
            "dag_run": SimpleNamespace(
                dag_id=operator.dag_id, run_id=run_id, start_date=started, logical_date=started, conf=conf
            ),
            "ds": started.strftime("%Y-%m-%d"),
        }
        return cast(Context, values)

    # -- sandbox records ----------------------------------------------------------------------
    @property
    def layout(self) -> SandboxLayout:
        return SandboxLayout(self.info.root)

    @property
    def api(self) -> GcsApi:
        return api_for(self.layout)

    def state(self, document: str) -> dict[str, Any]:
        return StateStore(self.layout).read(document)

    def calls(self) -> list[dict[str, Any]]:
        """Recorded fake-tool calls that name this test's project, cluster, bucket or VM."""
        mine = (self.project, self.cluster, self.bucket, self.vm)
        return [
            call for call in read_calls(self.layout) if any(name in " ".join(call["argv"]) for name in mine)
        ]

    def vm_tool_calls(self, vm_name: str) -> list[dict[str, Any]]:
        """The tool calls a VM's own log recorded (its shell's apt, uv, docker, python, gcloud …);
        none when no tool ran there."""
        log = self.layout.vm_dir(vm_name) / VmHost.TOOL_CALL_LOG.lstrip("/")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def job_calls(self, verb: str, job_name: str) -> list[dict[str, Any]]:
        """``gcluster job <verb>`` calls for ``job_name`` (submit: ``--name=``; others: the argument)."""
        out = []
        for call in self.calls():
            argv = call["argv"]
            if call["tool"] != "gcluster" or argv[:2] != ["job", verb]:
                continue
            if (verb == "submit" and f"--name={job_name}" in argv) or (verb != "submit" and job_name in argv):
                out.append(call)
        return out

    def cluster_record(self, name: str | None = None) -> dict[str, Any] | None:
        return self.state("clusters").get(f"{self.project}/{REGION}/{name or self.cluster}")

    def job_record(self, job_name: str) -> dict[str, Any] | None:
        return self.state("jobs").get(f"{self.project}/{REGION}/{self.cluster}/{job_name}")

    def job_log(self, job: dict[str, Any]) -> str:
        """The workload's whole log (the current attempt), as the pod wrote it."""
        path = self.layout.jobs_dir / str(job["uid"]) / f"attempt-{int(job.get('attempt') or 1)}.log"
        return path.read_text() if path.is_file() else ""

    def job_log_of(self, job_name: str) -> str:
        """The log of this test's job ``job_name`` ("" while it has none)."""
        job = self.job_record(job_name)
        return self.job_log(job) if job else ""

    def kube(self, cluster: str | None = None) -> kube_access.ClusterAccess:
        """Token, URL and CA of this test's cluster's fake Kubernetes API (as the provider gets them)."""
        return kube_access.cluster_access(self.layout, self.project, REGION, cluster or self.cluster)

    def pods(self, job_name: str) -> list[dict[str, Any]]:
        """The JobSet's pods as the Kubernetes API lists them."""
        access = self.kube()
        answer = kube_access.request(
            access,
            "GET",
            f"/api/v1/namespaces/default/pods?labelSelector=jobset.sigs.k8s.io/jobset-name%3D{job_name}",
        )
        assert answer.status == 200, answer.text
        items: list[dict[str, Any]] = answer.json()["items"]
        return items

    def container_log(self, job_name: str, replicated_job: str, container: str) -> list[str]:
        """The whole log of ``container`` in job 0 / index 0 of ``replicated_job`` (newest restart)."""
        from airflow_provider_tpu_rl.hooks.kubernetes import head_pod

        pod = head_pod(self.pods(job_name), replicated_job)
        assert pod is not None, f"no {replicated_job} pod for {job_name}"
        answer = kube_access.request(
            self.kube(),
            "GET",
            f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/log?container={container}",
        )
        assert answer.status == 200, answer.text
        return answer.text.splitlines()

    def objects(self, bucket: str | None = None, prefix: str = "") -> list[str]:
        return sorted(info.name for info in self.api.iter_objects(bucket or self.bucket, prefix))

    def bucket_exists(self, bucket: str | None = None) -> bool:
        return self.api.get_bucket(bucket or self.bucket) is not None

    def hold_file(self) -> Path:
        """A hold file for the simulated MaxText: while it exists, checkpoint commits wait."""
        path = self.work_dir / f"hold-{uuid.uuid4().hex[:6]}"
        path.write_text("hold")
        return path


@contextlib.contextmanager
def api_server(layout: SandboxLayout) -> Iterator[str]:
    """The sandbox's API server (started here, and stopped after, unless it was running)."""
    running = api_server_url(layout)
    url = running or start_api_server(layout)
    try:
        yield url
    finally:
        if running is None:
            stop_api_server(layout)


def enter_sandbox(sandbox: SandboxInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SandboxRun:
    """Point this process at the sandbox (os.environ, temp dir) for one test."""
    for key, value in sandbox.env.items():
        monkeypatch.setenv(key, value)
    for key in SANDBOX_KNOBS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TPU_RL_SANDBOX_STEP_SECONDS", STEP_SECONDS)
    monkeypatch.setenv("AIRFLOW__TPU_RL__POLL_INTERVAL", POLL_INTERVAL)
    # No Airflow scheduler here to race: the job triggers fire as soon as the job ends.
    monkeypatch.setenv("AIRFLOW__TPU_RL__MIN_DEFERRAL_SECONDS", "0")
    # ...nor a triggerer between a trigger and its log: it fires as soon as its last lines are logged.
    monkeypatch.setenv("AIRFLOW__TPU_RL__TRIGGER_LOG_SETTLE_SECONDS", "0")
    # The job operators' `deferrable` default; a test that waits in the worker says so.
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    # Work dirs, job HOMEs and temp files of this test stay under its tmp_path.
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    monkeypatch.setenv("TMPDIR", str(work_dir))
    monkeypatch.setattr(tempfile, "tempdir", str(work_dir))
    return SandboxRun(sandbox, work_dir)


# -- pipeline steps shared by the tests ---------------------------------------------------------
def prepare_cluster(
    run: SandboxRun, conf: dict[str, Any], *, tpu_pool: bool = True, **context_kwargs: Any
) -> dict[str, Any]:
    """ensure_bucket → deploy_cluster → sync_hf_token, as the GKE DAG runs them: the cluster
    deploy's result. With ``tpu_pool`` the one deploy also applies the TPU pool's group (what the
    DAG's deploy_tpu_pool adds once the conversion is done; tests/e2e and
    tests/operators/test_gke.py run that task itself)."""
    bucket = run.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(run.context(bucket, conf, **context_kwargs))
    deploy = run.operator(GclusterDeployOperator, task_id="deploy_cluster")
    context = run.context(deploy, conf, **context_kwargs)
    if tpu_pool:
        deploy.skip_groups = None  # every group in one `gcluster deploy`
    deployed: dict[str, Any] = deploy.execute(context)
    token = run.operator(HfTokenSecretOperator, task_id="sync_hf_token")
    token.execute(run.context(token, conf, **context_kwargs))
    return deployed


def run_job_operator(
    run: SandboxRun, operator: BaseOperator, conf: dict[str, Any], **context_kwargs: Any
) -> dict[str, Any]:
    """execute → (deferred) trigger → execute_complete, as the worker and the triggerer would."""
    context = run.context(operator, conf, **context_kwargs)
    try:
        finished: dict[str, Any] = operator.execute(context)
    except TaskDeferred as deferred:
        event = run_trigger(deferred.trigger)
        result: dict[str, Any] = getattr(operator, deferred.method_name)(context, event)
        return result
    return finished  # skipped, or the job had already ended: no deferral


def convert_checkpoint(run: SandboxRun, conf: dict[str, Any], **context_kwargs: Any) -> dict[str, Any]:
    """The HF→MaxText conversion job, run to completion."""
    convert = run.operator(MaxTextConvertOperator, task_id="convert_to_maxtext")
    return run_job_operator(run, convert, conf, **context_kwargs)


# -- what the simulated MaxText printed ---------------------------------------------------------
_REWARD_RE = re.compile(r"(Pre RL Training|Post RL Training):.*mean_reward=([-+0-9.eE]+)")
_LOSS_RE = re.compile(r"Train step (\d+) training loss: ([-+0-9.eE]+)")


def printed_rewards(log_text: str) -> dict[str, float]:
    """``{"pre": r, "post": r}`` from the ``Pre/Post RL Training`` lines of a trainer log."""
    found = {}
    for match in _REWARD_RE.finditer(log_text):
        found["pre" if match[1].startswith("Pre") else "post"] = float(match[2])
    return found


def printed_losses(log_text: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in _LOSS_RE.finditer(log_text)}


def iter_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


def json_text(value: Any) -> str:
    return json.dumps(value, default=repr, sort_keys=True)


# ---------------------------------------------------------------- fixtures (given by a conftest.py)
@pytest.fixture
def sb(sandbox: SandboxInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SandboxRun:
    """The sandbox in os.environ (shims on PATH, emulator, connections, fast steps and polls)."""
    return enter_sandbox(sandbox, tmp_path, monkeypatch)


@pytest.fixture
def clean_faults(sb: SandboxRun) -> Iterator[None]:
    """Transient faults fire once per sandbox: forget earlier firings around the test."""
    reset_faults(sb.layout)
    yield
    reset_faults(sb.layout)


@pytest.fixture
def preempt_after_two(sb: SandboxRun) -> Iterator[None]:
    """The sandbox takes the TPU capacity from under a training after its 2nd committed checkpoint."""
    update_settings(sb.layout, preempt_after_checkpoints=2)
    try:
        yield
    finally:
        update_settings(sb.layout, preempt_after_checkpoints=0)


@pytest.fixture
def spot_tpu_restarts(sb: SandboxRun) -> Iterator[None]:
    """A world where a preempted Spot TPU VM may start again (Compute Engine's spot page; Cloud
    TPU's says it may not, the sandbox's default: settings ``spot_tpu_restart``)."""
    update_settings(sb.layout, spot_tpu_restart=True)
    try:
        yield
    finally:
        update_settings(sb.layout, spot_tpu_restart=False)
