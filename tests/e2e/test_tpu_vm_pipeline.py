"""``tpu_rl_tpu_vm_pipeline`` end to end in the sandbox: success, faults, ledger.

The VM path's faults (see the fake gcloud, ``sandbox/tpu_rl_sandbox/clis/gcloud/``): ``deploy`` =
``gcloud compute instances create`` (the first one: the CPU VM's), ``ssh`` = ``gcloud compute ssh`` (every stage runs over it;
the first: the CPU VM's install), ``destroy`` = ``gcloud compute instances delete`` (the first: the
TPU VM's, right after the actor checkpoint), ``export`` = MaxText's to_huggingface on the CPU VM. Each scenario is one ``airflow dags test`` subprocess with its own VM
and bucket, in this module's own sandbox and AIRFLOW_HOME.

What a lower-level test pins is not run again here: a VM create that fails for good takes the
setup-failed teardown path the GKE deploy that fails for good checks (tests/e2e/test_timeouts.py;
the structure test pins that both DAGs wire it alike); a VM delete that fails for good fails the
run as the GKE destroy fault does (the watcher and the structure test are the same for both DAGs)
and names the VM it leaves (tests/operators/test_tpu_vm.py), where deleting a VM that was
never created counts as done. The transient faults share one run.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger.model_card import parse_front_matter
from airflow_provider_tpu_rl.spec import TpuVmPipelineSpec, tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.presets import REHEARSAL_MODEL
from tests.e2e.curves import check_curves_next_to_the_checkpoints, check_runs_plot_draws_the_trend
from tests.support.harness import TPU_VM_DAG_ID, DagRunResult, E2EWorld, printed_rewards
from tpu_rl_sandbox.apis.gcs_client import split_gs_url
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.inventory import project_number
from tpu_rl_sandbox.world.store import StateStore

pytestmark = pytest.mark.e2e

PROJECT = "tpu-rl-e2e"
NUM_BATCHES = 3
# A failed export needs no run of its own: tests/dags/test_pipeline_structure.py pins delete_vm
# before the export and delete_cpu_vm as the CPU VM's teardown, the happy run shows the TPU VM gone
# before the export's first object, and the ssh fault run the CPU VM deleted after a failure.
PERMANENT_FAULTS = ("ssh",)
FAILING_TASK = {
    "deploy": "create_cpu_vm",
    "ssh": "install_cpu_vm",
    "train": "train",
    "destroy": "delete_vm",
    "export": "export_to_huggingface",
}
TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
CONVERTERS = ("maxtext.checkpoint_conversion.to_maxtext", "maxtext.checkpoint_conversion.to_huggingface")
# The VM create (a stockout), a stage's SSH session, the training (the slice lost: JAX's UNAVAILABLE)
# and the VM delete each fail once, in one run.
TRANSIENT_KINDS = ("deploy", "ssh", "train", "destroy")


def conf(name: str, **extra: Any) -> dict[str, Any]:
    """A run conf with this scenario's own VM and bucket."""
    return {
        "project": PROJECT,
        "vm_name": f"e2e-{name}",
        "bucket": f"tpu-rl-e2e-vm-{name}",
        "num_batches": NUM_BATCHES,
        "train_overrides": {"num_test_batches": 2},
        **extra,
    }


def spec_of(result: DagRunResult) -> TpuVmPipelineSpec:
    """The paths the run derived (same pure function the operators use)."""
    return tpu_vm_pipeline_from_conf(result.conf, dag_id=result.dag_id, run_id=result.run_id)


def vm_calls(result: DagRunResult, verb: str, vm: str | None = None) -> list[int]:
    """Exit codes of ``gcloud compute instances <verb>`` in the run (of ``vm`` alone, if named)."""
    calls = result.calls_of("gcloud", "compute", "instances", verb)
    return [call.exit_code for call in calls if vm is None or vm in call.argv]


def lives(world: E2EWorld, spec: TpuVmPipelineSpec, vm_name: str) -> list[dict[str, Any]]:
    """The sandbox's record of each life of ``vm_name``: machine type, create and delete times
    (epoch seconds) and the MaxText programs it started."""
    history = StateStore(world.layout).read("vm_history")
    return list(history.get(f"{spec.vm.project}/{spec.vm.zone}/{vm_name}", []))


def written_at(world: E2EWorld, uri: str) -> dict[str, float]:
    """Object name → when the emulator says it was last written (epoch seconds), under ``uri``."""
    bucket, prefix = split_gs_url(uri)
    out = {}
    for info in world.gcs.iter_objects(bucket, prefix.rstrip("/") + "/"):
        seconds, _, fraction = info.updated.rstrip("Z").partition(".")
        when = datetime.fromisoformat(f"{seconds}.{(fraction or '0').ljust(6, '0')[:6]}+00:00")
        out[info.name] = when.timestamp()
    return out


