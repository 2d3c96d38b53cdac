"""The TPU VM's baked boot image as rendered (``render/boot_image.py``): its family named after the
workload image's digest, the bake's steps on a CPU VM of its own, and a TPU VM booted from it that
installs and pulls nothing (issue 46, item 3)."""

from __future__ import annotations

import shlex

import pytest

from airflow_provider_tpu_rl.render import boot_image, tpu_vm
from airflow_provider_tpu_rl.render.plan import PlanStep, tpu_vm_plan
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.errors import SpecError

CONF = {"project": "bake-proj", "bucket": "bake-bucket"}
DIGEST = "sha256:" + "0123456789abcdef" * 4
PINNED = f"us-docker.pkg.dev/my-proj/my-repo/post-train:1.0@{DIGEST}"
# What installing or pulling looks like in a script.
INSTALLS = ("apt-get", "docker pull", "configure-docker", "uv ", "pip install", "curl ")


def _steps(conf: dict[str, object], task_id: str) -> list[PlanStep]:
    return [s for s in tpu_vm_plan(tpu_vm_pipeline_from_conf({**CONF, **conf})) if s.task_id == task_id]


def test_the_family_is_named_after_the_digest_and_is_a_valid_family_name() -> None:
    family = boot_image.family_of(DIGEST)
    assert family == "tpu-rl-sha256-" + ("0123456789abcdef" * 3)
    assert len(family) <= 63  # RFC 1035, compute v1 Image.family
    assert boot_image.check_family(family) == family
    assert boot_image.image_name(family, "a1b2c3") == "tpu-rl-0123456789ab-a1b2c3"
    for bad in ("sha256:xyz", "0123"):
        with pytest.raises(ValueError, match="not an image digest"):
            boot_image.family_of(bad)
    with pytest.raises(ValueError, match="not a baked image family"):
        boot_image.check_family("ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")


def test_a_pinned_image_needs_no_lookup_and_a_tag_is_resolved_at_the_registry() -> None:
    assert boot_image.pinned_digest(PINNED) == DIGEST
    assert boot_image.pinned_digest("us-docker.pkg.dev/p/r/img:0.2.4") is None
    assert boot_image.repository(PINNED) == "us-docker.pkg.dev/my-proj/my-repo/post-train"
    assert boot_image.repository("localhost:5000/img:tag") == "localhost:5000/img"
    pinned = [s.command.argv[1:4] for s in _steps({"workload_image": PINNED}, "bake_image")]
    assert ("container", "images", "describe") not in pinned
    tagged = [s.command.argv for s in _steps({}, "bake_image")]
    assert tagged[0][1:4] == ("container", "images", "describe")
    assert tagged[0][-1] == "--format=value(image_summary.digest)"
    warning = "WARNING: Successfully resolved tag to sha256, but it is recommended to use sha256 directly."
    assert boot_image.parse_digest([warning, DIGEST]) == DIGEST
    assert boot_image.parse_digest([warning]) is None


