"""Every validation rule rejects bad input with a message naming the field and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import (
    GKE_DAG_ID,
    SpecError,
    gke_pipeline_from_conf,
    job_name,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.spec.pipeline import job_suffix
from airflow_provider_tpu_rl.spec.workloads import TRAINING_NEEDS, TrainingNeed

BAD_GKE_CONF: list[tuple[dict[str, Any], str, str]] = [
    ({"cluster_name": "Qwen"}, "cluster_name", "lowercase letter"),
    ({"cluster_name": "1cluster"}, "cluster_name", "lowercase letter"),
    ({"cluster_name": "cluster-"}, "cluster_name", "not end with a hyphen"),
    ({"cluster_name": "a" * 21}, "cluster_name", "at most 20 characters"),
    ({"cluster_name": "my_cluster"}, "cluster_name", "lowercase letters, digits and hyphens"),
    ({"zone": "europe-west4-a"}, "zone", "inside region 'us-east5'"),
    ({"zone": "us-east5"}, "zone", "zone must look like"),
    ({"region": "US-EAST5"}, "region", "region must look like"),
    ({"project": "ab"}, "project", "6-30 lowercase letters"),
    ({"topology": "4x4x4"}, "topology", "topology must look like 4x8"),
    ({"topology": "3x5"}, "topology", "not a v6e slice shape"),
    ({"compute_type": "ct6e-standard-8t"}, "topology", "needs ct6e-standard-4t"),
    ({"compute_type": "ct5p-hightpu-4t"}, "compute_type", "must be one of"),
    ({"topology": "2x4"}, "topology", "needs a VM with 8 chips"),
    ({"num_slices": 0}, "num_slices", "between 1 and 64"),
    ({"num_slices": "2"}, "num_slices", "must be an integer"),
    ({"bucket": "gs://bucket"}, "bucket", "without 'gs://'"),
    ({"bucket": "ab"}, "bucket", "3-63 characters"),
    ({"bucket": "Bucket"}, "bucket", "only lowercase letters, digits, dots"),
    ({"bucket": "google-models"}, "bucket", "contain 'google'"),
    ({"bucket": "goog-models"}, "bucket", "start with 'goog'"),
    ({"bucket": "192.168.5.4"}, "bucket", "IP address"),
    ({"bucket": "a..b"}, "bucket", "'..'"),
    ({"bucket": "x" * 64}, "bucket", "3-63 characters"),
    ({"reservation": "Res_1"}, "reservation", "reservation name"),
    ({"authorized_cidr": "10.0.0.1/8"}, "authorized_cidr", "CIDR"),
    ({"authorized_cidr": "anywhere"}, "authorized_cidr", "CIDR"),
    ({"image": "not an image"}, "image", "container image"),
    ({"hf_model_path": "Qwen"}, "hf_model_path", "org/model"),
    ({"hf_model_path": "Qwen/x; rm -rf /"}, "hf_model_path", "org/model"),
    ({"run_name": "../etc"}, "run_name", "run name must be 1-63 letters"),
    ({"num_batches": 0}, "num_batches", ">= 1"),
    ({"num_batches": -5}, "num_batches", ">= 1"),
    ({"num_batches": 10**30}, "num_batches", "must be <= 10000000"),
    ({"num_batches": float("nan")}, "num_batches", "must be a finite number"),
    ({"max_cluster_hours": float("inf")}, "max_cluster_hours", "must be a finite number"),
    ({"max_cluster_hours": 10**30}, "max_cluster_hours", "between 1 and 336"),
    ({"compute_type": ["ct6e-standard-4t"]}, "compute_type", "must be a string"),
    ({"topology": {"x": 4}}, "topology", "must be a string"),
    ({"project": 123456}, "project", "must be a string"),
    ({"run_name": 5}, "run_name", "must be a string"),
    ({"num_batches": 2.5}, "num_batches", "must be an integer"),
    ({"model": "gpt-5"}, "model", "unknown model"),
    ({"model": "llama3.1-8b-Instruct"}, "model", "use the tpu_rl_tpu_vm_pipeline DAG"),
    ({"clustername": "x"}, "clustername", "unknown conf key"),
    ({"keep_cluster": "yes"}, "keep_cluster", "true or false"),
    ({"train_overrides": {"learning_rate": 0}}, "train_overrides.learning_rate", "must be > 0"),
    ({"train_overrides": {"learning_rate": "-1e-5"}}, "train_overrides.learning_rate", "must be > 0"),
    (
        {"train_overrides": {"trainer_devices_fraction": 1.5}},
        "train_overrides.trainer_devices_fraction",
        "(0, 1]",
    ),
    (
        {"train_overrides": {"sampler_devices_fraction": 0}},
        "train_overrides.sampler_devices_fraction",
        "(0, 1]",
    ),
    ({"train_overrides": {"num_batches": 0}}, "train_overrides.num_batches", "the `num_batches` param"),
    ({"train_overrides": {"num_batches": 60}}, "train_overrides.num_batches", "the `num_batches` param"),
    ({"train_overrides": {"run_name": "x"}}, "train_overrides.run_name", "the `run_name` param"),
    ({"train_overrides": {"model_name": "x"}}, "train_overrides.model_name", "the `model` param"),
    (
        {"train_overrides": {"load_parameters_path": "gs://x/y"}},
        "train_overrides.load_parameters_path",
        "cannot be overridden",
    ),
    (
        {"train_overrides": {"lerning_rate": 1e-5}},
        "train_overrides.lerning_rate",
        "not a MaxText config key (did you mean learning_rate?)",
    ),
    (
        {"train_overrides": {"no_such_key_at_all": 1}},
        "train_overrides.no_such_key_at_all",
        "not a MaxText config key",
    ),
    (
        {"train_overrides": {"rl.num_generationz": 4}},
        "train_overrides.rl.num_generationz",
        "not a key of MaxText's `rl` config (did you mean rl.num_generations?)",
    ),
    (
        {"train_overrides": {"nope.num_generations": 4}},
        "train_overrides.nope.num_generations",
        "not a MaxText config key",
    ),
    ({"train_overrides": {"learning_rate": float("nan")}}, "train_overrides.learning_rate", "finite"),
    ({"train_overrides": {"learning_rate": float("inf")}}, "train_overrides.learning_rate", "finite"),
    ({"train_overrides": {"learning_rate": 5}}, "train_overrides.learning_rate", "<= 1"),
    (
        {"train_overrides": {"vllm_hf_overrides": {"x": float("nan")}}},
        "train_overrides.vllm_hf_overrides",
        "finite",
    ),
    ({"train_overrides": {"batch_size": 10**30}}, "train_overrides.batch_size", "must be <= 65536"),
    ({"train_overrides": {"kv_cache_buffer": 10**30}}, "train_overrides.kv_cache_buffer", "64-bit integer"),
    (
        {"train_overrides": {"kv_cache_buffer": 0}},
        "train_overrides.kv_cache_buffer",
        "must be > 0 in MaxText",
    ),
    ({"train_overrides": {"kv_cache_buffer": 2.5}}, "train_overrides.kv_cache_buffer", "must be an integer"),
    (
        {"train_overrides": {"kv_cache_buffer": "many"}},
        "train_overrides.kv_cache_buffer",
        "must be an integer",
    ),
    ({"train_overrides": {"debug": "maybe"}}, "train_overrides.debug", "true or false"),
    ({"train_overrides": {"debug": 2}}, "train_overrides.debug", "true or false"),
    ({"train_overrides": {"tokenizer_path": 5}}, "train_overrides.tokenizer_path", "must be a string"),
    ({"train_overrides": {"mu_dtype": ["bfloat16"]}}, "train_overrides.mu_dtype", "must be a string"),
    ({"train_overrides": {"grad_dtype": "fp8"}}, "train_overrides.grad_dtype", "must be one of"),
    ({"train_overrides": {"rl.loss_algo": "ppo"}}, "train_overrides.rl.loss_algo", "grpo, gspo-token"),
    ({"train_overrides": {"stop_strings": 5}}, "train_overrides.stop_strings", "must be a list"),
    ({"train_overrides": {"vllm_hf_overrides": 5}}, "train_overrides.vllm_hf_overrides", "must be an object"),
    ({"train_overrides": {"kv_cache_buffer": "none"}}, "train_overrides.kv_cache_buffer", "cannot be null"),
    ({"train_overrides": {"Bad-Key": 1}}, "train_overrides.Bad-Key", "lowercase letters, digits"),
    ({"train_overrides": {"x; rm": 1}}, "train_overrides.x; rm", "lowercase letters, digits"),
    ({"train_overrides": {"debug": "a\nb"}}, "train_overrides.debug", "control characters"),
    (
        {"train_overrides": {"hf_access_token": "hf_x"}},
        "train_overrides.hf_access_token",
        "never goes on a command line",
    ),
    (
        {"train_overrides": {"base_output_directory": "gs://x/y"}},
        "train_overrides.base_output_directory",
        "cannot be overridden",
    ),
    (
        {"train_overrides": {"checkpoint_dir": "gs://elsewhere/ckpt/"}},
        "train_overrides.checkpoint_dir",
        "MaxText derives it from `base_output_directory` and `run_name`",
    ),
    (
        {"train_overrides": {"tensorboard_dir": "gs://elsewhere/tb/"}},
        "train_overrides.tensorboard_dir",
        "ignores any value",
    ),
    ({"train_overrides": {"debug": None}}, "train_overrides.debug", "must not be null"),
    ({"train_overrides": []}, "train_overrides", "must be an object"),
    ({"hf_token_conn_id": "my conn"}, "hf_token_conn_id", "connection id"),
    ({"hf_token_secret": "a/b"}, "hf_token_secret", "secret id"),
    ({"hf_token_secret": "--help"}, "hf_token_secret", "not starting with a hyphen"),
    ({"min_reward_gain": "lots"}, "min_reward_gain", "must be a number"),
    ({"min_reward_gain": True}, "min_reward_gain", "must be a number"),
    ({"min_reward_gain": float("nan")}, "min_reward_gain", "finite"),
    ({"min_reward_gain": 1e9}, "min_reward_gain", "between -1000 and 1000"),
]


@pytest.mark.parametrize(
    ("conf", "field", "rule"), BAD_GKE_CONF, ids=[f"{c[1]}-{i}" for i, c in enumerate(BAD_GKE_CONF)]
)
def test_bad_gke_conf_is_rejected_with_field_and_rule(conf: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(SpecError) as err:
        gke_pipeline_from_conf(conf)
    assert err.value.field == field
    assert rule in str(err.value)
    assert str(err.value).startswith(f"{field}: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("conf", "field", "rule"),
    [
        ({"vm_name": "VM"}, "vm_name", "VM name"),
        ({"capacity": "reservation"}, "capacity", "reservation capacity needs a reservation"),
        ({"model": "qwen3-30b-a3b"}, "model", "multi-host slice"),
        ({"keep_cluster": True}, "keep_cluster", "unknown conf key"),
        ({"service_account": "someone@example.com"}, "service_account", "service account"),
        # the CPU VM runs the converters: a TPU machine type would bill TPUs for CPU work
        ({"cpu_machine_type": "ct6e-standard-8t"}, "cpu_machine_type", "not a TPU one"),
        ({"cpu_machine_type": "N2 highmem"}, "cpu_machine_type", "a CPU machine type like n2-highmem-32"),
        # its boot disk type is not known: a guess fails the create or is the slow pd-standard
        (
            {"cpu_machine_type": "m3-ultramem-32"},
            "cpu_machine_type",
            "machine series m3 has no known boot disk type",
        ),
    ],
)
def test_bad_tpu_vm_conf_is_rejected(conf: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(SpecError) as err:
        tpu_vm_pipeline_from_conf(conf)
    assert err.value.field == field
    assert rule in str(err.value)


@pytest.mark.parametrize(
    ("given", "resolved"), [(None, None), ("", None), (0.05, 0.05), (0, 0.0), (-0.1, -0.1)]
)
def test_min_reward_gain_reaches_the_resolved_values(given: Any, resolved: float | None) -> None:
    conf = {"min_reward_gain": given}
    assert gke_pipeline_from_conf(conf).resolved()["min_reward_gain"] == resolved
    assert tpu_vm_pipeline_from_conf(conf).resolved()["min_reward_gain"] == resolved


def test_the_cpu_vm_is_named_after_the_tpu_vm_and_stays_a_valid_gce_name() -> None:
    pipeline = tpu_vm_pipeline_from_conf({"vm_name": "llama-vm", "cpu_machine_type": "n4-highmem-32"})
    assert (pipeline.cpu_vm.vm_name, pipeline.cpu_vm.machine_type) == ("llama-vm-cpu", "n4-highmem-32")
    assert pipeline.cpu_vm.labels == {}  # labels come with the create, as the TPU VM's
    longest = tpu_vm_pipeline_from_conf({"vm_name": "v" * 60 + "-ab"}).cpu_vm.vm_name
    assert len(longest) == 63
    assert longest == "v" * 59 + "-cpu"  # cut, and no "--" left where the cut fell


def test_good_overrides_reach_training_and_win_over_the_preset() -> None:
    pipeline = gke_pipeline_from_conf(
        {
            "train_overrides": {
                "learning_rate": 1e-6,
                "num_test_batches": 5,
                "eval_interval": 10,
                "rl.num_generations": 8,
            }
        }
    )
    overrides = dict(pipeline.training.overrides)
    assert overrides["learning_rate"] == "1e-6"
    assert overrides["num_test_batches"] == "5"
    assert overrides["rl.num_generations"] == "8"
    assert overrides["eval_interval"] == "10"
    assert overrides["batch_size"] == "8"  # preset value kept


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_training_checkpoints_every_ten_steps_unless_told_otherwise(build: Any) -> None:
    """A failure loses at most 9 steps: the retry resumes from the newest committed checkpoint
    (MaxText's rl.yml saves every 50, the tutorials' whole run)."""
    assert dict(build({}).training.overrides)["checkpoint_period"] == "10"
    told = build({"train_overrides": {"checkpoint_period": 25}})
    assert dict(told.training.overrides)["checkpoint_period"] == "25"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("debug", "true"),
        ("debug", False),
        ("debug", 1),
        ("kv_cache_buffer", "512"),
        ("kv_cache_buffer", 512.0),
        ("max_num_seqs", "None"),  # nullable: MaxText reads "none" as null
        ("grad_dtype", "bfloat16"),
        ("rl.loss_algo", "gspo-token"),
        ("rl.num_iterations", "1"),  # another value is refused: TRAINING_NEEDS
        ("num_iterations", 1),  # a nested model's field, given flat (RLConfig routes it)
        ("vllm_hf_overrides", {"architectures": ["MaxTextForCausalLM"]}),
        ("vllm_additional_config.maxtext_config", "{}"),  # a key inside a dict-valued key
        ("stop_strings", ["</answer>"]),
        ("learning_rate", "3e-6"),
    ],
)
def test_maxtext_values_of_the_keys_type_are_taken(key: str, value: Any) -> None:
    pipeline = gke_pipeline_from_conf({"train_overrides": {key: value}})
    assert key in dict(pipeline.training.overrides)


def test_tpu_vm_overrides_are_checked_against_the_maxtext_it_installs() -> None:
    """Runtime install installs maxtext 0.2.3, whose train_rl does not know data_template_path
    (0.2.4 does); runtime container trains with the post-training image's 0.2.4."""
    overrides = {"train_overrides": {"data_template_path": "x.json"}}
    assert gke_pipeline_from_conf(overrides)
    with pytest.raises(SpecError) as err:
        tpu_vm_pipeline_from_conf({**overrides, "runtime": "install"})
    assert str(err.value).startswith("train_overrides.data_template_path: not a MaxText config key")
    container = tpu_vm_pipeline_from_conf(overrides)
    assert container.runtime == "container"
    assert container.training.maxtext_version == "0.2.4"