# ==================================================================================== runs
@pytest.fixture(scope="module")
def happy(world: E2EWorld) -> DagRunResult:
    world.sync_dags()  # Airflow 2.11: the model assets in the database, so their events are kept
    return world.run_dag(TPU_VM_DAG_ID, conf("ok"))


@pytest.fixture(scope="module")
def fault_run(world: E2EWorld) -> Callable[[str], DagRunResult]:
    """``fault_run(kind)``: the run with a permanent ``kind`` fault (run once per module)."""
    done: dict[str, DagRunResult] = {}

    def run(kind: str) -> DagRunResult:
        if kind not in done:
            done[kind] = world.run_dag(TPU_VM_DAG_ID, conf(f"f-{kind}"), faults=kind)
        return done[kind]

    return run


@pytest.fixture(scope="module")
def transient(world: E2EWorld) -> DagRunResult:
    """Each of :data:`TRANSIENT_KINDS` fails once, transiently, in one run. It is the rehearsal
    (qwen3-0.6b on a v6e-4): every step of a real run, end to end."""
    faults = ",".join(f"{kind}:transient" for kind in TRANSIENT_KINDS)
    # on-demand: the module's reservation holds ct6e-standard-8t VMs, which preflight refuses for a v6e-4
    rehearsal = conf("t-all", model=REHEARSAL_MODEL, reservation="", capacity="on-demand")
    return world.run_dag(TPU_VM_DAG_ID, rehearsal, faults=faults)


@pytest.fixture(scope="module")
def all_runs(
    happy: DagRunResult,
    fault_run: Callable[[str], DagRunResult],
    transient: DagRunResult,
) -> list[DagRunResult]:
    """Every scenario of this module (the ledger tests look at all of them)."""
    return [happy, *(fault_run(kind) for kind in PERMANENT_FAULTS), transient]


# =================================================================================== tests
def test_pipeline_succeeds_with_one_vm_lifecycle(world: E2EWorld, happy: DagRunResult) -> None:
    assert happy.exit_code == 0, happy.describe()
    assert happy.state == "success", happy.describe()
    failed = {t: r.state for t, r in happy.tasks.items() if t != "watcher" and r.state != "success"}
    # only the rehearsal's asset tasks skip (this run trained llama3.1-8b-Instruct)
    assert failed == {"publish_qwen3-0_6b": "skipped", "publish_converted_qwen3-0_6b": "skipped"}, (
        happy.describe()
    )
    assert happy.task_state("watcher") == "skipped"
    spec = spec_of(happy)
    for vm in (spec.cpu_vm.vm_name, spec.vm.vm_name):
        assert (vm_calls(happy, "create", vm), vm_calls(happy, "delete", vm)) == ([0], [0]), vm
    # the boot image's bake VM (the first run of the project bakes): deleted by its task, so its
    # teardown finds it gone ("not found" counts as deleted)
    bake = spec.bake_vm.vm_name
    assert (vm_calls(happy, "create", bake), vm_calls(happy, "delete", bake)) == ([0], [0, 1])
    assert happy.submitted_jobs() == []  # no gcluster on this path
    assert spec.vm.vm_name not in world.live_vms()
    assert spec.cpu_vm.vm_name not in world.live_vms()
    assert bake not in world.live_vms()


def test_the_runs_iam_grants_go_with_its_last_vm(world: E2EWorld, happy: DagRunResult) -> None:
    """The VMs' account got the token secret and the bucket; the CPU VM's delete, the last of the
    run's VMs, took both back: the sandbox's policies hold nothing of the run's."""
    spec = spec_of(happy)
    member = f"serviceAccount:{project_number(PROJECT)}-compute@developer.gserviceaccount.com"
    for verb in ("add", "remove"):
        calls = [
            call
            for call in happy.calls
            if call.is_("gcloud", "secrets", f"{verb}-iam-policy-binding")
            or call.is_("gcloud", "storage", "buckets", f"{verb}-iam-policy-binding")
        ]
        assert calls, verb
        assert all(call.exit_code == 0 and f"--member={member}" in call.argv for call in calls), verb
    secret = iam_bindings(world.layout, f"projects/{PROJECT}/secrets/{spec.hf_token.secret_id}")
    assert member not in secret.get("roles/secretmanager.secretAccessor", [])
    assert member not in iam_bindings(world.layout, f"b/{spec.vm.bucket}").get(
        "roles/storage.objectAdmin", []
    )


