"""``tpu_rl_gke_pipeline`` end to end in the sandbox: success, a second default run, faults, ledger, curves.

Every scenario is one real ``airflow dags test`` subprocess (about 20-30 s each) in this module's
own sandbox and AIRFLOW_HOME; each scenario has its own cluster and bucket so their outputs
cannot mask each other, except the permanent destroy fault, which is also the second default run:
it reuses the happy run's conf exactly, so it skips conversion and trains its own model. Runs are
module fixtures: they run once, the first time a test asks for them.

What a lower-level test pins is not run again here: a permanent fault of the conversion or export
job takes the same teardown and watcher path as the training fault below (their job operators'
failure handling is in tests/operators/test_gke_jobs.py); a deploy that fails for
good is tests/e2e/test_timeouts.py's run (its deploy times out with no retry: the teardown destroys
the cluster, nothing is converted, the bucket stays); reusing a ``run_name`` on purpose (adopt, or
refuse other settings) is tests/operators/test_run_identity.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger.billing import spans_from_json
from airflow_provider_tpu_rl.ledger.model_card import parse_front_matter
from airflow_provider_tpu_rl.ledger.records import as_utc
from airflow_provider_tpu_rl.render import boot_image, image_stream
from airflow_provider_tpu_rl.render.gke import resource_record_object
from airflow_provider_tpu_rl.spec import GkePipelineSpec, gke_pipeline_from_conf
from airflow_provider_tpu_rl.spec.presets import REHEARSAL_MODEL
from tests.e2e.curves import check_curves_next_to_the_checkpoints, check_runs_plot_draws_the_trend
from tests.support.harness import GKE_DAG_ID, DagRunResult, E2EWorld, duplicates, printed_rewards
from tpu_rl_sandbox.commands.lifecycle import HF_SANDBOX_TOKEN
from tpu_rl_sandbox.world.registry import REGISTRY_IMAGES
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import PULL_MINUTES, STREAMED_PULL_MINUTES

pytestmark = pytest.mark.e2e

PROJECT = "tpu-rl-e2e"
NUM_BATCHES = 3
PERMANENT_FAULTS = ("train", "destroy")
TRANSIENT_WORK_KINDS = ("deploy", "convert", "train", "export")
TRANSIENT_KINDS = (*TRANSIENT_WORK_KINDS, "destroy")
TRANSIENT_FAULTS = ",".join(f"{kind}:transient" for kind in TRANSIENT_KINDS)
FAILING_TASK = {"train": "train", "destroy": "destroy_cluster"}
# A checkpoint every 2 steps: a train fault (which fires once a checkpoint is saved) stops the
# job at step 2 of 3, mid-way, with actor/2 already committed.
MID_WAY_CHECKPOINTS = {"checkpoint_period": 2}
# A reward gain no run reaches: the transient run's model is not promoted (promote_model skipped).
NOT_PROMOTED_GAIN = 1000
OL_EVENTS = "ol-events.jsonl"
# The transient run's Artifact Registry repository: its TPU node pool streams the training image.
IMAGE_REPOSITORY = "tpu-rl-e2e-images"


def conf(name: str, **extra: Any) -> dict[str, Any]:
    """A run conf with this scenario's own cluster and bucket."""
    return {
        "project": PROJECT,
        "cluster_name": f"e2e-{name}",
        "bucket": f"tpu-rl-e2e-gke-{name}",
        "num_batches": NUM_BATCHES,
        **extra,
    }


def spec_of(result: DagRunResult) -> GkePipelineSpec:
    """The paths and job names the run derived (same pure function the operators use)."""
    return gke_pipeline_from_conf(result.conf, dag_id=result.dag_id, run_id=result.run_id)


def step_dir(spec: GkePipelineSpec, step: int) -> str:
    return f"{spec.training.actor_checkpoint_root}{step}"


def assert_no_duplicate_submits(result: DagRunResult) -> None:
    """A job name is submitted again only after its failed JobSet was cancelled."""
    live: set[str] = set()
    for call in result.calls:
        if call.is_("gcluster", "job", "cancel"):
            live.discard(call.argv[2])
        elif call.is_("gcluster", "job", "submit") and call.exit_code == 0:
            name = str(call.flag("name"))
            assert name not in live, f"job {name} submitted twice without a cancel\n{result.describe()}"
            live.add(name)


# ==================================================================================== runs
@pytest.fixture(scope="module")
def happy(world: E2EWorld) -> DagRunResult:
    """All steps fine; the Qwen preset as it is, which evaluates before and after training
    (num_test_batches=2), so MaxText prints rewards.

    Slower simulated steps (0.4 s) so the job trigger surely sees the training job Running and
    follows its log from the start, as a real minutes-long training is followed.
    """
    world.sync_dags()  # Airflow 2.11: the model assets in the database, so their events are kept
    return world.run_dag(
        GKE_DAG_ID,
        conf("ok"),
        env_overrides={"TPU_RL_SANDBOX_STEP_SECONDS": "0.4", **openlineage_to_file(world)},
    )


