"""``tpu-rl plan``: JSON plan of a DAG run, no cloud call, secrets never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tpu_rl.cli import build_plan, main
from airflow_provider_tpu_rl.maxtext import config_keys
from airflow_provider_tpu_rl.spec import SpecError
from airflow_provider_tpu_rl.spec.pipeline import GKE_DEFAULTS, TPU_VM_DEFAULTS

SENTINEL = "hf_SENTINEL_token_must_never_appear_1234567890"


@pytest.fixture(autouse=True)
def _no_form_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans here are of the forms' own defaults, unless a test sets a ``[tpu_rl] default_*``."""
    for name in [n for n in os.environ if n.startswith("AIRFLOW__TPU_RL__DEFAULT_")]:
        monkeypatch.delenv(name)


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_gke_plan_lists_every_step_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _plan(capsys, "tpu_rl_gke_pipeline")
    assert code == 0
    plan = json.loads(out)
    assert plan["dag_id"] == "tpu_rl_gke_pipeline"
    task_ids = [s["task_id"] for s in plan["steps"]]
    order = [
        "preflight",
        "ensure_bucket",
        "deploy_cluster",
        "sync_hf_token",
        "convert_to_maxtext",
        "deploy_tpu_pool",
        "train",
        "destroy_tpu_pool",
        "export_to_huggingface",
        "destroy_cluster",
    ]
    assert [t for i, t in enumerate(task_ids) if i == 0 or task_ids[i - 1] != t] == order
    # The TPU capacity: no node pool while the conversion and the export run, only around training.
    argvs = {task: [s["argv"] for s in plan["steps"] if s["task_id"] == task] for task in order}
    (deploy,) = argvs["deploy_cluster"]
    assert deploy[:2] == ["gcluster", "deploy"]
    assert deploy[-1] == "--skip=tpu"
    assert [a[:2] for a in argvs["deploy_tpu_pool"]] == [
        ["gcluster", "create"],
        ["gcluster", "export-outputs"],
        ["gcluster", "deploy"],
    ]
    assert argvs["deploy_tpu_pool"][1][2].endswith("/primary")
    assert argvs["deploy_tpu_pool"][2][-1] == "--only=tpu"
    assert [a[:2] for a in argvs["destroy_tpu_pool"]] == [
        ["gcluster", "create"],
        ["gcluster", "export-outputs"],
        ["gcluster", "destroy"],
    ]
    assert argvs["destroy_tpu_pool"][2][-1] == "--only=tpu"
    (cluster_destroy,) = [a for a in argvs["destroy_cluster"] if a[:2] == ["gcluster", "destroy"]]
    assert not any(a.startswith(("--only", "--skip")) for a in cluster_destroy)
    for task in ("convert_to_maxtext", "export_to_huggingface"):
        (submit,) = [a for a in argvs[task] if a[:3] == ["gcluster", "job", "submit"]]
        assert "--compute-type=n4-standard-64" in submit
        assert not any(a.startswith("--topology") for a in submit)
    for step in plan["steps"]:
        assert step["argv"][0] in {"gcluster", "gcloud"}
    # gcluster checks Docker credentials in the submitting HOME, so each job task sets them first.
    for task in ("convert_to_maxtext", "train", "export_to_huggingface"):
        argvs = [s["argv"] for s in plan["steps"] if s["task_id"] == task]
        assert [a[:3] for a in argvs] == [
            ["gcloud", "auth", "configure-docker"],
            ["gcluster", "job", "submit"],
        ]
        assert isinstance(step["env"], dict)
    (secret_add,) = [s for s in plan["steps"] if s["argv"][:4] == ["gcloud", "secrets", "versions", "add"]]
    assert secret_add["stdin"] == "***"
    assert not any(s["argv"][:3] == ["gcloud", "storage", "rm"] for s in plan["steps"])