def test_the_tpu_vm_exists_only_while_it_trains(world: E2EWorld, happy: DagRunResult) -> None:
    """Conversion and export ran on the CPU VM; the TPU VM was created after the converted
    checkpoint's commit marker was written and deleted before the export wrote anything."""
    spec = spec_of(happy)
    assert happy.state == "success", happy.describe()
    (tpu,) = lives(world, spec, spec.vm.vm_name)
    (cpu,) = lives(world, spec, spec.cpu_vm.vm_name)
    assert tpu["machineType"] == "ct6e-standard-8t"
    assert cpu["machineType"] == spec.cpu_vm.machine_type == "n2-highmem-32"
    assert [p["module"] for p in tpu["programs"]] == [TRAIN_RL]
    assert [p["module"] for p in cpu["programs"]] == list(CONVERTERS)
    # One MaxText per run: the CPU VM converted and exported in the image the TPU VM trained in.
    ran = {(p["runtime"], p["maxtext_version"]) for p in [*tpu["programs"], *cpu["programs"]]}
    assert ran == {("container", spec.preset.maxtext_version)}
    # The TPU VM booted from the baked image family (named after the workload image's digest).
    (create,) = [
        c for c in happy.calls_of("gcloud", "compute", "instances", "create") if spec.vm.vm_name in c.argv
    ]
    assert f"--image-project={spec.vm.project}" in create.argv
    assert any(arg.startswith("--image-family=tpu-rl-sha256-") for arg in create.argv), create.argv
    installed = happy.task_log("install_maxtext")
    assert "nothing to install or pull" in installed
    assert "Pulling from" not in installed
    assert "docker.io" not in installed

    converted = written_at(world, spec.conversion.output_directory)
    _, prefix = split_gs_url(spec.conversion.output_directory)
    marker = prefix.rstrip("/") + "/0/commit_success.txt"
    assert marker in converted, sorted(converted)
    assert converted[marker] < tpu["created"]
    assert max(converted.values()) < tpu["created"]

    actor = written_at(world, spec.gcs_actor_checkpoint)
    actor_marker = split_gs_url(spec.gcs_actor_checkpoint)[1] + "/commit_success.txt"
    exported = written_at(world, spec.gcs_export)
    assert actor[actor_marker] < tpu["deleted"] < min(exported.values())
    # The CPU VM outlived the export and went last.
    assert max(exported.values()) < cpu["deleted"]
    assert tpu["deleted"] < cpu["deleted"]


def test_pipeline_leaves_checkpoint_and_export_in_gcs(world: E2EWorld, happy: DagRunResult) -> None:
    """Both VMs are gone: what is left is what the stages wrote to GCS, complete."""
    spec = spec_of(happy)
    assert happy.state == "success", happy.describe()
    assert world.hf_export_problems(spec.gcs_export) == []
    actor = world.objects(spec.gcs_actor_checkpoint)
    assert {"commit_success.txt", "_CHECKPOINT_METADATA", "model_params/_METADATA"} <= actor


@pytest.mark.parametrize("kind", ["ssh"])
def test_permanent_fault_fails_the_run_and_deletes_the_vm(
    world: E2EWorld, fault_run: Callable[[str], DagRunResult], kind: str
) -> None:
    result = fault_run(kind)
    spec = spec_of(result)
    vm = spec.vm.vm_name
    assert result.exit_code == 1, result.describe()
    assert result.state == "failed", result.describe()
    assert result.task_state(FAILING_TASK[kind]) == "failed", result.describe()
    assert result.task_state("watcher") == "failed"
    assert result.task_state("record_run") == "success"
    assert world.bucket_exists(spec.vm.bucket)

    # The teardown ran and deleted the VM; nothing the failed stage would have copied out exists.
    deletes = vm_calls(result, "delete")
    assert deletes, result.describe()
    assert vm not in world.live_vms(), result.describe()
    assert spec.cpu_vm.vm_name not in world.live_vms(), result.describe()
    assert world.objects(spec.gcs_actor_checkpoint) == set()
    # The CPU VM's install failed: the TPU VM was never created.
    assert lives(world, spec, vm) == []


def test_transient_failures_are_retried_and_the_run_succeeds(
    world: E2EWorld, transient: DagRunResult
) -> None:
    result = transient
    assert result.exit_code == 0, result.describe()
    assert result.state == "success", result.describe()
    assert world.fired_faults() == set(TRANSIENT_KINDS), result.describe()
    for kind in TRANSIENT_KINDS:
        assert result.tasks[FAILING_TASK[kind]].try_number == 2, (kind, result.describe())
    assert vm_calls(result, "create") == [1, 0, 0], result.describe()  # CPU VM twice, TPU VM
    assert vm_calls(result, "delete")[-1] == 0, result.describe()
    spec = spec_of(result)
    assert spec.vm.vm_name not in world.live_vms()
    assert world.hf_export_problems(spec.gcs_export) == []
    # the rehearsal: qwen3-0.6b on one v6e-4, converted, trained and exported by name
    assert (spec.preset.model_name, spec.vm.machine_type) == (REHEARSAL_MODEL, "ct6e-standard-4t")
    tpu_lives = lives(world, spec, spec.vm.vm_name)
    assert tpu_lives
    assert {life["machineType"] for life in tpu_lives} == {"ct6e-standard-4t"}, tpu_lives
    assert TRAIN_RL in [p["module"] for life in tpu_lives for p in life["programs"]], tpu_lives