def openlineage_to_file(world: E2EWorld) -> dict[str, str]:
    """The OpenLineage provider on, its events one JSON line each in the module's ``ol-events.jsonl``."""
    transport = {"type": "file", "log_file_path": str(world.root / OL_EVENTS), "append": True}
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "tpu-rl-e2e",
    }


@pytest.fixture(scope="module")
def fault_run(world: E2EWorld, happy: DagRunResult) -> Callable[[str], DagRunResult]:
    """``fault_run(kind)``: the run with a permanent ``kind`` fault (run once per module).

    The destroy fault's run is exactly ``happy``'s conf again (no run_name: the default), so it is
    also the second default run: a run of its own on the same cluster name and bucket.
    """
    done: dict[str, DagRunResult] = {}

    def run(kind: str) -> DagRunResult:
        if kind not in done:
            if kind == "destroy":
                run_conf = happy.conf
            else:
                extra = {"train_overrides": MID_WAY_CHECKPOINTS} if kind == "train" else {}
                run_conf = conf(f"f-{kind}", **extra)
            done[kind] = world.run_dag(GKE_DAG_ID, run_conf, faults=kind)
        return done[kind]

    return run


@pytest.fixture(scope="module")
def transient(world: E2EWorld) -> DagRunResult:
    """Deploy, conversion, training, export and destroy each fail once, transiently, in one run;
    its model's reward cannot gain ``min_reward_gain`` (1000): the gate holds it back. It is the
    rehearsal (qwen3-0.6b on a v6e-16): every step of a real run, end to end. Its TPU node pool
    streams the training image (``image_repository``: the image copied into the project's own
    Artifact Registry repository first)."""
    return world.run_dag(
        GKE_DAG_ID,
        conf(
            "t-work",
            model=REHEARSAL_MODEL,
            train_overrides=MID_WAY_CHECKPOINTS,
            min_reward_gain=NOT_PROMOTED_GAIN,
            image_repository=IMAGE_REPOSITORY,
        ),
        faults=TRANSIENT_FAULTS,
    )


@pytest.fixture(scope="module")
def all_runs(
    happy: DagRunResult, fault_run: Callable[[str], DagRunResult], transient: DagRunResult
) -> list[DagRunResult]:
    """Every scenario of this module (the ledger tests look at all of them)."""
    return [happy, *(fault_run(kind) for kind in PERMANENT_FAULTS), transient]


# =================================================================================== tests
def test_pipeline_succeeds_with_one_cluster_lifecycle(world: E2EWorld, happy: DagRunResult) -> None:
    assert happy.exit_code == 0, happy.describe()
    assert happy.state == "success", happy.describe()
    failed = {t: r.state for t, r in happy.tasks.items() if t != "watcher" and r.state != "success"}
    # only the other presets' asset tasks skip (this run trained qwen3-30b-a3b)
    assert failed == {
        "publish_gemma4-26b": "skipped",
        "publish_converted_gemma4-26b": "skipped",
        "publish_qwen3-0_6b": "skipped",
        "publish_converted_qwen3-0_6b": "skipped",
    }, happy.describe()
    assert happy.task_state("watcher") == "skipped"
    # the cluster without its TPU node pool, then the pool alone; the pool's destroy, then the rest
    deploys = [c.argv[-1] for c in happy.calls_of("gcluster", "deploy")]
    assert deploys == ["--skip=tpu", "--only=tpu"], happy.describe()
    destroys = [c.argv[-1] for c in happy.calls_of("gcluster", "destroy")]
    assert destroys == ["--only=tpu", "--robust"], happy.describe()
    spec = spec_of(happy)
    assert happy.submitted_jobs() == [spec.convert_job, spec.train_job, spec.export_job]
    assert duplicates(happy.submitted_jobs()) == []
    # Each job's trigger closed its Kubernetes and GCS sessions (`dags test` never closes it).
    assert "Unclosed client session" not in happy.output
    assert spec.cluster.cluster_name not in world.live_clusters()
    # only training asks for the TPU slice; the conversions run on the CPU node pool
    shapes = {
        str(call.flag("name")): (
            call.flag("compute-type"),
            call.flag("topology"),
            call.flag("node-constraint"),
        )
        for call in happy.calls_of("gcluster", "job", "submit")
    }
    cpu_np = ("n4-standard-64", None, "cloud.google.com/gke-nodepool=cpu-np")
    assert shapes == {
        spec.convert_job: cpu_np,
        spec.train_job: ("ct6e-standard-4t", "4x8", None),
        spec.export_job: cpu_np,
    }


