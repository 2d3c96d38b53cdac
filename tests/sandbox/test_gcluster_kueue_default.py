"""The kubectl-apply module ``gcluster create`` writes, and the Kueue queue it applies, per release.

cluster-toolkit (git ls-tree and show at each tag): ``modules/management/kubectl-apply/kueue/``
holds ``pathways.yaml.tftpl`` up to v1.91.0 and ``kueue-configuration-pathways.yaml.tftpl`` (#5628)
from v1.92.0; main.tf at v1.92.0 l.22-24 applies the latter when the blueprint names no
``config_path``, main.tf at v1.91.0 l.22-35 only the former's cpu/memory queue (Pathways on).
pkg/modulewriter/modulewriter.go: embedded modules go to ``<deployment>/_modules/embedded/`` from
v1.91.0, to ``<deployment>/<group>/modules/embedded/`` before.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, deploy_args, job_status, make_cluster, submit_args
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

KUBECTL_APPLY = Path("modules/management/kubectl-apply")


@pytest.fixture
def edited(cli: Cli, tmp_path: Path) -> Path:
    """The bundle's develop-shape blueprint as the provider edits it: no kueue config_path."""
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    blueprint = folder / cli.info.blueprint.name
    blueprint.write_text(
        customize_blueprint(cli.info.blueprint.read_text(), PRESETS["qwen3-30b-a3b"].blueprint)
    )
    assert "config_path" not in blueprint.read_text().split("workload-manager-install", 1)[1]
    return blueprint


@pytest.mark.parametrize(
    ("release", "where", "kueue_files"),
    [
        (None, "_modules", ["kueue-configuration-pathways.yaml.tftpl", "kueue-helm-values.yaml"]),
        ("v1.92.0", "_modules", ["kueue-configuration-pathways.yaml.tftpl", "kueue-helm-values.yaml"]),
        ("v1.91.0", "_modules", ["kueue-helm-values.yaml", "pathways.yaml.tftpl"]),
        ("v1.90.0", "primary/modules", ["kueue-helm-values.yaml", "pathways.yaml.tftpl"]),
    ],
)
def test_create_writes_the_kubectl_apply_module_of_the_release_it_plays(
    cli: Cli, names: dict[str, str], edited: Path, release: str | None, where: str, kueue_files: list[str]
) -> None:
    if release:
        update_settings(cli.layout, gcluster_release={"version": release})
    try:
        created = cli.gcluster("create", str(edited), *deploy_args(names, backend=False)[:-2], "-w")
    finally:
        reset_settings(cli.layout)
    assert created.code == 0, created.text
    module = cli.cwd / names["cluster"] / where / "embedded" / KUBECTL_APPLY
    assert sorted(p.name for p in (module / "kueue").iterdir()) == kueue_files
    other = "primary/modules" if where == "_modules" else "_modules"
    assert not (cli.cwd / names["cluster"] / other).exists()


def _queue(cli: Cli, names: dict[str, str]) -> dict[str, object]:
    (cluster,) = [c for c in cli.state("clusters").values() if c["name"] == names["cluster"]]
    queue: dict[str, object] = cluster["kueue"]
    return queue


def test_without_the_default_template_no_queue_admits_a_tpu_job(
    cli: Cli, names: dict[str, str], edited: Path
) -> None:
    """v1.91.0's kubectl-apply has no default: only its Pathways queue (cpu, memory) is applied,
    so a TPU job stays suspended for ever."""
    update_settings(cli.layout, gcluster_release={"version": "v1.91.0"})
    try:
        cluster = make_cluster(cli, names, edited)
    finally:
        reset_settings(cli.layout)
    assert _queue(cli, names)["covered"] == ["cpu", "memory"]
    assert cli.gcluster(*submit_args("tpu-stuck", "echo hi")).code == 0
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert job_status(cli, cluster, "tpu-stuck") == "Suspended"
        time.sleep(0.2)
    assert cli.gcluster("job", "cancel", "tpu-stuck").code == 0


def test_before_v1_91_the_module_applies_no_queue_at_all(
    cli: Cli, names: dict[str, str], edited: Path
) -> None:
    """Up to v1.90.0 kubectl-apply has no enable_pathways_for_tpus variable, and the edited
    blueprint sets no kueue.enable_pathways_for_tpus: no ClusterQueue."""
    update_settings(cli.layout, gcluster_release={"version": "v1.90.0"})
    try:
        make_cluster(cli, names, edited)
    finally:
        reset_settings(cli.layout)
    assert _queue(cli, names)["covered"] == []


def test_the_pinned_release_applies_the_default_queue(cli: Cli, names: dict[str, str], edited: Path) -> None:
    make_cluster(cli, names, edited)
    assert _queue(cli, names)["covered"] == ["google.com/tpu", "cpu", "memory"]


def test_a_var_left_empty_is_refused_as_gcluster_refuses_it(cli: Cli, names: dict[str, str]) -> None:
    """pkg/config/validate.go validateVars: every blueprint var needs a value."""
    args = deploy_args(names, backend=False)[:-2]
    variables = args[1].replace(",reservation=res-1", "")
    created = cli.gcluster("create", str(cli.info.blueprint), "--vars", variables, *args[2:])
    assert created.code == 1
    assert created.err.rstrip().endswith(
        'Error: vars.reservation: deployment variable "reservation" was not set'
    )
    assert not (cli.cwd / names["cluster"]).exists()