def test_tpu_vm_runtime_and_workload_image() -> None:
    """runtime is container (default) or install; workload_image is an image reference, empty = the
    post-training image; anything else is refused in one line naming the field."""
    from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE

    default = tpu_vm_pipeline_from_conf({})
    assert (default.runtime, default.workload_image) == ("container", POST_TRAINING_IMAGE)
    assert default.resolved()["runtime"] == "container"
    assert default.resolved()["workload_image"] == POST_TRAINING_IMAGE
    assert tpu_vm_pipeline_from_conf({"runtime": "install"}).runtime == "install"
    mine = "europe-docker.pkg.dev/my-proj/images/post-train:v1@sha256:" + "a" * 64
    assert tpu_vm_pipeline_from_conf({"workload_image": mine}).workload_image == mine
    assert tpu_vm_pipeline_from_conf({"workload_image": ""}).workload_image == POST_TRAINING_IMAGE
    refused = {
        ("runtime", "docker"): "runtime: must be one of ['container', 'install']",
        ("runtime", None): "runtime: must be a string",
        ("workload_image", "img; rm -rf /"): "workload_image: container image must be",
        ("workload_image", "--privileged"): "workload_image: container image must be",
        ("workload_image", "us-docker.pkg.dev/p/r/i:$(id)"): "workload_image: container image must be",
    }
    for (key, value), message in refused.items():
        with pytest.raises(SpecError) as err:
            tpu_vm_pipeline_from_conf({key: value})
        assert str(err.value).startswith(message), (key, value, str(err.value))