def test_the_runs_secret_grants_go_with_its_cluster(happy: DagRunResult) -> None:
    """Issue 54 item 3: the token task gave the cluster's two service accounts secretAccessor on the
    HF token secret (held by the cluster, in its resource record); the cluster's destroy took both
    back, each once it was removed from the record."""
    spec = spec_of(happy)
    readers = {spec.cluster.workload_service_account, spec.cluster.node_pool_service_account}

    def members(verb: str) -> list[str]:
        calls = [c for c in happy.calls if c.is_("gcloud", "secrets", f"{verb}-iam-policy-binding")]
        assert all(c.exit_code == 0 for c in calls), verb
        return [str(c.flag("member")).split(":", 1)[-1] for c in calls]

    assert set(members("add")) == readers
    assert sorted(members("remove")) == sorted(readers)


def test_pipeline_exports_a_complete_hugging_face_model(world: E2EWorld, happy: DagRunResult) -> None:
    spec = spec_of(happy)
    assert happy.state == "success", happy.describe()
    assert world.hf_export_problems(spec.export.output_directory) == []
    # The export came from the final actor checkpoint, which is committed and kept.
    assert "commit_success.txt" in world.objects(step_dir(spec, NUM_BATCHES))


def test_a_second_default_run_trains_its_own_model_and_skips_conversion(
    world: E2EWorld, happy: DagRunResult, fault_run: Callable[[str], DagRunResult]
) -> None:
    """The destroy fault's run: ``happy``'s conf again, up to its (failing) teardown."""
    second = fault_run("destroy")
    assert second.conf == happy.conf
    converted = spec_of(happy).conversion.output_directory
    submitted = second.submitted_jobs()
    assert [name for name in submitted if "-hf-to-mt-" in name] == [], second.describe()
    assert second.task_state("convert_to_maxtext") == "success"
    # The new run still trained and exported its own checkpoint, into its own folder.
    spec = spec_of(second)
    assert submitted == [spec.train_job, spec.export_job], second.describe()
    assert {second.task_state(task) for task in ("train", "export_to_huggingface")} == {"success"}
    assert spec.training.run_name != spec_of(happy).training.run_name
    assert spec.export.output_directory != spec_of(happy).export.output_directory
    assert world.hf_export_problems(spec.export.output_directory) == []
    assert "commit_success.txt" in world.objects(converted.rstrip("/") + "/0")
    assert [c.argv[-1] for c in second.calls_of("gcluster", "deploy")] == ["--skip=tpu", "--only=tpu"]


# How long after the actor checkpoint's commit the TPU node pool may still exist: the sensor's
# trigger sees the commit, then the destroy task starts and runs gcluster (seconds in the sandbox on
# a quiet machine; a bound, not a timing goal: the order of the calls below is what the run promises).
TPU_POOL_EPSILON_S = 300.0
TPU_POOL = "gke-tpu-v6e-pool"


def test_the_tpu_node_pool_exists_only_while_training_needs_it(world: E2EWorld, happy: DagRunResult) -> None:
    """The TPU capacity is created after the converted checkpoint is committed and deleted within
    a few seconds of the actor checkpoint's commit: the conversion and the export run without it."""
    spec = spec_of(happy)
    # the cluster name is used again by the second default run: this run's pool is the one its
    # own `deploy --only=tpu` created
    (deploy,) = [c for c in happy.calls_of("gcluster", "deploy") if c.argv[-1] == "--only=tpu"]
    created, deleted = next(
        life
        for life in world.node_pool_lifetimes(spec.cluster.cluster_name, TPU_POOL)
        if life[0] >= deploy.start
    )
    assert deleted is not None, happy.describe()
    converted = world.written_at(f"{spec.conversion.output_directory.rstrip('/')}/0/commit_success.txt")
    trained = world.written_at(f"{step_dir(spec, NUM_BATCHES)}/commit_success.txt")
    assert converted <= created, (converted, created)
    assert deleted <= trained + TPU_POOL_EPSILON_S, (trained, deleted)
    # the cluster's CPU pool (conversion, export) lived across the whole run, longer than the TPU
    cpu_life = next(
        life for life in world.node_pool_lifetimes(spec.cluster.cluster_name, "cpu-np") if life[0] <= created
    )
    assert cpu_life[0] < created
    assert cpu_life[1] is not None
    assert deleted < cpu_life[1]
    # the export job was submitted once no TPU node pool existed any more
    (export,) = [c for c in happy.calls_of("gcluster", "job", "submit") if c.flag("name") == spec.export_job]
    assert export.start >= deleted, happy.describe()
    (train,) = [c for c in happy.calls_of("gcluster", "job", "submit") if c.flag("name") == spec.train_job]
    assert created <= train.start


