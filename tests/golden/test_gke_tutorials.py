"""Golden tests: the plan for a tutorial's own settings carries every flag and MaxText key=value of
the tutorial's commands with the same value, except the differences docs/tutorial-differences.md documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tpu_rl_sandbox
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH, BlueprintError, customize_blueprint
from airflow_provider_tpu_rl.render.plan import gke_plan
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.spec.presets import OPENMATH_DATASET, POST_TRAINING_IMAGE, PRESETS
from airflow_provider_tpu_rl.spec.workloads import DEFAULT_CHECKPOINT_PERIOD
from tests.golden.shellwords import commands, flags, module_args, python_c_snippets

# The sandbox's stand-in bundle mirrors the pinned release's example folder.
SANDBOX_BUNDLE = Path(tpu_rl_sandbox.__file__).parent / "bundle"
SUBMIT_BOOLS = {"--pathways", "--await-job-completion"}
DATASET_KEYS = {k for k, _ in OPENMATH_DATASET}

CASES = {
    "qwen": {
        "model": "qwen3-30b-a3b",
        "prefix": "qwen",
        "jobs": ("qwen-hf-to-mt", "qwen-rl", "qwen-mt-to-hf"),
    },
    "gemma": {
        "model": "gemma4-26b",
        "prefix": "gemma",
        "jobs": ("gemma4-hf-to-mt", "gemma4-training", "gemma4-mt-to-hf"),
    },
}


def _values(model: str) -> dict[str, str]:
    return {
        "PROJECT": "tpu-proj-123",
        "REGION": "us-east5",
        "ZONE": "us-east5-b",
        "CLUSTER_NAME": "rl-cluster",
        "GCS_BUCKET": "rl-bucket-1",
        "CLOUD_IMAGE_NAME": POST_TRAINING_IMAGE,
        "COMPUTE_TYPE": "ct6e-standard-4t",
        "TOPOLOGY": "4x8",
        "CLUSTER_NODEPOOL_COUNT": "1",
        "RESERVATION": "v6e-res",
        "MODEL_NAME": model,
        "HF_TOKEN": "hf_tutorial_token",
        "BLUEPRINT_FILE": "/tmp/x/gke-tpu-v6e-advanced.yaml",
    }


def _pipeline(model: str):
    v = _values(model)
    return gke_pipeline_from_conf(
        {
            "model": model,
            "project": v["PROJECT"],
            "region": v["REGION"],
            "zone": v["ZONE"],
            "cluster_name": v["CLUSTER_NAME"],
            "bucket": v["GCS_BUCKET"],
            "reservation": v["RESERVATION"],
            # The tutorials' run_name (a pipeline run's default is unique per DAG run).
            "run_name": PRESETS[model].run_name,
        },
        run_id="scheduled__2026-11-30T00:00:00+00:00",
    )


def _submit(argv: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    argv = list(argv)
    start = argv.index("submit") + 1
    return flags(argv[start:], SUBMIT_BOOLS)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    ("stage", "module"),
    [
        ("convert", "maxtext.checkpoint_conversion.to_maxtext"),
        ("train", "maxtext.trainers.post_train.rl.train_rl"),
        ("export", "maxtext.checkpoint_conversion.to_huggingface"),
    ],
)
def test_job_matches_tutorial(case: str, stage: str, module: str) -> None:
    spec = CASES[case]
    pipeline = _pipeline(spec["model"])
    (tutorial,) = commands(f"{spec['prefix']}_{stage}.sh", _values(spec["model"]))
    task_id = {"convert": "convert_to_maxtext", "train": "train", "export": "export_to_huggingface"}[stage]
    rendered = [step.command for step in gke_plan(pipeline) if step.task_id == task_id][-1]
    want, got = _submit(tutorial), _submit(rendered.argv)

    # Job name: the tutorial's name plus a run suffix, at most 28 characters.
    tutorial_name = want.pop("--name")[0]
    assert got.pop("--name")[0].startswith(tutorial_name + "-")
    # Documented differences: waits are deferred instead of --await-job-completion; project,
    # cluster and location are flags instead of `gcluster job config set`.
    want.pop("--await-job-completion", None)
    assert got.pop("--project") == ["tpu-proj-123"]
    assert got.pop("--cluster") == ["rl-cluster"]
    assert got.pop("--location") == ["us-east5"]

    if stage != "train":
        # Documented difference: the conversions are CPU programs (MaxText's converters set
        # jax_platforms=cpu); they run on the CPU node pool, not on the slice the tutorials hold.
        assert want.pop("--compute-type") == ["ct6e-standard-4t"]
        assert want.pop("--topology") == ["4x8"]
        assert got.pop("--compute-type") == ["n4-standard-64"]
        assert got.pop("--node-constraint") == ["cloud.google.com/gke-nodepool=cpu-np"]
        assert got.pop("--service-account") == ["workload-identity-k8s-sa"]
        assert "--topology" not in got
    tutorial_command = want.pop("--command")[0]
    our_command = got.pop("--command")[0]
    for flag, values in want.items():
        assert sorted(got.get(flag, [])) == sorted(values), flag
    assert set(got) == set(want)

    want_args = module_args(tutorial_command, module)
    got_args = module_args(our_command, module)
    assert want_args.pop("hf_access_token") == "hf_tutorial_token"
    if stage == "export":
        # Documented difference: the export goes to a folder per run_name ("rl" here).
        assert want_args["base_output_directory"] == f"gs://rl-bucket-1/{spec['model']}/hf-trained/"
        want_args["base_output_directory"] += "rl/"
    if stage == "train" and case == "qwen":
        # Documented difference: the Qwen preset evaluates 2 test batches before and after training;
        # the tutorial's 0 evaluates nothing, so its run records no reward.
        assert want_args.pop("num_test_batches") == "0"
        assert got_args.pop("num_test_batches") == "2"
    if stage == "train":
        # Documented difference: a checkpoint every 10 steps (the tutorials keep rl.yml's 50: the
        # whole run, so a failure restarts at step 0).
        assert "checkpoint_period" not in want_args
        assert got_args.pop("checkpoint_period") == str(DEFAULT_CHECKPOINT_PERIOD)
    for key, value in want_args.items():
        assert got_args.get(key) == value, key
    extra = set(got_args) - set(want_args)
    assert extra == (DATASET_KEYS if stage == "train" else set())

    # The token is read in the pod from Secret Manager, never on the command line.
    assert "hf_access_token" not in our_command
    assert "hf_tutorial_token" not in our_command
    assert "HF_TOKEN=$(python3 -c" in our_command
    assert "projects/tpu-proj-123/secrets/tpu-rl-hf-token-huggingface_default/versions/latest" in our_command
    if stage == "train":
        assert python_c_snippets(tutorial_command) == [
            s for s in python_c_snippets(our_command) if "secretmanager" not in s
        ]
        assert "export VLLM_ENABLE_V1_MULTIPROCESSING=0" in our_command
        assert "export VLLM_HOST_IP=$(hostname -I | awk '{print $1}')" in our_command
        assert ("echo 190G > /sys/fs/cgroup/memory.max" in our_command) == (case == "qwen")
        assert "JAX_PLATFORMS=proxy,cpu ENABLE_PATHWAYS_PERSISTENCE=1 python3 -m" in our_command
    else:
        assert our_command.startswith('[ "$JOB_COMPLETION_INDEX" != "0" ] || { ')


def storage_admin_accounts(pipeline: Any) -> set[str]:
    """The service-account modules of the edited bundle blueprint that hold ``storage.admin``."""
    import yaml

    text = (SANDBOX_BUNDLE / BLUEPRINT_RELPATH).read_text()
    doc = yaml.safe_load(customize_blueprint(text, pipeline.cluster.blueprint))
    return {
        m["settings"]["name"]
        for g in doc["deployment_groups"]
        for m in g["modules"]
        if m.get("source") == "modules/project/service-account"
        and "storage.admin" in m["settings"].get("project_roles", [])
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_deploy_iam_and_destroy_match_tutorial(case: str) -> None:
    spec = CASES[case]
    pipeline = _pipeline(spec["model"])
    cluster = pipeline.cluster
    tutorial = commands(f"{spec['prefix']}_deploy.sh", _values(spec["model"]))
    bucket, deploy_cmd = tutorial[0], tutorial[1]

    assert list(gke.create_bucket(cluster.project, cluster.region, cluster.bucket).argv) == bucket

    ours = gke.deploy(cluster, "/tmp/w")
    deploy_flags = {"--auto-approve", "-w"}
    want = flags(deploy_cmd[3:], deploy_flags)
    got = flags(list(ours.argv[3:]), deploy_flags)
    want_vars = [v for item in want.pop("--vars") for v in item.split(",")]
    got_vars = [v for item in got.pop("--vars") for v in item.split(",")]
    assert sorted(got_vars) == sorted(want_vars)
    # Documented difference: Terraform state in the bucket, deployment folder under a work dir.
    assert got.pop("--backend-config") == ["bucket=rl-bucket-1"]
    assert got.pop("--out") == ["/tmp/w"]
    assert got == want
    assert ours.argv[2] == "/tmp/w/gke-tpu-v6e-advanced.yaml"

    if case == "qwen":
        # Documented difference: the tutorial's two configure-docker calls are one, with both
        # registries (gcloud takes a comma-separated REGISTRIES list).
        (auth,) = gke.docker_auth(cluster.region)
        prefix = ["gcloud", "auth", "configure-docker"]
        assert [c[:3] for c in tutorial[2:4]] == [prefix, prefix]
        assert all(c[4:] == ["--quiet"] for c in tutorial[2:4])
        assert list(auth.argv) == [*prefix, ",".join(c[3] for c in tutorial[2:4]), "--quiet"]
        # Documented difference: the tutorial's two project-level storage.admin grants are not
        # run (gcloud refuses them without --condition when the policy holds a conditional
        # binding); the blueprint's service-account modules hold that role instead.
        granted = {(c[4], c[5]) for c in tutorial[4:6]}
        assert granted == {
            (f"--member=serviceAccount:{a}", "--role=roles/storage.admin")
            for a in (cluster.workload_service_account, cluster.node_pool_service_account)
        }
        assert storage_admin_accounts(pipeline) == {"gke-wl-sa", "gke-np-sa"}
    destroy = gke.destroy(cluster, "/tmp/w").argv
    assert destroy[:2] == ("gcluster", "destroy")
    assert destroy[2] == "/tmp/w/rl-cluster"
    assert "--auto-approve" in destroy  # never prompt: a prompt without a TTY exits 1


BLUEPRINT = """
blueprint_name: gke-tpu-v6e
vars:
  project_id:
  deployment_name: gke-tpu-v6e
  tpu_topology:
  enable_pathways_for_tpus: true
  kueue_configuration_path: $(ghpc_stage("./kueue-configuration.yaml.tftpl"))
