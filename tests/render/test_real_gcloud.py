"""Every gcloud command the renderer can produce, through the real Google Cloud CLI's parser.

With an empty ``CLOUDSDK_CONFIG`` and no account, gcloud parses the whole command line first and
then fails with "You do not currently have an active account selected"; a wrong command group,
flag or flag value fails earlier with a parse error. Nothing reaches the network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render import billing, existing_cluster, gke, tpu_vm
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.render.plan import gke_plan, tpu_vm_plan
from airflow_provider_tpu_rl.spec import PRESETS, Runner, gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.cluster import SliceShape
from airflow_provider_tpu_rl.spec.existing_cluster import RunPools, parse_existing_cluster
from tests.support.gcloud_batch import run_gcloud_commands

GCLOUD = shutil.which("gcloud")
pytestmark = pytest.mark.skipif(
    GCLOUD is None,
    reason="the Google Cloud CLI is not installed (Debian/Ubuntu: apt-get install google-cloud-cli, "
    "or see cloud.google.com/sdk/docs/install); this test runs its real argument parser offline",
)
NO_ACCOUNT = "You do not currently have an active account selected"
PARSE_ERROR = re.compile(
    r"unrecognized arguments|Invalid choice|argument [-\w]+: |expected one argument|is not a valid|"
    r"must be specified|Bad value|invalid value",
    re.IGNORECASE,
)
PROJECT = "my-proj-123"
SERVICE_ACCOUNT = f"tpu-vm-sa@{PROJECT}.iam.gserviceaccount.com"

# One clock for every plan: a VM's expiry label is read from it, and the commands are the test's
# parameters, which each xdist worker collects again (a second ticking between two plans made two
# workers collect different tests).
PLAN_CLOCK = 1_767_225_600.0


def _gcloud(commands: Iterator[tuple[str, Command]]) -> dict[tuple[str, ...], set[str]]:
    """Unique gcloud argv → the tasks (or callers) that run it."""
    found: dict[tuple[str, ...], set[str]] = {}
    for where, command in commands:
        if command.tool == "gcloud":
            found.setdefault(tuple(command.argv), set()).add(where)
    return found


def rendered_gcloud_commands() -> dict[tuple[str, ...], set[str]]:
    """Every gcloud command of both pipelines (all presets, the switches on and off) and the janitor."""

    def all_commands() -> Iterator[tuple[str, Command]]:
        for model, preset in PRESETS.items():
            for extra in (
                {},
                {
                    "delete_bucket": True,
                    "hf_token_secret": "my-hf-secret",
                    "keep_cluster": True,
                    "image_repository": "tpu-rl-images",
                },
            ):
                if preset.runner is Runner.GKE:
                    conf = {
                        "model": model,
                        "project": PROJECT,
                        "bucket": "my-bkt",
                        "reservation": "res-1",
                        **extra,
                    }
                    yield from ((s.task_id, s.command) for s in gke_plan(gke_pipeline_from_conf(conf)))
                else:
                    extra = {k: v for k, v in extra.items() if k not in ("keep_cluster", "image_repository")}
                    conf = {
                        "model": model,
                        "project": PROJECT,
                        "bucket": "my-bkt",
                        "service_account": SERVICE_ACCOUNT,
                    }
                    yield from (
                        (s.task_id, s.command)
                        for s in tpu_vm_plan(tpu_vm_pipeline_from_conf({**conf, **extra}), now=PLAN_CLOCK)
                    )
                    # a workload image pinned by digest: the bake's real family, no tag to resolve
                    pinned = {**conf, "workload_image": f"us-docker.pkg.dev/p/r/img@sha256:{'ab' * 32}"}
                    yield from (
                        (s.task_id, s.command)
                        for s in tpu_vm_plan(tpu_vm_pipeline_from_conf(pinned), now=PLAN_CLOCK)
                    )
                    # the TPU VM's other capacities: a reservation's, and none (flex-start on the
                    # alpha track)
                    for capacity in ("reservation", "spot", "flex-start"):
                        reservation = "res-8" if capacity == "reservation" else ""
                        other = {**conf, **extra, "capacity": capacity, "reservation": reservation}
                        yield from (
                            (s.task_id, s.command)
                            for s in tpu_vm_plan(tpu_vm_pipeline_from_conf(other), now=PLAN_CLOCK)
                            if s.task_id == "create_vm"
                        )
        yield "janitor", gke.list_managed_clusters(PROJECT)
        yield "janitor", tpu_vm.list_managed_vms(PROJECT)
        yield "janitor", tpu_vm.delete_vm_named(PROJECT, "us-east5-b", "tpu-rl-vm")
        # a train retry's look at, and start of, a TPU VM lost under training
        vm = tpu_vm_pipeline_from_conf(
            {"model": "llama3.1-8b-Instruct", "project": PROJECT, "bucket": "my-bkt", "reservation": "res-8"}
        ).vm
        yield "train", tpu_vm.describe_vm_status(vm)
        yield "train", tpu_vm.start_vm(vm)
        # the machines' clocks, read for the ledger (render/billing.py)
        yield "delete_vm", billing.describe_instance(PROJECT, "us-east5-b", "tpu-rl-vm")
        yield "delete_vm", billing.list_instance_operations(PROJECT, "us-east5-b", ["tpu-rl-vm"])
        yield "destroy_tpu_pool", billing.list_pool_nodes(PROJECT, "us-east5-b", "c1", ["gke-tpu-v6e-pool"])
        yield (
            "destroy_tpu_pool",
            billing.list_instance_operations(
                PROJECT, "us-east5-b", ["gke-c1-gke-tpu-v6e-pool-1a2b3c4d"], group_bases=True
            ),
        )
        yield from existing_cluster_commands()

    return _gcloud(all_commands())


def existing_cluster_commands() -> Iterator[tuple[str, Command]]:
    """A run on a cluster it does not own: its reads, its own pools (each capacity), their delete."""
    cluster = parse_existing_cluster(f"{PROJECT}/us-east5/team-tpu")
    pools = RunPools(cluster, "1a2b3c", "us-east5-b", SliceShape("ct6e-standard-4t", "4x8"))
    labels = gke.managed_labels("tpu_rl_gke_pipeline", "1a2b3c", "my-bkt", int(PLAN_CLOCK))
    yield "preflight", existing_cluster.describe_cluster(cluster)
    yield "destroy_tpu_pool", existing_cluster.list_pools(cluster)
    for capacity in ("on-demand", "reservation", "spot", "flex-start"):
        reservation = "res-1" if capacity == "reservation" else ""
        yield (
            "deploy_tpu_pool",
            existing_cluster.create_tpu_pool(
                pools, 0, capacity=capacity, reservation=reservation, labels=labels
            ),
        )
    yield "deploy_cluster", existing_cluster.create_cpu_pool(pools, "n4-standard-64", labels)
    yield "destroy_tpu_pool", existing_cluster.delete_pool(cluster, pools.tpu_pools[0])


COMMANDS = rendered_gcloud_commands()


def offline_env(home: Path) -> dict[str, str]:
    """No account, no prompts, gcloud's config and HOME in a temp dir (never the real HOME)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "LANG": "C.UTF-8",
    }