def test_gke_default_run_name_is_unique_per_dag_run() -> None:
    """Outputs are keyed by run_name: two runs with the default settings each train their own model."""
    first = gke_pipeline_from_conf({}, run_id="manual__1")
    second = gke_pipeline_from_conf({}, run_id="manual__2")
    assert first.training.run_name != second.training.run_name
    assert first.training.run_name == f"rl-{first.suffix}"
    assert first.training.actor_checkpoint_root != second.training.actor_checkpoint_root
    assert first.export.output_directory != second.export.output_directory
    # The same DAG run (a retry) keeps its run_name; an explicit one (resume) is used as is.
    assert gke_pipeline_from_conf({}, run_id="manual__1").training.run_name == first.training.run_name
    assert gke_pipeline_from_conf({"run_name": "rl"}, run_id="manual__2").training.run_name == "rl"


def test_placeholders_are_named_with_what_to_set() -> None:
    from airflow_provider_tpu_rl.spec.pipeline import placeholders, refuse_placeholders

    resolved = gke_pipeline_from_conf({}).resolved()
    assert placeholders(resolved) == {"project": "my-tpu-project", "bucket": "my-tpu-rl-bucket"}
    with pytest.raises(SpecError) as err:
        refuse_placeholders(resolved)
    # Every placeholder in one line: the untouched form is refused once, not once per field.
    assert str(err.value) == (
        "project, bucket: set project to your GCP project (my-tpu-project is the form's example); "
        "set bucket to a Cloud Storage bucket name of yours (my-tpu-rl-bucket is the form's example)"
    )
    with pytest.raises(SpecError) as err:
        refuse_placeholders({**resolved, "bucket": "bucket-123"}, {"project": "default_project"})
    assert str(err.value) == (
        "project: set project to your GCP project (my-tpu-project is the form's example); "
        "or set [tpu_rl] default_project once for this Airflow"
    )
    # the TPU VM form's reservation is empty (on-demand by default): nothing of it to replace
    refuse_placeholders(tpu_vm_pipeline_from_conf({"project": "proj-123", "bucket": "bucket-123"}).resolved())