deployment_groups:
- group: primary
  modules:
  - id: node_pool_service_account
    source: modules/project/service-account
    settings:
      name: gke-np-sa
      project_roles:
      - logging.logWriter
      - monitoring.metricWriter
      - monitoring.viewer
      - stackdriver.resourceMetadata.writer
      - storage.objectViewer
      - artifactregistry.reader
  - id: gke-tpu-v6e-cluster
    source: modules/scheduler/gke-cluster
    settings:
      system_node_pool_machine_type: "n2-standard-8"
  - id: workload-manager-install
    source: modules/management/kubectl-apply
    use: [gke-tpu-v6e-cluster]
    settings:
      kueue:
        install: true
        config_path: $(vars.kueue_configuration_path)
        config_template_vars:
          tpu_quota: 32
          accelerator_type: tpu-v6e-slice
          namespace: default
"""


def test_kueue_gets_the_modules_pathways_queue_so_cpu_jobs_are_admitted() -> None:
    """The example's own Kueue config has TPU quota only; without config_path the kubectl-apply
    module applies its Pathways default (TPU quota plus cpu/memory on cpu-np)."""
    import yaml

    for text in (BLUEPRINT, (SANDBOX_BUNDLE / BLUEPRINT_RELPATH).read_text()):
        doc = yaml.safe_load(customize_blueprint(text, _pipeline("qwen3-30b-a3b").cluster.blueprint))
        (kubectl,) = [
            m
            for g in doc["deployment_groups"]
            for m in g["modules"]
            if m["source"] == "modules/management/kubectl-apply"
        ]
        kueue = kubectl["settings"]["kueue"]
        assert "config_path" not in kueue
        assert {"tpu_quota", "accelerator_type"} <= set(kueue["config_template_vars"])
        assert doc["vars"]["enable_pathways_for_tpus"] is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["vars"].update(enable_pathways_for_tpus=False), "enable_pathways_for_tpus"),
        (lambda d: d["deployment_groups"][0]["modules"].pop(), "kubectl-apply"),
        (
            lambda d: d["deployment_groups"][0]["modules"][-1]["settings"]["kueue"][
                "config_template_vars"
            ].pop("accelerator_type"),
            "accelerator_type",
        ),
    ],
)
def test_a_blueprint_without_a_cpu_queue_is_refused(change: Any, message: str) -> None:
    import yaml

    doc = yaml.safe_load(BLUEPRINT)
    change(doc)
    with pytest.raises(BlueprintError, match=message):
        customize_blueprint(yaml.safe_dump(doc), _pipeline("qwen3-30b-a3b").cluster.blueprint)


def test_qwen_blueprint_edit_matches_tutorial_roles() -> None:
    import yaml

    doc = yaml.safe_load(customize_blueprint(BLUEPRINT, _pipeline("qwen3-30b-a3b").cluster.blueprint))
    modules = {m["id"]: m for m in doc["deployment_groups"][0]["modules"]}
    assert modules["node_pool_service_account"]["settings"]["project_roles"] == [
        "logging.logWriter",
        "monitoring.metricWriter",
        "monitoring.viewer",
        "stackdriver.resourceMetadata.writer",
        "storage.admin",
        "artifactregistry.reader",
    ]
    cluster = modules["gke-tpu-v6e-cluster"]["settings"]
    assert cluster == {"system_node_pool_machine_type": "n2-standard-8"}


def test_gemma_blueprint_edits_match_tutorial_seds() -> None:
    import yaml

    labels = {"tpu-rl-managed": "true"}
    doc = yaml.safe_load(customize_blueprint(BLUEPRINT, _pipeline("gemma4-26b").cluster.blueprint, labels))
    modules = {m["id"]: m for m in doc["deployment_groups"][0]["modules"]}
    roles = modules["node_pool_service_account"]["settings"]["project_roles"]
    assert "storage.admin" in roles
    assert "storage.objectViewer" not in roles
    cluster = modules["gke-tpu-v6e-cluster"]["settings"]
    assert cluster["system_node_pool_machine_type"] == "e2-standard-8"
    assert cluster["system_node_pool_zones"] == ["$(vars.zone)"]
    assert doc["vars"]["labels"] == labels


@pytest.mark.parametrize("suffix", ["123e45", "000123", "1e5678", "abcdef"])
def test_label_values_are_quoted_for_a_yaml_1_2_reader(suffix: str) -> None:
    """gcluster (Go yaml.v3, YAML 1.2) reads a plain 123e45 as a float, and GCE refuses the label."""
    import yaml

    labels = {"tpu-rl-run": suffix, "tpu-rl-expires": "1767225600"}
    text = customize_blueprint(BLUEPRINT, _pipeline("gemma4-26b").cluster.blueprint, labels)
    for key, value in labels.items():
        assert f'{key}: "{value}"' in text
    doc = yaml.safe_load(text)
    assert {k: doc["vars"]["labels"][k] for k in labels} == labels


def test_a_run_without_a_reservation_binds_its_tpu_pool_to_none() -> None:
    """An empty reservation would leave the example's SPECIFIC_RESERVATION with an empty name, which
    gke-node-pool's precondition refuses: the pool consumes no reservation and no var names one."""
    import yaml

    reserved_run = _pipeline("qwen3-30b-a3b")
    conf = {"model": "qwen3-30b-a3b", "project": "my-proj-123", "bucket": "my-bkt", "reservation": ""}
    unreserved_run = gke_pipeline_from_conf(conf)
    assert "reservation=" not in " ".join(gke.deploy(unreserved_run.cluster, "/tmp/w").argv)
    assert "reservation=" in " ".join(gke.deploy(reserved_run.cluster, "/tmp/w").argv)

    text = (SANDBOX_BUNDLE / BLUEPRINT_RELPATH).read_text()

    def tpu_pool(blueprint_text: str, **kwargs: bool) -> dict[str, Any]:
        doc = yaml.safe_load(customize_blueprint(blueprint_text, unreserved_run.cluster.blueprint, **kwargs))
        (pool,) = [
            m["settings"]
            for g in doc["deployment_groups"]
            for m in g["modules"]
            if m["source"] == "modules/compute/gke-node-pool"
        ]
        return dict(pool)

    assert tpu_pool(text)["reservation_affinity"] == {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "specific_reservations": [{"name": "$(vars.reservation)"}],
    }
    assert tpu_pool(text, reservation=False)["reservation_affinity"] == {
        "consume_reservation_type": "NO_RESERVATION"
    }
    with pytest.raises(BlueprintError, match="reserved by"):
        tpu_pool(text.replace("$(vars.reservation)", "fixed-name"), reservation=False)