@pytest.mark.parametrize("kind", PERMANENT_FAULTS)
def test_permanent_fault_fails_the_run_tears_down_and_keeps_outputs(
    world: E2EWorld, happy: DagRunResult, fault_run: Callable[[str], DagRunResult], kind: str
) -> None:
    result = fault_run(kind)
    spec = spec_of(result)
    cluster = spec.cluster.cluster_name
    assert result.exit_code == 1, result.describe()
    assert result.state == "failed", result.describe()
    assert result.task_state(FAILING_TASK[kind]) == "failed", result.describe()
    assert result.task_state("watcher") == "failed"
    assert result.task_state("record_run") == "success"
    # The TPU node pool's own teardown ran and removed it (also after the failed training).
    assert result.task_state("destroy_tpu_pool") == "success", result.describe()
    lives = world.node_pool_lifetimes(cluster, TPU_POOL)
    assert lives, result.describe()
    assert all(deleted is not None for _, deleted in lives), result.describe()

    # The teardown ran.
    destroys = result.calls_of("gcluster", "destroy")
    assert destroys, result.describe()
    if kind == "destroy":
        # The one case where the cluster survives: the run is failed and says so. (Its TPU node
        # pool went with its own destroy: the fault is the network's.)
        assert [c.exit_code == 0 for c in destroys if c.argv[-1] == "--only=tpu"] == [True], result.describe()
        assert all(c.exit_code != 0 for c in destroys if c.argv[-1] != "--only=tpu"), result.describe()
        assert cluster in world.live_clusters()
        # The destroy task's error names the cluster that is left, and the watcher repeats it in
        # one line, without a traceback.
        assert any(f"destroy GKE cluster {cluster} " in message for message in result.raised()), (
            result.describe()
        )
        watcher_log = result.task_log("watcher")
        assert f"1 task failed: destroy_cluster: destroy GKE cluster {cluster} " in watcher_log, watcher_log
        assert "Traceback" not in watcher_log
        # record_run ran after the failed teardown and recorded the run as failed
        assert "XCom not found" not in result.task_log("record_run")
        (ledger_state,) = world.ledger(
            "SELECT state FROM run_steps WHERE run_id = ? AND task_id = 'destroy_cluster'",
            (result.ledger_run_id,),
        )[0]
        assert ledger_state == "failed"
        # The janitor's record of the cluster is still there for it to find and destroy.
        assert world.exists(f"gs://{spec.cluster.bucket}/{resource_record_object(cluster)}")
    else:
        assert destroys[-1].exit_code == 0, result.describe()
        assert cluster not in world.live_clusters(), result.describe()

    # Nothing a completed step wrote was deleted; the bucket itself is kept.
    assert world.bucket_exists(spec.cluster.bucket)
    reference = spec_of(happy)
    reached_train = kind in ("train", "destroy")
    if reached_train:
        expected = world.objects(reference.conversion.output_directory)
        assert "0/commit_success.txt" in expected
        assert world.objects(spec.conversion.output_directory) == expected
    if kind == "train":
        # The mid-way checkpoint written before the job failed.
        assert world.objects(step_dir(spec, 2)) == world.objects(step_dir(reference, NUM_BATCHES))
        # The workload's own error (out of memory on a fixed config): submitted once, not retried,
        # and the run's one line quotes it.
        assert result.submitted_jobs().count(spec.train_job) == 1, result.describe()
        assert result.tasks["train"].try_number == 1, result.describe()
        assert any(
            f"job {spec.train_job} failed: jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED" in message
            for message in result.raised()
        ), result.describe()
    if kind == "destroy":
        assert world.objects(step_dir(spec, NUM_BATCHES)) == world.objects(step_dir(reference, NUM_BATCHES))
    if kind == "destroy":
        assert world.hf_export_problems(spec.export.output_directory) == []