def test_job_names_are_dns_1035_and_fit_28_characters() -> None:
    assert job_name("gemma4-training", "abc123") == "gemma4-training-abc123"
    long = job_name("a-very-long-prefix-for-a-training-job", "abc123")
    assert len(long) == 28
    assert long.endswith("-abc123")
    with pytest.raises(SpecError, match="DNS-1035"):
        job_name("Qwen", "abc123")


def test_job_names_are_stable_per_run_and_differ_between_runs() -> None:
    a1 = gke_pipeline_from_conf({}, run_id="manual__1")
    a2 = gke_pipeline_from_conf({}, run_id="manual__1")
    b = gke_pipeline_from_conf({}, run_id="manual__2")
    assert a1.train_job == a2.train_job
    assert a1.train_job != b.train_job
    names = (a1.convert_job, a1.train_job, a1.export_job)
    prefixes = ("qwen-hf-to-mt-", "qwen-rl-", "qwen-mt-to-hf-")
    assert all(name.startswith(prefix) for name, prefix in zip(names, prefixes, strict=True))
    # The suffix is of the run and the task: two jobs of one run never share it.
    assert len({name.rsplit("-", 1)[1] for name in names}) == 3
    assert a1.train_job == job_name("qwen-rl", job_suffix(GKE_DAG_ID, "manual__1", "train"))