def test_the_bake_runs_on_a_cpu_vm_from_the_tpu_family_and_leaves_an_image_of_its_stopped_disk() -> None:
    steps = _steps({"workload_image": PINNED}, "bake_image")
    pipeline = tpu_vm_pipeline_from_conf({**CONF, "workload_image": PINNED})
    bake, family = pipeline.bake_vm, boot_image.family_of(DIGEST)
    argvs = [s.command.argv for s in steps]
    assert [a[1:4] for a in argvs] == [
        ("compute", "images", "describe-from-family"),
        ("compute", "instances", "create"),
        ("compute", "ssh", bake.vm_name),
        ("compute", "instances", "stop"),
        ("compute", "instances", "describe"),
        ("compute", "images", "create"),
        ("compute", "instances", "delete"),
    ]
    create = argvs[1]
    assert create[4] == bake.vm_name == f"tpu-rl-bake-{pipeline.suffix}"
    assert {"--machine-type=n2-standard-8", f"--image-family={pipeline.vm.image_family}"} <= set(create)
    assert f"--image-project={pipeline.vm.image_project}" in create
    assert f"--boot-disk-size={pipeline.vm.boot_disk_size}" in create  # the TPU VM's disk fits it
    # n2 takes no Hyperdisk Balanced; Balanced PD, not the API's pd-standard HDD, reads the image
    assert "--boot-disk-type=pd-balanced" in create
    assert any(flag.startswith("--labels=tpu-rl-managed=true") for flag in create)
    image = argvs[5]
    assert image[4] == boot_image.image_name(family, pipeline.suffix)
    assert {f"--source-disk={bake.vm_name}", f"--source-disk-zone={bake.zone}", f"--family={family}"} <= set(
        image
    )
    script = steps[2].command.stdin_text or ""
    assert f"sudo docker pull {shlex.quote(PINNED.split(':1.0@')[0] + '@' + DIGEST)}" in script
    # a tag is pulled by the digest its family names, then tagged as what training runs
    tagged = boot_image.bake_script("us-docker.pkg.dev/p/r/img:0.2.4", DIGEST)
    assert f"sudo docker pull us-docker.pkg.dev/p/r/img@{DIGEST}\n" in tagged
    assert f"sudo docker tag us-docker.pkg.dev/p/r/img@{DIGEST} us-docker.pkg.dev/p/r/img:0.2.4\n" in tagged
    assert [s.command.argv[1:5] for s in _steps({}, "delete_bake_vm")] == [
        ("compute", "instances", "delete", bake.vm_name)
    ]


def test_with_a_baked_image_the_plan_shows_no_install_and_no_pull_on_the_tpu_vm() -> None:
    family = boot_image.family_of(DIGEST)
    (create, *_grants) = _steps({"workload_image": PINNED}, "create_vm")
    assert {f"--image-family={family}", f"--image-project={CONF['project']}"} <= set(create.command.argv)
    (install,) = _steps({"workload_image": PINNED}, "install_maxtext")
    script = install.command.stdin_text or ""
    assert not [word for word in INSTALLS if word in script]
    assert f"sudo docker image inspect '--format={{{{.Id}}}}' {shlex.quote(PINNED)}" in script
    assert install.command.description.startswith(
        "check that the baked boot image holds the TPU devices, Docker"
    )
    assert "if [ ! -e /dev/vfio/vfio ] || ! compgen -G '/dev/vfio/[0-9]*' >/dev/null; then" in script
    # the CPU VM pulls the image (it is not TPU time)
    (cpu,) = _steps({"workload_image": PINNED}, "install_cpu_vm")
    assert f"sudo docker pull {PINNED}" in (cpu.command.stdin_text or "")


def test_without_a_bake_the_tpu_vm_boots_from_its_family_and_pays_the_install() -> None:
    for conf in ({"runtime": "install"}, {"bake_image": False}):
        assert not tpu_vm_pipeline_from_conf({**CONF, **conf}).bakes
        assert _steps(conf, "bake_image") == []
        assert _steps(conf, "delete_bake_vm") == []
        (create, *_grants) = _steps(conf, "create_vm")
        assert "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e" in create.command.argv
        assert "--image-project=ubuntu-os-accelerator-images" in create.command.argv
    # the switch off: install_maxtext installs Docker and pulls on the billed TPU VM
    (install,) = _steps({"bake_image": False}, "install_maxtext")
    script = install.command.stdin_text or ""
    assert "apt-get" in script
    assert f"sudo docker pull {tpu_vm_pipeline_from_conf(CONF).workload_image}" in script


def test_bake_image_is_on_by_default_and_a_non_boolean_is_refused_in_one_line() -> None:
    assert tpu_vm_pipeline_from_conf(CONF).bakes
    with pytest.raises(SpecError, match="bake_image") as refused:
        tpu_vm_pipeline_from_conf({**CONF, "bake_image": "sometimes"})
    assert "\n" not in str(refused.value)


def test_the_stage_scripts_are_valid_bash() -> None:
    import subprocess

    pipeline = tpu_vm_pipeline_from_conf(CONF)
    family = boot_image.family_of(DIGEST)
    for script in (
        boot_image.bake_script(pipeline.workload_image, DIGEST),
        tpu_vm.boot_check_script(pipeline.workload_image, family),
    ):
        done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