def test_transient_faults_are_retried_and_the_run_succeeds(world: E2EWorld, transient: DagRunResult) -> None:
    assert transient.exit_code == 0, transient.describe()
    assert transient.state == "success", transient.describe()
    assert world.fired_faults() == set(TRANSIENT_KINDS), transient.describe()
    # deploy and train (a Pathways job with --restarts=0) recover by an Airflow retry; the
    # conversions may already recover inside the job (a JobSet restart) — either way, succeed.
    # the stockout hits the TPU node pool's creation, in its own task
    assert transient.tasks["deploy_cluster"].try_number == 1, transient.describe()
    assert transient.tasks["deploy_tpu_pool"].try_number == 2, transient.describe()
    assert transient.tasks["train"].try_number == 2, transient.describe()
    deploys = transient.calls_of("gcluster", "deploy")
    assert [c.exit_code != 0 for c in deploys] == [False, True, False], transient.describe()
    assert_no_duplicate_submits(transient)
    # the rehearsal: qwen3-0.6b, trained on a v6e-16 (4x4 of ct6e-standard-4t)
    rehearsal = spec_of(transient)
    assert (rehearsal.preset.model_name, rehearsal.cluster.topology) == (REHEARSAL_MODEL, "4x4")
    submits = [" ".join(c.argv) for c in transient.calls_of("gcluster", "job", "submit")]
    assert any("--topology=4x4" in s and f"model_name={REHEARSAL_MODEL}" in s for s in submits), submits
    spec = spec_of(transient)
    assert sorted(set(transient.submitted_jobs())) == sorted(
        [spec.convert_job, spec.train_job, spec.export_job]
    )
    # Training resumed from the mid-way checkpoint and reached the last step.
    assert "commit_success.txt" in world.objects(step_dir(spec, 2))
    assert "commit_success.txt" in world.objects(step_dir(spec, NUM_BATCHES))
    # The transient destroy: `gcluster destroy --robust` retries inside one call (without it the
    # task retry would do it).
    destroys = transient.calls_of("gcluster", "destroy")
    assert all("--robust" in c.argv for c in destroys), transient.describe()
    assert destroys[-1].exit_code == 0, transient.describe()
    assert spec.cluster.cluster_name not in world.live_clusters()
    assert world.hf_export_problems(spec.export.output_directory) == []
    # the gate held its model back: skipped, and the run is still a success
    assert transient.task_state("promote_model") == "skipped", transient.describe()


def test_a_streaming_run_copies_the_image_once_and_its_pool_streams_the_copy(
    world: E2EWorld, happy: DagRunResult, transient: DagRunResult
) -> None:
    """``image_repository`` (the transient run): the image copied once, by digest, into the
    project's repository; training runs the copy; the pool has ``enable_gcfs`` and streams it.
    The happy run (no ``image_repository``): no copy, the pool pulls the image whole."""
    spec = spec_of(transient)
    creates = transient.calls_of("gcloud", "artifacts", "repositories", "create")
    copies = transient.calls_of("gcloud", "container", "images", "add-tag")
    assert [c.argv[3] for c in creates] == [IMAGE_REPOSITORY], transient.describe()
    assert [c.exit_code for c in copies] == [0], transient.describe()
    digest = REGISTRY_IMAGES[spec.image]
    copy = image_stream.streamed_image(PROJECT, spec.cluster.region, IMAGE_REPOSITORY, spec.image, digest)
    assert copies[0].argv[3] == f"{boot_image.repository(spec.image)}@{digest}", transient.describe()
    trains = [c for c in transient.calls_of("gcluster", "job", "submit") if c.flag("name") == spec.train_job]
    assert trains, transient.describe()
    assert {c.flag("image") for c in trains} == {copy}, transient.describe()
    pulls = StateStore(world.layout).read("image_pulls")["pulls"]

    def pulls_of(result: DagRunResult) -> list[tuple[str, bool, bool, float]]:
        cluster = spec_of(result).cluster.cluster_name
        return [
            (p["image"], p["enable_gcfs"], p["streamed"], p["real_minutes"])
            for p in pulls
            if p["cluster_key"].rsplit("/", 1)[-1] == cluster
        ]

    # the streamed pull is the sandbox's estimate, shorter than the whole pull's
    assert set(pulls_of(transient)) == {(copy, True, True, STREAMED_PULL_MINUTES)}, pulls
    assert STREAMED_PULL_MINUTES < PULL_MINUTES
    assert set(pulls_of(happy)) == {(spec_of(happy).image, False, False, PULL_MINUTES)}, pulls
    assert happy.calls_of("gcloud", "container", "images", "add-tag") == [], happy.describe()
    assert happy.task_state("copy_workload_image") == "success", happy.describe()


def test_the_promotion_gate_says_its_line_in_the_ledger(
    world: E2EWorld, happy: DagRunResult, transient: DagRunResult
) -> None:
    promotion = dict(world.ledger("SELECT run_id, promotion FROM runs WHERE dag_id = ?", (GKE_DAG_ID,)))
    assert happy.task_state("promote_model") == "success"
    assert promotion[happy.ledger_run_id].startswith(
        "promoted: no gate (min_reward_gain not set); mean reward "
    )
    assert promotion[transient.ledger_run_id].startswith("not promoted: reward gain ")
    assert f"< min_reward_gain {NOT_PROMOTED_GAIN}" in promotion[transient.ledger_run_id]