def test_conf_changes_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    conf = {
        "model": "gemma4-26b",
        "keep_cluster": True,
        "delete_bucket": True,
        "num_batches": 7,
        "hf_token_secret": "my-hf",
    }
    code, out, _ = _plan(capsys, "tpu_rl_gke_pipeline", "--conf", json.dumps(conf))
    assert code == 0
    steps = json.loads(out)["steps"]
    assert steps[-1]["task_id"] == "destroy_cluster"
    assert steps[-1]["argv"] == ["gcloud", "storage", "rm", "--recursive", "gs://my-tpu-rl-bucket"]
    # keep_cluster keeps the cluster, not the TPU node pool
    destroys = [s for s in steps if s["argv"][:2] == ["gcluster", "destroy"]]
    assert [(s["task_id"], s["argv"][-1]) for s in destroys] == [("destroy_tpu_pool", "--only=tpu")]
    (train,) = [s for s in steps if s["task_id"] == "train" and s["argv"][0] == "gcluster"]
    assert any(a.startswith("--name=gemma4-training-") for a in train["argv"])
    assert "num_batches=7" in next(a for a in train["argv"] if a.startswith("--command="))
    # A given secret is used as is: no create/add, only the reader grants.
    assert not any(s["argv"][:3] == ["gcloud", "secrets", "create"] for s in steps)


def test_tpu_vm_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _plan(capsys, "tpu_rl_tpu_vm_pipeline")
    assert code == 0
    steps = json.loads(out)["steps"]
    tasks = [s["task_id"] for s in steps]
    assert tasks[-1] == "delete_cpu_vm"
    # the TPU VM is deleted before the export, the CPU VM runs the conversions
    assert tasks.index("create_vm") > tasks.index("convert_to_maxtext")
    assert tasks.index("delete_vm") < tasks.index("export_to_huggingface")
    ssh_vm = {s["task_id"]: s["argv"][3] for s in steps if s["argv"][:3] == ["gcloud", "compute", "ssh"]}
    assert ssh_vm["convert_to_maxtext"] == ssh_vm["export_to_huggingface"] == ssh_vm["install_cpu_vm"]
    assert ssh_vm["convert_to_maxtext"].endswith("-cpu")
    assert ssh_vm["train"] == ssh_vm["install_maxtext"] != ssh_vm["convert_to_maxtext"]
    assert all("stdin" in s for s in steps if s["argv"][:3] == ["gcloud", "compute", "ssh"])


@pytest.mark.parametrize("runtime", ["container", "install"])
def test_the_tpu_vm_plan_shows_the_runtime(capsys: pytest.CaptureFixture[str], runtime: str) -> None:
    """container (the default): both VMs run the image; the TPU VM boots from the baked image and
    installs and pulls nothing, the CPU VM pulls it. install: both VMs build MaxText."""
    args = [] if runtime == "container" else ["--conf", json.dumps({"runtime": "install"})]
    code, out, _ = _plan(capsys, "tpu_rl_tpu_vm_pipeline", *args)
    assert code == 0
    steps = {s["task_id"]: s for s in json.loads(out)["steps"] if "stdin" in s}
    pulls = "sudo docker pull us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
    tpu_install = steps["install_maxtext"]["stdin"]
    if runtime == "container":  # nothing installed or pulled on the billed TPU VM
        assert not [w for w in ("docker pull", "apt-get", "configure-docker", "uv ") if w in tpu_install]
    else:
        assert "uv pip install" in tpu_install
    assert ("docker run" in steps["train"]["stdin"]) is (runtime == "container")
    assert ("docker run" in steps["convert_to_maxtext"]["stdin"]) is (runtime == "container")
    assert (pulls in steps["install_cpu_vm"]["stdin"]) is (runtime == "container")
    assert ("uv pip install" in steps["install_cpu_vm"]["stdin"]) is (runtime == "install")
    assert steps["install_maxtext"]["description"].startswith(
        "check that the baked boot image holds the TPU devices, Docker"
        if runtime == "container"
        else "install MaxText"
    )