def test_ledger_records_the_rewards_the_vm_printed(world: E2EWorld, happy: DagRunResult) -> None:
    # On this path the training output reaches us only through the SSH session (the task log).
    printed = printed_rewards(happy.output)
    assert set(printed) == {"pre", "post"}
    recorded = dict(
        world.ledger(
            "SELECT phase, metric_value FROM run_metrics WHERE run_id = ? AND metric_name = 'mean_reward' "
            "AND phase IN ('pre', 'post')",
            (happy.ledger_run_id,),
        )
    )
    assert recorded == pytest.approx(printed, abs=1e-9)


def test_ledger_holds_one_row_per_dag_run_with_its_state(
    world: E2EWorld, all_runs: list[DagRunResult]
) -> None:
    dag_runs = dict(world.metadata("SELECT run_id, state FROM dag_run WHERE dag_id = ?", (TPU_VM_DAG_ID,)))
    dag_runs = {f"{TPU_VM_DAG_ID}/{run_id}": state for run_id, state in dag_runs.items()}
    assert len(dag_runs) == len(all_runs)
    ledger_rows = world.ledger("SELECT run_id, state FROM runs WHERE dag_id = ?", (TPU_VM_DAG_ID,))
    assert len(ledger_rows) == len(dag_runs)  # the retried transient run included: one row, not two
    assert dict(ledger_rows) == dag_runs
    assert {run.ledger_run_id: run.state for run in all_runs} == dag_runs


def test_ledger_artifacts_exist_in_the_emulator(world: E2EWorld, all_runs: list[DagRunResult]) -> None:
    happy = all_runs[0]
    uris = dict(world.ledger("SELECT kind, uri FROM run_artifacts WHERE run_id = ?", (happy.ledger_run_id,)))
    assert set(uris) == {"actor_checkpoint", "hf_export", "curves", "model_card"}
    assert world.hf_export_problems(uris["hf_export"]) == []
    # the model card beside the export, and the promoted model's asset event (no gate: promoted)
    meta = parse_front_matter(world.model_card(uris["hf_export"]))
    assert (meta["base_model"], meta["license"], meta["datasets"]) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "llama3.1",
        ["openai/gsm8k"],
    )
    events = world.asset_events("tpu-rl://models/llama3.1-8b-Instruct")
    (extra,) = [extra for _, run, extra in events if run == happy.run_id]
    assert extra["export_uri"] == uris["hf_export"]
    assert extra["maxtext_release"] == "0.2.3"
    assert extra["run_id"] == happy.ledger_run_id
    artifacts = world.ledger("SELECT run_id, kind, uri FROM run_artifacts")
    # A folder (checkpoints, the export) has objects under it; the curves PNG is one object.
    missing = [
        (run_id, kind, uri)
        for run_id, kind, uri in artifacts
        if not (world.exists(uri) if kind in ("curves", "model_card") else world.objects(uri))
    ]
    assert missing == []


def test_no_vm_is_left_behind(world: E2EWorld, all_runs: list[DagRunResult]) -> None:
    assert world.live_vms() == set(), [run.describe() for run in all_runs]


def test_tpu_rl_runs_lists_every_run_with_its_state(world: E2EWorld, all_runs: list[DagRunResult]) -> None:
    listed = world.tpu_rl("runs", "--limit", "50")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert any(line.split()[:3] == ["RUN", "MODEL", "STATE"] for line in lines), listed.stdout
    for run in all_runs:
        (line,) = [line for line in lines if line.startswith(run.ledger_run_id + " ")]
        assert line.split()[1:3] == [spec_of(run).preset.model_name, run.state], line
    happy = all_runs[0]
    (happy_line,) = [line for line in lines if line.startswith(happy.ledger_run_id + " ")]
    printed = printed_rewards(happy.output)
    assert f"{printed['pre']:.2f}→{printed['post']:.2f}" in happy_line
    assert happy_line.rstrip("/").endswith(spec_of(happy).gcs_export)


def test_record_run_puts_the_ledgers_curves_next_to_the_checkpoints(
    world: E2EWorld, happy: DagRunResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_curves_next_to_the_checkpoints(world, happy, monkeypatch)


def test_runs_plot_draws_the_trend_of_the_ledger(world: E2EWorld, happy: DagRunResult) -> None:
    check_runs_plot_draws_the_trend(world, happy)