def test_a_promoted_model_is_an_asset_event_with_its_card_beside_the_export(
    world: E2EWorld, happy: DagRunResult, transient: DagRunResult
) -> None:
    spec = spec_of(happy)
    export = spec.export.output_directory
    events = world.asset_events("tpu-rl://models/qwen3-30b-a3b")
    mine = [extra for dag, run, extra in events if (dag, run) == (GKE_DAG_ID, happy.run_id)]
    assert len(mine) == 1, (events, happy.describe())
    extra = mine[0]
    printed = rewards_the_sandbox_printed(world, happy)
    (billed, trained, cost) = world.ledger(
        "SELECT chip_hours, busy_chip_hours, estimated_cost_usd FROM runs WHERE run_id = ?",
        (happy.ledger_run_id,),
    )[0]
    assert extra["run_id"] == happy.ledger_run_id
    assert extra["run_name"] == spec.training.run_name
    assert extra["model"] == "qwen3-30b-a3b"
    assert extra["export_uri"] == export
    assert extra["model_card_uri"] == export + "README.md"
    assert extra["base_model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert extra["dataset"] == "nvidia/OpenMathInstruct-2"
    assert (extra["pre_mean_reward"], extra["post_mean_reward"]) == pytest.approx(
        (printed["pre"], printed["post"])
    )
    assert extra["steps"] == NUM_BATCHES
    assert extra["tpu_chip_hours_billed"] == pytest.approx(billed)
    assert extra["tpu_chip_hours_trained"] == pytest.approx(trained)
    assert extra["estimated_cost_usd"] == pytest.approx(cost)
    assert extra["maxtext_release"] == "0.2.4"
    assert extra["image"] == spec.image
    assert "image_digest" in extra
    assert happy.task_state("publish_qwen3-30b-a3b") == "success"
    assert happy.task_state("publish_gemma4-26b") == "skipped"  # not this run's model: no event
    assert world.asset_events("tpu-rl://models/gemma4-26b") == []
    # the model the gate held back: its publish skipped, no event; its export still has its card
    assert [run for _, run, _ in events if run == transient.run_id] == []
    assert transient.task_state("publish_qwen3-0_6b") == "skipped"  # the held-back rehearsal
    assert world.asset_events("tpu-rl://models/qwen3-0.6b") == []
    for run, base in ((happy, "Qwen/Qwen3-30B-A3B-Instruct-2507"), (transient, "Qwen/Qwen3-0.6B")):
        card = world.model_card(spec_of(run).export.output_directory)
        meta = parse_front_matter(card)
        assert meta["base_model"] == base
        assert meta["datasets"] == ["nvidia/OpenMathInstruct-2"]
        assert run.ledger_run_id in card
        assert len(meta["model-index"][0]["results"][0]["metrics"]) == 2  # the rewards before and after
    assert "not promoted" in world.model_card(spec_of(transient).export.output_directory)


def test_a_committed_conversion_is_an_asset_event(world: E2EWorld, happy: DagRunResult) -> None:
    """publish_converted_<preset> emits the run's preset's converted checkpoint once its commit is
    verified; the other preset's task skips."""
    spec = spec_of(happy)
    events = world.asset_events("tpu-rl://converted-checkpoints/qwen3-30b-a3b")
    mine = [extra for dag, run, extra in events if (dag, run) == (GKE_DAG_ID, happy.run_id)]
    assert len(mine) == 1, (events, happy.describe())
    extra = mine[0]
    assert extra["run_id"] == happy.ledger_run_id
    assert extra["checkpoint_uri"] == spec.conversion.output_directory.rstrip("/") + "/"
    assert extra["job_name"] == spec.convert_job
    assert extra["reused"] is False
    assert extra["base_model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert extra["maxtext_release"] == "0.2.4"
    assert happy.task_state("publish_converted_qwen3-30b-a3b") == "success"
    assert happy.task_state("publish_converted_gemma4-26b") == "skipped"
    assert world.asset_events("tpu-rl://converted-checkpoints/gemma4-26b") == []


def test_openlineage_events_name_what_each_maxtext_job_read_and_wrote(
    world: E2EWorld, happy: DagRunResult
) -> None:
    """With the OpenLineage provider on (file transport), the run's COMPLETE events of conversion,
    training and export carry their inputs and outputs, named as the OpenLineage spec names GCS and
    the Hub; no facet holds the Hugging Face token."""
    text = (world.root / OL_EVENTS).read_text()
    assert HF_SANDBOX_TOKEN not in text
    complete = {}
    for line in text.splitlines():
        event = json.loads(line)
        if event["eventType"] == "COMPLETE":
            complete[event["job"]["name"]] = event
    spec = spec_of(happy)
    bucket = "gs://" + spec.cluster.bucket

    def io(task_id: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        event = complete[f"{GKE_DAG_ID}.{task_id}"]
        return (
            {(d["namespace"], d["name"]) for d in event["inputs"]},
            {(d["namespace"], d["name"]) for d in event["outputs"]},
        )

    def folder(uri: str) -> tuple[str, str]:
        return bucket, uri.removeprefix(bucket + "/").rstrip("/")

    converted = folder(spec.conversion.output_directory)
    assert io("convert_to_maxtext") == (
        {("https://huggingface.co", "Qwen/Qwen3-30B-A3B-Instruct-2507")},
        {converted},
    ), sorted(complete)
    train_in, train_out = io("train")
    assert folder(spec.training.load_parameters_path) in train_in
    assert ("https://huggingface.co", "datasets/nvidia/OpenMathInstruct-2") in train_in
    assert train_out == {
        folder(f"{spec.training.base_output_directory.rstrip('/')}/{spec.training.run_name}")
    }
    assert io("export_to_huggingface") == (
        {folder(spec.export.load_parameters_path)},
        {folder(spec.export.output_directory)},
    )
    assert "sourceCode" in complete[f"{GKE_DAG_ID}.convert_to_maxtext"]["job"]["facets"]


CONSUMER_DAG_ID = "tpu_rl_model_consumer_example"


def test_the_downstream_example_dag_is_queued_by_the_event_and_checks_the_export(
    world: E2EWorld, happy: DagRunResult, transient: DagRunResult
) -> None:
    """Both module runs are done: one promoted model's event queued the example DAG; its run checks
    the export and its card and says so in one line."""
    runs, output = world.run_downstream(CONSUMER_DAG_ID, "check_model")
    assert [run_type for _, run_type in runs] in (["asset_triggered"], ["dataset_triggered"]), output
    assert "rc=0" in output, output
    export = spec_of(happy).export.output_directory
    assert f"new model qwen3-30b-a3b from {happy.ledger_run_id}: mean reward " in output
    assert f"export {export} (" in output
    assert "model card README.md" in output


def rewards_the_sandbox_printed(world: E2EWorld, run: DagRunResult) -> dict[str, float]:
    """Pre/post mean_reward from the simulated training pod's own log (not the Airflow task log)."""
    actor_root = spec_of(run).training.actor_checkpoint_root  # this run's own run directory
    train_logs = [
        text for text in world.sandbox_job_logs() if "Pre RL Training" in text and actor_root in text
    ]
    assert len(train_logs) == 1
    return printed_rewards(train_logs[0])


def test_ledger_records_the_rewards_the_sandbox_printed(world: E2EWorld, happy: DagRunResult) -> None:
    printed = rewards_the_sandbox_printed(world, happy)
    assert set(printed) == {"pre", "post"}
    recorded = dict(
        world.ledger(
            "SELECT phase, metric_value FROM run_metrics WHERE run_id = ? AND metric_name = 'mean_reward' "
            "AND phase IN ('pre', 'post')",
            (happy.ledger_run_id,),
        )
    )
    assert recorded == pytest.approx(printed, abs=1e-9)
    # ... and the evaluation's size, the preset's default (what a missing reward is explained by).
    assert world.ledger(
        "SELECT metric_value FROM run_metrics WHERE run_id = ? AND phase = 'train' "
        "AND metric_name = 'num_test_batches'",
        (happy.ledger_run_id,),
    ) == [(2.0,)]


def test_ledger_records_durations_and_chip_hours(world: E2EWorld, happy: DagRunResult) -> None:
    """Every task that ran has a duration, and the run its chip-hours (the cluster's lifetime x 32
    chips) and those that trained, on Airflow 2.11 too, whose ``airflow dags test`` sets no task
    ``start_date``."""
    ((duration, chips, chip_hours, cluster_started, cluster_ended),) = world.ledger(
        "SELECT duration_seconds, chips, chip_hours, cluster_started_at, cluster_ended_at FROM runs "
        "WHERE run_id = ?",
        (happy.ledger_run_id,),
    )
    assert duration is not None
    assert duration > 0
    assert chips == 32
    assert cluster_started is not None
    assert cluster_ended is not None
    assert chip_hours is not None
    assert chip_hours > 0
    # the TPU time that trained: the training JobSet's span, inside the billed span, costed
    ((train_started, train_ended, busy, price, cost),) = world.ledger(
        "SELECT train_started_at, train_ended_at, busy_chip_hours, usd_per_chip_hour, estimated_cost_usd "
        "FROM runs WHERE run_id = ?",
        (happy.ledger_run_id,),
    )
    span = [as_utc(when) for when in (cluster_started, train_started, train_ended, cluster_ended)]
    assert span == sorted(span)
    assert 0 < busy < chip_hours
    assert busy == pytest.approx(32 * (span[2] - span[1]).total_seconds() / 3600)
    assert (price, cost) == (2.70, pytest.approx(chip_hours * 2.70))
    # billed by the TPU node VMs' own clocks (each at least a minute), inside the capacity held
    ((billed_seconds, spans_json, held),) = world.ledger(
        "SELECT billed_chip_seconds, billed_spans_json, held_chip_hours FROM runs WHERE run_id = ?",
        (happy.ledger_run_id,),
    )
    spans = spans_from_json(json.loads(spans_json))
    assert spans is not None
    assert (len(spans), {s.chips for s in spans}, {s.ended_by for s in spans}) == (8, {4}, {"delete"})
    assert all(span[0] <= s.started_at and s.ended_at and s.ended_at <= span[3] for s in spans)
    assert chip_hours == pytest.approx(billed_seconds / 3600)
    assert held == pytest.approx(32 * (span[3] - span[0]).total_seconds() / 3600)
    steps = {
        task_id: (state, seconds)
        for task_id, state, seconds in world.ledger(
            "SELECT task_id, state, duration_seconds FROM run_steps WHERE run_id = ?", (happy.ledger_run_id,)
        )
    }
    ran = {task_id for task_id, task in happy.tasks.items() if task.state == "success"}
    assert {"deploy_cluster", "train", "export_to_huggingface", "destroy_cluster"} <= ran
    missing = sorted(task_id for task_id in ran if steps.get(task_id, (None, None))[1] is None)
    assert not missing, f"no duration recorded for {missing}: {steps}"
    assert all(seconds >= 0 for _, seconds in steps.values() if seconds is not None), steps


def test_ledger_holds_one_row_per_dag_run_with_its_state(
    world: E2EWorld, all_runs: list[DagRunResult]
) -> None:
    dag_runs = {
        f"{GKE_DAG_ID}/{run_id}": state
        for run_id, state in world.metadata(
            "SELECT run_id, state FROM dag_run WHERE dag_id = ?", (GKE_DAG_ID,)
        )
    }
    assert len(dag_runs) == len(all_runs)
    ledger_rows = world.ledger("SELECT run_id, state FROM runs WHERE dag_id = ?", (GKE_DAG_ID,))
    assert len(ledger_rows) == len(dag_runs)  # the retried transient run included: one row, not two
    assert dict(ledger_rows) == dag_runs
    assert {run.ledger_run_id: run.state for run in all_runs} == dag_runs


def test_ledger_artifacts_exist_in_the_emulator(world: E2EWorld, all_runs: list[DagRunResult]) -> None:
    happy = all_runs[0]
    kinds = {
        kind
        for (kind,) in world.ledger("SELECT kind FROM run_artifacts WHERE run_id = ?", (happy.ledger_run_id,))
    }
    assert kinds == {"converted_checkpoint", "actor_checkpoint", "hf_export", "curves", "model_card"}
    artifacts = world.ledger("SELECT run_id, kind, uri FROM run_artifacts")
    # A folder (checkpoints, the export) has objects under it; the curves PNG is one object.
    missing = [
        (run_id, kind, uri)
        for run_id, kind, uri in artifacts
        if not (world.exists(uri) if kind in ("curves", "model_card") else world.objects(uri))
    ]
    assert missing == []


def test_no_cluster_is_left_behind_silently(
    world: E2EWorld, all_runs: list[DagRunResult], fault_run: Callable[[str], DagRunResult]
) -> None:
    """Every cluster still alive belongs to a failed run whose destroy_cluster failed (reported)."""
    reported = {
        spec_of(run).cluster.cluster_name
        for run in all_runs
        if run.state == "failed" and run.tasks["destroy_cluster"].state == "failed"
    }
    assert spec_of(fault_run("destroy")).cluster.cluster_name in world.live_clusters()
    assert world.live_clusters() <= reported


def test_tpu_rl_runs_lists_every_run_with_its_state(world: E2EWorld, all_runs: list[DagRunResult]) -> None:
    listed = world.tpu_rl("runs", "--limit", "50")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    # The table's header (an info log line about the default ledger file may come first).
    assert any(line.split()[:3] == ["RUN", "MODEL", "STATE"] for line in lines), listed.stdout
    for run in all_runs:
        (line,) = [line for line in lines if line.startswith(run.ledger_run_id + " ")]
        assert line.split()[1:3] == [spec_of(run).preset.model_name, run.state], line
    happy = all_runs[0]
    (happy_line,) = [line for line in lines if line.startswith(happy.ledger_run_id + " ")]
    printed = rewards_the_sandbox_printed(world, happy)
    assert f"{printed['pre']:.2f}→{printed['post']:.2f}" in happy_line
    assert "yes" in happy_line.split()  # PROMOTED
    assert happy_line.endswith(spec_of(happy).export.output_directory)
    (held_line,) = [line for line in lines if line.startswith(all_runs[-1].ledger_run_id + " ")]
    assert " not promoted " in held_line


def test_record_run_puts_the_ledgers_curves_next_to_the_checkpoints(
    world: E2EWorld, happy: DagRunResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_curves_next_to_the_checkpoints(world, happy, monkeypatch)


def test_runs_plot_draws_the_trend_of_the_ledger(world: E2EWorld, happy: DagRunResult) -> None:
    check_runs_plot_draws_the_trend(world, happy)
