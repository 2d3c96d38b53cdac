"""What a first real run needs from the rendered commands: IAM that works non-interactively, one
kept SSH key, the VM's own service account granted, and a preflight before anything is created."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.render.plan import (
    PLAN_DEFAULT_SERVICE_ACCOUNT,
    PLAN_SSH_KEY_FILE,
    PlanStep,
    gke_plan,
    tpu_vm_plan,
)
from airflow_provider_tpu_rl.spec import (
    PRESETS,
    Runner,
    gke_pipeline_from_conf,
    tpu_vm_pipeline_from_conf,
)

PROJECT = "my-proj-123"
SERVICE_ACCOUNT = f"tpu-vm-sa@{PROJECT}.iam.gserviceaccount.com"


def all_plans() -> Iterator[tuple[str, list[PlanStep]]]:
    for model, preset in PRESETS.items():
        if preset.runner is Runner.GKE:
            for reservation in ("res-1", ""):
                conf = {"model": model, "project": PROJECT, "bucket": "my-bkt", "reservation": reservation}
                yield model, gke_plan(gke_pipeline_from_conf(conf))
        else:
            for account in ({}, {"service_account": SERVICE_ACCOUNT}):
                conf = {"model": model, "project": PROJECT, "bucket": "my-bkt", **account}
                yield model, tpu_vm_plan(tpu_vm_pipeline_from_conf(conf))


PLANS = list(all_plans())


@pytest.mark.parametrize(("model", "plan"), PLANS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(PLANS)])
def test_every_iam_binding_names_its_condition_and_none_is_project_wide(
    model: str, plan: list[PlanStep]
) -> None:
    bindings = [s.command.argv for s in plan if "add-iam-policy-binding" in s.command.argv]
    assert bindings, "the runs grant access to the token secret"
    for argv in bindings:
        # gcloud refuses a binding without --condition in non-interactive mode when the policy
        # already holds a conditional binding (googlecloudsdk/command_lib/iam/iam_util.py)
        assert "--condition=None" in argv, argv
        assert argv[1] != "projects", f"a project-wide grant: {argv}"


@pytest.mark.parametrize(("model", "plan"), PLANS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(PLANS)])
def test_preflight_comes_right_after_validate_and_only_reads(model: str, plan: list[PlanStep]) -> None:
    tasks = list(dict.fromkeys(s.task_id for s in plan))
    assert tasks[0] == "preflight"
    reads = [s.command.argv for s in plan if s.task_id == "preflight"]
    read_only = (
        ("gcluster", "export-outputs"),  # gcluster's dependency check, in an empty folder
        ("gcluster", "create"),  # the edited blueprint expanded into a temporary folder
        ("gcloud", "auth", "list"),
        ("gcloud", "services", "list", "--enabled"),
        ("gcloud", "compute", "reservations", "describe"),
        ("gcloud", "compute", "regions", "describe"),
        ("gcloud", "compute", "project-info", "describe"),
        ("gcloud", "compute", "networks", "describe"),
        ("gcloud", "compute", "firewall-rules", "list"),
        ("gcloud", "version"),
    )
    assert reads
    for argv in reads:
        assert any(argv[: len(read)] == read for read in read_only), argv


def test_the_reservation_is_described_when_one_is_named() -> None:
    conf = {"model": "gemma4-26b", "project": PROJECT, "bucket": "b-1", "reservation": "res-1"}
    plan = gke_plan(gke_pipeline_from_conf(conf))
    (describe,) = [
        s.command.argv for s in plan if s.command.argv[1:4] == ("compute", "reservations", "describe")
    ]
    assert describe[4] == "res-1"
    assert "--zone=us-east5-b" in describe
    no_reservation = gke_plan(gke_pipeline_from_conf({**conf, "reservation": ""}))
    assert not [s for s in no_reservation if "reservations" in s.command.argv]


def test_every_ssh_stage_uses_one_kept_key_that_expires() -> None:
    plan = tpu_vm_plan(tpu_vm_pipeline_from_conf({"project": PROJECT, "bucket": "b-1"}))
    ssh = [s.command.argv for s in plan if s.command.argv[1:3] == ("compute", "ssh")]
    # every stage once, the install twice (on the CPU VM and on the TPU VM), and the boot image's bake
    assert len(ssh) == len(tpu_vm.STAGES) + 2
    for argv in ssh:
        assert f"--ssh-key-file={PLAN_SSH_KEY_FILE}" in argv
        assert f"--ssh-key-expire-after={tpu_vm.SSH_KEY_LIFETIME}" in argv


@pytest.mark.parametrize("account", [None, SERVICE_ACCOUNT])
def test_create_vm_grants_the_vms_own_service_account_the_secret_and_the_bucket(account: str | None) -> None:
    conf = {"project": PROJECT, "bucket": "b-1", **({"service_account": account} if account else {})}
    pipeline = tpu_vm_pipeline_from_conf(conf)
    steps = [s.command.argv for s in tpu_vm_plan(pipeline) if s.task_id == "create_vm"]
    create, describe, secret, bucket = steps
    assert create[1:4] == ("compute", "instances", "create")
    assert describe[1:4] == ("compute", "instances", "describe")
    assert "--format=value(serviceAccounts[0].email)" in describe
    member = f"--member=serviceAccount:{account or PLAN_DEFAULT_SERVICE_ACCOUNT}"
    assert secret[1:4] == ("secrets", "add-iam-policy-binding", pipeline.hf_token.secret_id)
    assert {member, "--role=roles/secretmanager.secretAccessor"} <= set(secret)
    assert bucket[1:5] == ("storage", "buckets", "add-iam-policy-binding", "gs://b-1")
    assert {member, "--role=roles/storage.objectAdmin"} <= set(bucket)
    # sync_hf_token grants nobody: the grant follows the VM's real account, named or default
    sync = [s.command.argv for s in tpu_vm_plan(pipeline) if s.task_id == "sync_hf_token"]
    assert not [a for a in sync if "add-iam-policy-binding" in a]