@pytest.mark.parametrize(
    ("dag_id", "conf", "field"),
    [
        ("tpu_rl_gke_pipeline", '{"cluster_name": "Bad_Name"}', "cluster_name"),
        ("tpu_rl_gke_pipeline", '{"nope": 1}', "nope"),
        ("tpu_rl_gke_pipeline", "{not json", "conf"),
        ("tpu_rl_gke_pipeline", "[1, 2]", "conf"),
        ("tpu_rl_tpu_vm_pipeline", '{"vm_name": "A"}', "vm_name"),
        # Wrong JSON types and non-finite numbers: one line naming the field, no traceback.
        ("tpu_rl_gke_pipeline", '{"compute_type": ["ct6e-standard-4t"]}', "compute_type"),
        ("tpu_rl_gke_pipeline", '{"num_slices": NaN}', "num_slices"),
        ("tpu_rl_gke_pipeline", '{"max_cluster_hours": Infinity}', "max_cluster_hours"),
        (
            "tpu_rl_gke_pipeline",
            '{"train_overrides": {"learning_rate": NaN}}',
            "train_overrides.learning_rate",
        ),
        ("tpu_rl_gke_pipeline", '{"train_overrides": "lr=1"}', "train_overrides"),
        (
            "tpu_rl_gke_pipeline",
            '{"train_overrides": {"lerning_rate": 1e-5}}',
            "train_overrides.lerning_rate",
        ),
        ("tpu_rl_gke_pipeline", '{"train_overrides": {"num_batches": 5}}', "train_overrides.num_batches"),
        ("tpu_rl_gke_pipeline", '{"num_batches": 1000000000000000000000000000000}', "num_batches"),
        ("tpu_rl_tpu_vm_pipeline", '{"keep_vm": [true]}', "keep_vm"),
        ("tpu_rl_tpu_vm_pipeline", '{"max_vm_hours": NaN}', "max_vm_hours"),
    ],
)
def test_bad_conf_exits_non_zero_with_one_line(
    capsys: pytest.CaptureFixture[str], dag_id: str, conf: str, field: str
) -> None:
    code, out, err = _plan(capsys, dag_id, "--conf", conf)
    assert code != 0
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert f": {field}: " in lines[0]