@pytest.mark.parametrize("breaker", ["\n", "\r", "\x0b", "\x85", "\u2028", "\u2029", "\x00"])
def test_override_values_cannot_break_the_one_line_command(breaker: str) -> None:
    with pytest.raises(SpecError, match="control characters or newlines"):
        gke_pipeline_from_conf({"train_overrides": {"debug": f"a{breaker}b"}})


@pytest.mark.parametrize("breaker", ["\n", "\r", "\x0b", "\x85", "\u2028", "\u2029", "\t"])
def test_a_key_with_a_line_break_is_named_quoted_on_one_line(breaker: str) -> None:
    """The key is quoted (repr) in the refusal: a newline in it used to split the message in two."""
    for conf in ({"train_overrides": {f"a{breaker}b": 1}}, {f"a{breaker}b": 1}):
        with pytest.raises(SpecError) as refused:
            gke_pipeline_from_conf(conf)
        message = str(refused.value)
        assert len(message.splitlines()) == 1, message
        assert repr(f"a{breaker}b") in message


@pytest.mark.parametrize(
    ("model", "batches"), [("qwen3-30b-a3b", 2), ("gemma4-26b", 5), ("llama3.1-8b-Instruct", 10)]
)
def test_every_preset_evaluates_before_and_after_training_by_default(model: str, batches: int) -> None:
    """MaxText's train_rl evaluates (and prints the rewards) only when num_test_batches > 0; Gemma
    keeps MaxText's own default (5), the Qwen tutorial's 0 is raised to 2."""
    build = tpu_vm_pipeline_from_conf if model == "llama3.1-8b-Instruct" else gke_pipeline_from_conf
    training = build({"model": model}).training
    assert training.num_test_batches == batches
    assert dict(training.overrides).get("num_test_batches", "5") == str(batches)
    off = build({"model": model, "train_overrides": {"num_test_batches": 0}}).training
    assert off.num_test_batches == 0