def run_gcloud(argv: tuple[str, ...], home: Path) -> tuple[int, str]:
    """The real gcloud on ``argv`` (its ``argv[0]`` is the tool name): exit code and output."""
    done = subprocess.run(
        [str(GCLOUD), *argv[1:]],
        env=offline_env(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=home,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], tuple[int, str]]:
    """Each command's exit code and output under the real gcloud, no account, HOME in a temp dir:
    gcloud loaded once, each command in a process of its own forked from it
    (tests/support/gcloud_batch.py; the single-command tests below start the launcher itself)."""
    home = tmp_path_factory.mktemp("home")
    commands = list(COMMANDS)
    assert GCLOUD is not None
    results = run_gcloud_commands(GCLOUD, [argv[1:] for argv in commands], offline_env(home), home)
    return dict(zip(commands, results, strict=True))


def test_the_commands_cover_every_gcloud_task() -> None:
    tasks = set().union(*COMMANDS.values())
    assert {"preflight", "ensure_bucket", "sync_hf_token", "convert_to_maxtext", "create_vm"} <= tasks
    assert {"install_maxtext", "train", "export_to_huggingface", "delete_vm", "janitor"} <= tasks
    assert {"create_cpu_vm", "install_cpu_vm", "delete_cpu_vm"} <= tasks
    assert "copy_workload_image" in tasks  # the GKE image's copy for streaming (image_repository named)
    # both VMs' create commands go through the parser: the TPU VM's and the CPU VM's
    creates = [argv for argv in COMMANDS if argv[1:4] == ("compute", "instances", "create")]
    assert {a for argv in creates for a in argv if a.startswith("--machine-type=")} == {
        "--machine-type=ct6e-standard-8t",
        "--machine-type=n2-highmem-32",
        "--machine-type=n2-standard-8",  # the boot image's bake VM
    }
    # the TPU VM's four capacities (flex-start's create is on the alpha track)
    models = {a for argv in COMMANDS for a in argv if a.startswith("--provisioning-model=")}
    assert models == {
        f"--provisioning-model={m}" for m in ("STANDARD", "RESERVATION_BOUND", "SPOT", "FLEX_START")
    }
    assert any(argv[1:5] == ("alpha", "compute", "instances", "create") for argv in COMMANDS)
    groups = {argv[1] for argv in COMMANDS}
    assert groups == {"services", "storage", "secrets", "auth", "compute", "container", "alpha", "artifacts"}


@pytest.mark.parametrize("argv", list(COMMANDS), ids=lambda a: f"{min(COMMANDS[a])}:{' '.join(a[1:4])}")
def test_real_gcloud_parses_the_command(
    parsed: dict[tuple[str, ...], tuple[int, str]], argv: tuple[str, ...]
) -> None:
    code, output = parsed[argv]
    assert not PARSE_ERROR.search(output), f"gcloud refused {' '.join(argv)}:\n{output[-2000:]}"
    # Parsed: it then stops for lack of an account (or, for a local-only command, succeeds).
    assert code == 0 or NO_ACCOUNT in output, f"{' '.join(argv)} -> {code}:\n{output[-2000:]}"


def test_ga_gcloud_refuses_flex_start(tmp_path: Path) -> None:
    """FLEX_START is an alpha-track choice: the GA create refuses it, so it is rendered on alpha."""
    conf = {"project": PROJECT, "bucket": "my-bkt", "capacity": "flex-start", "reservation": ""}
    create = tpu_vm.create_vm(tpu_vm_pipeline_from_conf(conf).vm)
    assert create.argv[1] == "alpha"
    code, output = run_gcloud(("gcloud", *create.argv[2:]), tmp_path)
    assert code != 0
    assert "Invalid choice: 'FLEX_START'" in output
    assert NO_ACCOUNT not in output


def test_the_parser_refuses_a_wrong_flag(tmp_path: Path) -> None:
    """The check above can fail: a misspelt flag is a parse error, not an account error."""
    code, output = run_gcloud(
        ("gcloud", "storage", "buckets", "create", "gs://b", f"--project={PROJECT}", "--locationn=us-east5"),
        tmp_path,
    )
    assert code != 0
    assert PARSE_ERROR.search(output)
    assert NO_ACCOUNT not in output