def test_hf_token_in_a_connection_never_reaches_the_plan() -> None:
    env = {
        **os.environ,
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps({"conn_type": "generic", "password": SENTINEL}),
        "HF_TOKEN": SENTINEL,
    }
    for dag_id in ("tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"):
        result = subprocess.run(
            [sys.executable, "-m", "airflow_provider_tpu_rl.cli", "plan", dag_id, "--pretty"],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        assert SENTINEL not in result.stdout + result.stderr
        assert json.loads(result.stdout)["steps"]


def test_the_forms_examples_are_planned_but_marked_as_placeholders(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _plan(capsys, "tpu_rl_tpu_vm_pipeline")
    assert code == 0
    assert json.loads(out)["placeholders"] == {
        "project": {"value": "my-tpu-project", "todo": "set project to your GCP project"},
        "bucket": {"value": "my-tpu-rl-bucket", "todo": "set bucket to a Cloud Storage bucket name of yours"},
    }
    assert "tpu-rl plan: placeholder project=my-tpu-project (the form's example)" in err
    conf = {"project": "proj-123", "bucket": "bucket-123"}
    code, out, err = _plan(capsys, "tpu_rl_gke_pipeline", "--conf", json.dumps(conf))
    assert code == 0
    assert json.loads(out)["placeholders"] == {}
    assert err == ""


@pytest.mark.parametrize("dag_id", ["tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"])
def test_the_plan_of_the_untouched_form_reads_the_forms_tpu_rl_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, dag_id: str
) -> None:
    """``[tpu_rl] default_*`` prefill the trigger form, so they are what an untouched form runs."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEFAULT_PROJECT", "env-project-123")
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEFAULT_BUCKET", "env-bucket-123")
    code, out, err = _plan(capsys, dag_id)
    assert code == 0, err
    plan = json.loads(out)
    argvs = [" ".join(step["argv"]) for step in plan["steps"]]
    assert any("env-project-123" in argv for argv in argvs)
    assert any("env-bucket-123" in argv for argv in argvs)
    assert not any("my-tpu-project" in argv or "my-tpu-rl-bucket" in argv for argv in argvs)
    assert plan["placeholders"] == {}
    assert "placeholder project=" not in err
    # the run's conf still overrides every field
    code, out, _ = _plan(capsys, dag_id, "--conf", json.dumps({"project": "conf-project-1"}))
    assert code == 0
    argvs = [" ".join(step["argv"]) for step in json.loads(out)["steps"]]
    assert any("conf-project-1" in argv for argv in argvs)
    assert not any("env-project-123" in argv for argv in argvs)


def test_a_tpu_rl_default_the_form_would_refuse_fails_the_plan_in_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEFAULT_ZONE", "Europe West")
    code, out, err = _plan(capsys, "tpu_rl_gke_pipeline")
    assert code == 2
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("tpu-rl plan: [tpu_rl] default_zone: 'Europe West' is not a valid Zone")


def test_the_plan_shows_the_capacity_and_what_it_renders(capsys: pytest.CaptureFixture[str]) -> None:
    conf = json.dumps({"project": "my-proj-123", "bucket": "my-bkt", "capacity": "spot", "reservation": ""})
    code, out, _ = _plan(capsys, "tpu_rl_tpu_vm_pipeline", "--conf", conf)
    assert code == 0
    plan = json.loads(out)
    assert plan["capacity"] == {
        "value": "spot",
        "reservation": None,
        "release_track": "ga",
        "create_vm_flags": [
            "--maintenance-policy=TERMINATE",
            "--provisioning-model=SPOT",
            "--instance-termination-action=STOP",
        ],
    }
    (create,) = [s["argv"] for s in plan["steps"] if s["task_id"] == "create_vm"][:1]
    assert "--provisioning-model=SPOT" in create
    assert not any(step["argv"][1:4] == ["compute", "reservations", "describe"] for step in plan["steps"])

    code, out, _ = _plan(capsys, "tpu_rl_gke_pipeline", "--conf", json.dumps({"capacity": "flex-start"}))
    assert code == 0
    assert json.loads(out)["capacity"]["tpu_pool_settings"] == {
        "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
        "enable_flex_start": True,
        "auto_repair": False,
        "autoscaling_min_node_count": 0,
        "autoscaling_max_node_count": 8,
    }
    # the untouched forms: on-demand, no reservation; a reservation named in the conf is consumed
    for dag_id in ("tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"):
        code, out, _ = _plan(capsys, dag_id)
        capacity = json.loads(out)["capacity"]
        assert (capacity["value"], capacity["reservation"]) == ("on-demand", None), capacity
        code, out, _ = _plan(capsys, dag_id, "--conf", json.dumps({"reservation": "res-1"}))
        capacity = json.loads(out)["capacity"]
        assert (capacity["value"], capacity["reservation"]) == ("reservation", "res-1"), capacity
    code, out, _ = _plan(capsys, "tpu_rl_gke_pipeline")
    assert json.loads(out)["capacity"]["tpu_pool_settings"] == {
        "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"}
    }


def test_the_plan_of_an_ordered_capacity_shows_each_kinds_create(capsys: pytest.CaptureFixture[str]) -> None:
    """The steps show the first kind's create; the capacity document each kind's, in order, and
    the preflight reads what any kind needs (flex-start: gcloud's components)."""
    conf = {"project": "my-proj-123", "bucket": "my-bkt", "reservation": "res-8"}
    code, out, _ = _plan(
        capsys,
        "tpu_rl_tpu_vm_pipeline",
        "--conf",
        json.dumps({**conf, "capacity": ["reservation", "flex-start", "spot"]}),
    )
    assert code == 0
    plan = json.loads(out)
    capacity = plan["capacity"]
    assert (capacity["value"], capacity["reservation"]) == (["reservation", "flex-start", "spot"], "res-8")
    assert [(a["kind"], a["release_track"]) for a in capacity["attempts"]] == [
        ("reservation", "ga"),
        ("flex-start", "alpha"),
        ("spot", "ga"),
    ]
    assert "--reservation=res-8" in capacity["attempts"][0]["create_vm_flags"]
    assert "--provisioning-model=SPOT" in capacity["attempts"][2]["create_vm_flags"]
    (create,) = [s["argv"] for s in plan["steps"] if s["task_id"] == "create_vm"][:1]
    assert "--reservation=res-8" in create
    preflight = [s["argv"] for s in plan["steps"] if s["task_id"] == "preflight"]
    assert ["gcloud", "version", "--format=json"] in preflight
    # GKE: each kind's TPU pool settings, in order
    code, out, _ = _plan(
        capsys, "tpu_rl_gke_pipeline", "--conf", json.dumps({"capacity": ["on-demand", "spot"]})
    )
    assert code == 0
    attempts = json.loads(out)["capacity"]["attempts"]
    assert [(a["kind"], a["tpu_pool_settings"].get("spot")) for a in attempts] == [
        ("on-demand", None),
        ("spot", True),
    ]


def test_a_capacity_with_a_reservation_is_an_invalid_conf(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _plan(
        capsys, "tpu_rl_gke_pipeline", "--conf", json.dumps({"capacity": "spot", "reservation": "r1"})
    )
    assert code == 2
    assert "capacity: spot capacity consumes no reservation: clear reservation (r1)" in err


# -- any JSON conf: a plan or one line, exit 2, never a traceback (issue 43, item 3) ----------------
HUGE_INT = "1" + "0" * 5000  # past Python's 4,300-digit int conversion limit
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion limit


@pytest.mark.parametrize(
    "conf",
    [
        HUGE_INT,
        DEEP_ARRAY,
        f'{{"num_batches": {HUGE_INT}}}',
        f'{{"train_overrides": {{"batch_size": {HUGE_INT}}}}}',
        f'{{"train_overrides": {{"rl": {DEEP_ARRAY}}}}}',
        '{"train_overrides": {"x": ' + "[" * 900 + "]" * 900 + "}}",
        '{"train_overrides": {"a\\nb": 1}}',
        '{"a\\nb": 1}',
        '{"run_name": "a\\u2028b"}',
    ],
    ids=["huge-int", "deep-array", "huge-num-batches", "huge-override", "deep-override", "nested-900",
         "newline-key", "newline-conf-key", "line-separator-value"],
)  # fmt: skip
@pytest.mark.parametrize("dag_id", ["tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"])
def test_a_hostile_conf_is_refused_in_one_line_with_exit_2(
    capsys: pytest.CaptureFixture[str], dag_id: str, conf: str
) -> None:
    code, out, err = _plan(capsys, dag_id, "--conf", conf)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tpu-rl plan: invalid conf: ")
    assert "Traceback" not in err


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _conf_strategy(dag_id: str) -> st.SearchStrategy[dict[str, Any]]:
    defaults = GKE_DEFAULTS if dag_id == "tpu_rl_gke_pipeline" else TPU_VM_DEFAULTS
    keys = st.sampled_from(sorted(defaults)) | st.text(max_size=12)
    override_keys = st.sampled_from(sorted(next(iter(config_keys.KEYS.values())))) | st.text(max_size=12)
    overrides = st.dictionaries(override_keys, JSON_VALUES, max_size=4)
    return st.dictionaries(keys, JSON_VALUES, max_size=6) | st.fixed_dictionaries(
        {"train_overrides": overrides}
    )


@pytest.mark.parametrize("dag_id", ["tpu_rl_gke_pipeline", "tpu_rl_tpu_vm_pipeline"])
def test_any_json_conf_is_planned_or_refused_in_one_line(dag_id: str) -> None:
    """Over arbitrary JSON confs (known keys and any text, any JSON value), the plan is built or
    refused with a one-line SpecError: nothing else escapes (`tpu-rl plan` exits 2 on it)."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_conf_strategy(dag_id))
    def check(conf: dict[str, Any]) -> None:
        try:
            build_plan(dag_id, conf)
        except SpecError as err:
            refusal = str(err)
        else:
            return
        assert len(refusal.splitlines()) == 1, refusal

    check()


@pytest.mark.parametrize(
    ("dag_id", "shape", "machine"),
    [
        ("tpu_rl_gke_pipeline", "--topology=4x4", "ct6e-standard-4t"),
        ("tpu_rl_tpu_vm_pipeline", None, "ct6e-standard-4t"),
    ],
)
def test_the_rehearsals_plan_shows_the_small_model_and_shape(
    dag_id: str, shape: str | None, machine: str
) -> None:
    """``model: qwen3-0.6b`` is the rehearsal on both pipelines: the same steps, MaxText's smallest
    RL model, a few steps and the smallest slice (GKE v6e-16, the TPU VM a v6e-4)."""
    from airflow_provider_tpu_rl.cli import build_plan
    from airflow_provider_tpu_rl.spec.params import PARAMS_BY_KEY

    plan = build_plan(dag_id, {"model": "qwen3-0.6b", "project": "my-proj-123", "bucket": "my-bkt"})
    text = json.dumps(plan["steps"])
    assert "model_name=qwen3-0.6b" in text
    assert "num_batches=4" in text or "--num_batches=4" in text or '"num_batches=4"' in text
    assert machine in text
    if shape:
        (train,) = [
            s
            for s in plan["steps"]
            if s["task_id"] == "train" and s["argv"][:3] == ["gcluster", "job", "submit"]
        ]
        assert shape in train["argv"]
    else:
        (create,) = [s for s in plan["steps"] if s["task_id"] == "create_vm" and "create" in s["argv"]]
        assert f"--machine-type={machine}" in create["argv"]
    pipeline = "gke" if dag_id == "tpu_rl_gke_pipeline" else "tpu_vm"
    field = PARAMS_BY_KEY["model"].form_field(pipeline)
    assert "qwen3-0.6b" in field["enum"]
    assert field["values_display"]["qwen3-0.6b"].startswith(
        "qwen3-0.6b: rehearsal of 4 steps, Qwen/Qwen3-0.6B"
    )