# -- overrides that contradict what a later task needs (issue 43, item 2) ----------------------------
CONTRADICTIONS = [
    pytest.param(need, key, id=f"{key}={need.contradiction}") for need in TRAINING_NEEDS for key in need.keys
]


@pytest.mark.parametrize(("need", "key"), CONTRADICTIONS)
@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf], ids=["gke", "tpu_vm"])
def test_an_override_contradicting_what_a_later_task_needs_is_refused_in_one_line(
    build: Any, need: TrainingNeed, key: str
) -> None:
    """Each row of TRAINING_NEEDS, under each spelling of its key, with the value that breaks it."""
    with pytest.raises(SpecError) as refused:
        build({"train_overrides": {key: need.contradiction}})
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"train_overrides.{key}: must be {need.wanted}: ")
    assert "wait_actor_checkpoint and export_to_huggingface" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enable_checkpointing", True),
        ("enable_checkpointing", "yes"),
        ("save_checkpoint_on_completion", True),
        ("max_num_checkpoints_to_keep", 1),
        ("max_num_checkpoints_to_keep", "none"),
        ("train_fraction", 1.0),
        ("num_epoch", 1),
        ("rl.num_iterations", 1),
        ("checkpoint_period", 100),  # larger than the run: tunix still saves the last step
        ("num_test_batches", 0),  # no task needs the evaluation: no reward is recorded
    ],
)
def test_an_override_keeping_what_later_tasks_need_is_taken(key: str, value: Any) -> None:
    spec = gke_pipeline_from_conf({"train_overrides": {key: value}})
    assert key in dict(spec.training.overrides)


def test_the_operators_refuse_it_too_before_anything_is_submitted() -> None:
    """The needs are checked where every training spec is built (training_spec), so a DAG of
    one's own using the operators gets the same refusal."""
    from airflow_provider_tpu_rl.spec.pipeline import training_spec
    from airflow_provider_tpu_rl.spec.presets import get_preset

    with pytest.raises(SpecError, match=r"^train_overrides\.max_num_checkpoints_to_keep: must be null"):
        training_spec(
            get_preset("gemma4-26b"),
            run_name="rl-1",
            base_output_directory="gs://bkt/m/trained/",
            load_parameters_path="gs://bkt/m/max-text-format/0/items/",
            train_overrides={"max_num_checkpoints_to_keep": 0},
        )
