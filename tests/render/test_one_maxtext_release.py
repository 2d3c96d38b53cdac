"""One MaxText per run (issue 46, item 4): the release that converts and exports is the one that
trains, read from what each stage's script runs (the image of its ``docker run``, else the MaxText
its machine's install stage installs), never from one shared constant."""

from __future__ import annotations

import re
import shlex

import pytest

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.render.plan import tpu_vm_plan
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.pipeline import TpuVmPipelineSpec

CONF = {"project": "release-proj", "bucket": "release-bucket"}
PIN = re.compile(r"maxtext(?:\[[^\]]*\])?==([^\s']+)")


def _docker_image(script: str) -> str | None:
    """The image of the script's ``docker run`` (the first word after its options), if it has one."""
    for line in script.splitlines():
        tokens = shlex.split(line) if " docker run " in line else []
        if not tokens:
            continue
        rest = tokens[tokens.index("run") + 1 :]
        while rest and rest[0].startswith("-"):
            flag = rest.pop(0)
            if flag in ("-e", "--env", "-w", "--workdir") and rest:
                rest.pop(0)
        return rest[0] if rest else None
    return None


def release_of(pipeline: TpuVmPipelineSpec, stage: str, scripts: dict[str, dict[str, str]]) -> str:
    """What MaxText ``stage`` runs: ``image <ref>`` when its script runs a container, else ``pip
    <version>`` that the install stage of its machine installed; ``scripts``: machine → stage →
    script, as the plan renders them."""
    machine = tpu_vm.stage_machine(stage)
    image = _docker_image(scripts[machine][stage])
    if image is not None:
        return f"image {image}"
    assert "python3 -m maxtext." in scripts[machine][stage]
    pins = PIN.findall(scripts[machine]["install"])
    assert len(pins) == 1, f"the {machine} VM's install pins no single MaxText"
    return f"pip {pins[0]}"


def _scripts(pipeline: TpuVmPipelineSpec) -> dict[str, dict[str, str]]:
    """The stage scripts of the run's plan, by machine and stage."""
    stages = {
        "install_cpu_vm": ("cpu", "install"),
        "install_maxtext": ("tpu", "install"),
        "convert_to_maxtext": ("cpu", "convert"),
        "train": ("tpu", "train"),
        "export_to_huggingface": ("cpu", "export"),
    }
    found: dict[str, dict[str, str]] = {"cpu": {}, "tpu": {}}
    for step in tpu_vm_plan(pipeline):
        if step.task_id in stages:
            machine, stage = stages[step.task_id]
            found[machine][stage] = step.command.stdin_text or ""
    return found


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {"runtime": "install"},
        {"workload_image": "us-docker.pkg.dev/my-proj/my-repo/maxtext-post-train:2026.05.1"},
        {"workload_image": f"us-docker.pkg.dev/my-proj/my-repo/mt@sha256:{'cd' * 32}"},
    ],
    ids=["container", "install", "own-image", "pinned-image"],
)
def test_conversion_and_export_run_the_maxtext_that_trains(conf: dict[str, str]) -> None:
    pipeline = tpu_vm_pipeline_from_conf({**CONF, **conf})
    scripts = _scripts(pipeline)
    trains = release_of(pipeline, "train", scripts)
    assert release_of(pipeline, "convert", scripts) == trains
    assert release_of(pipeline, "export", scripts) == trains
    if pipeline.runtime == "container":
        assert trains == f"image {pipeline.workload_image}"


def test_a_container_on_the_cpu_vm_gets_no_tpu_and_the_token_by_name_only() -> None:
    """The conversions' container: no --privileged (no devices), the CPU keys MaxText needs there,
    HF_TOKEN by name (its value on no argv)."""
    pipeline = tpu_vm_pipeline_from_conf(CONF)
    for stage in ("convert", "export"):
        script, _ = tpu_vm.stage_script(pipeline, stage, "cpu")
        (line,) = [line for line in script.splitlines() if " docker run " in line]
        tokens = shlex.split(line)
        assert "--privileged" not in tokens
        assert {"hardware=cpu", "skip_jax_distributed_system=true"} <= set(tokens)
        assert tokens[tokens.index("-e") + 1] == "HF_TOKEN"
        assert tokens[0] == "HF_TOKEN=$tpu_rl_hf_token"
        assert not [token for token in tokens[1:] if "tpu_rl_hf_token" in token or "HF_TOKEN=" in token]
