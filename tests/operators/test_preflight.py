"""``preflight`` against the sandbox: the real operator, fake gcloud/gcluster, the fake Resource Manager.

Each refusal (a missing API, permission, reservation, tool, account, a Terraform gcluster itself
would refuse, a TPU VM network SSH cannot reach) is one line naming what to do, and the operator
creates nothing: the only commands it runs are gcloud reads and, for the GKE runner, gcluster's
own dependency check.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.maxtext.layout import run_record_object
from airflow_provider_tpu_rl.operators import preflight
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator, error_line
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, Lease
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from airflow_provider_tpu_rl.spec.pipeline import GKE_DAG_ID
from tests.support.sandbox_run import SandboxRun, api_server
from tests.support.toolpath import path_without
from tests.support.waiting import HANG_BOUND
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.world import vpc
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.settings import (
    DEFAULT_RESERVATIONS,
    SandboxSettings,
    reset_settings,
    update_settings,
)

READS = (
    ("auth", "list"),
    ("services", "list"),
    ("compute", "reservations", "describe"),
    ("compute", "networks", "describe"),
    ("compute", "firewall-rules", "list"),
    ("compute", "project-info", "describe"),
    ("version",),
    ("compute", "regions", "describe"),
)


@pytest.fixture
def pf(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxRun]:
    """The sandbox with its Resource Manager API server; settings back to the defaults around the test."""
    reset_settings(sb.layout)
    try:
        with api_server(sb.layout) as url:
            monkeypatch.setenv("AIRFLOW__TPU_RL__RESOURCE_MANAGER_ENDPOINT", url)
            yield sb
    finally:
        reset_settings(sb.layout)


def _run(sb: SandboxRun, dag_id: str = GKE_DAG_ID, **conf_overrides: Any) -> dict[str, Any]:
    conf = sb.tpu_vm_conf(**conf_overrides) if dag_id == TPU_VM_DAG_ID else sb.gke_conf(**conf_overrides)
    operator = sb.operator(TpuRlPreflightOperator, dag_id, conf=conf, task_id="preflight")
    result: dict[str, Any] = operator.execute(sb.context(operator, conf))
    return result


def _refusal(sb: SandboxRun, dag_id: str = GKE_DAG_ID, **conf_overrides: Any) -> list[str]:
    """The failure's lines: the summary first, then one per problem."""
    with pytest.raises(AirflowFailException) as failed:
        _run(sb, dag_id, **conf_overrides)
    lines = str(failed.value).splitlines()
    count = len(lines) - 1
    assert lines[0] == f"preflight: {count} problem{'' if count == 1 else 's'} before anything is created:"
    assert all(line.startswith("- ") for line in lines[1:])
    return [line[2:] for line in lines[1:]]


def _is_blueprint_check(call: dict[str, Any]) -> bool:
    """The GKE preflight's ``gcluster create`` of the edited blueprint into its temporary folder."""
    argv = call["argv"]
    return (
        call["tool"] == "gcluster"
        and argv[0] == "create"
        and "/tpu-rl-blueprint-check-" in argv[1]
        and argv[-3:-1] == ["-l", "IGNORE"]
    )


def _created_nothing(sb: SandboxRun) -> None:
    """Only the reads ran; no cluster, VM, bucket or secret exists."""
    calls = sb.calls()
    assert calls, "the preflight ran no gcloud command"
    for call in calls:
        if _is_blueprint_check(call):
            continue
        assert call["tool"] == "gcloud", call
        assert any(call["argv"][: len(read)] == list(read) for read in READS), call["argv"]
    assert sb.cluster_record() is None
    assert not any(key.startswith(f"{sb.project}/") for key in sb.state("vms"))
    assert not sb.bucket_exists()


def test_the_permission_client_loads_on_its_thread_while_the_gcloud_reads_run(
    pf: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Resource Manager client's import (about 0.6 s) overlaps the toolchain and gcloud checks."""
    loading = threading.Event()
    seen: dict[str, Any] = {}

    def load_permission_client() -> None:
        seen["thread"] = threading.current_thread().name
        loading.set()

    check_toolchain = TpuRlPreflightOperator.check_toolchain

    def toolchain_after_the_load_began(self: TpuRlPreflightOperator, run: Any) -> list[str]:
        seen["loading before the toolchain check"] = loading.wait(timeout=HANG_BOUND)
        return check_toolchain(self, run)

    monkeypatch.setattr(preflight, "load_permission_client", load_permission_client)
    monkeypatch.setattr(TpuRlPreflightOperator, "check_toolchain", toolchain_after_the_load_began)
    assert _run(pf)["permissions_checked"] > 0
    assert seen["loading before the toolchain check"] is True
    assert seen["thread"].startswith("preflight")


def test_a_disabled_api_is_one_line_naming_the_enable_command(pf: SandboxRun) -> None:
    update_settings(pf.layout, disabled_services=("container.googleapis.com",))
    (line,) = _refusal(pf)
    assert f"gcloud services enable container.googleapis.com --project={pf.project}" in line
    _created_nothing(pf)


def test_streaming_without_the_container_file_system_api_is_one_line(pf: SandboxRun) -> None:
    """issue 53 item 5: a run that streams its image (image_repository named) needs the API."""
    update_settings(pf.layout, disabled_services=("containerfilesystem.googleapis.com",))
    _run(pf)  # a run that does not stream passes without it
    (line,) = _refusal(pf, image_repository="tpu-rl-images")
    assert f"gcloud services enable containerfilesystem.googleapis.com --project={pf.project}" in line
    _created_nothing(pf)


def _gcloud(sb: SandboxRun, *argv: str) -> str:
    """A fake gcloud command run in-process (not among the recorded calls): the project's set-up."""
    err: list[str] = []
    code = Gcloud(sb.layout, {}, lambda: b"", lambda _: None, err.append).run(list(argv))
    assert code == 0, "".join(err)
    return "".join(err)


def test_the_tpu_vms_missing_network_is_one_line(pf: SandboxRun) -> None:
    vpc.delete_network(pf.layout, pf.project, "default")
    (line,) = _refusal(pf, TPU_VM_DAG_ID)
    assert line.startswith(f"network default does not exist in project {pf.project}:")
    assert f"gcloud compute networks create default --project={pf.project}" in line
    _created_nothing(pf)


def test_no_firewall_rule_for_ssh_is_one_line_naming_the_rule_to_create(pf: SandboxRun) -> None:
    _gcloud(pf, "compute", "firewall-rules", "delete", "default-allow-ssh", f"--project={pf.project}")
    (line,) = _refusal(pf, TPU_VM_DAG_ID)
    fix = (
        f"gcloud compute firewall-rules create tpu-rl-allow-ssh --project={pf.project} --network=default "
        "--direction=INGRESS --allow=tcp:22 --source-ranges=0.0.0.0/0"
    )
    assert line.startswith(f"no firewall rule on network default of project {pf.project} allows SSH (tcp:22)")
    assert line.endswith(fix)
    _created_nothing(pf)
    # the named fix is what the fake gcloud accepts, and preflight then passes
    _gcloud(pf, *fix.split()[1:])
    assert _run(pf, TPU_VM_DAG_ID)["runner"] == "tpu_vm"


def test_a_rule_not_covering_the_workers_ranges_is_one_line(pf: SandboxRun) -> None:
    _gcloud(pf, "compute", "firewall-rules", "delete", "default-allow-ssh", f"--project={pf.project}")
    _gcloud(
        pf,
        "compute",
        "firewall-rules",
        "create",
        "office-ssh",
        f"--project={pf.project}",
        "--allow=tcp:22",
        "--source-ranges=198.51.100.0/24",
    )
    conf = pf.tpu_vm_conf()
    operator = pf.operator(TpuRlPreflightOperator, TPU_VM_DAG_ID, conf=conf, task_id="preflight")
    operator.ssh_source_ranges = ["203.0.113.0/28"]
    with pytest.raises(AirflowFailException) as failed:
        operator.execute(pf.context(operator, conf))
    assert "from the provider's address (203.0.113.0/28)" in str(failed.value)
    operator.ssh_source_ranges = ["198.51.100.7/32"]
    assert operator.execute(pf.context(operator, conf))["runner"] == "tpu_vm"


def test_os_login_without_admin_login_is_one_line(pf: SandboxRun) -> None:
    _run(pf, TPU_VM_DAG_ID)  # OS Login not enforced: osAdminLogin is not asked for
    update_settings(pf.layout, denied_permissions=("compute.instances.osAdminLogin",))
    assert _run(pf, TPU_VM_DAG_ID)["runner"] == "tpu_vm"
    _gcloud(
        pf,
        "compute",
        "project-info",
        "add-metadata",
        f"--project={pf.project}",
        "--metadata=enable-oslogin=TRUE",
    )
    (line,) = _refusal(pf, TPU_VM_DAG_ID)
    assert line.startswith(
        f"the caller lacks compute.instances.osAdminLogin on project {pf.project} (OS Login is enforced"
    )
    assert "--role=roles/compute.osAdminLogin" in line


def test_a_missing_reservation_is_one_line(pf: SandboxRun) -> None:
    (line,) = _refusal(pf, reservation="res-nowhere")
    assert f"reservation res-nowhere does not exist in zone us-east5-b of project {pf.project}" in line
    _created_nothing(pf)


def test_a_reservation_too_small_for_the_slices_is_one_line(pf: SandboxRun) -> None:
    (line,) = _refusal(pf, num_slices=2)
    assert "reservation res-1 reserves 8 ct6e-standard-4t VMs" in line
    assert "needs 16" in line


@pytest.mark.parametrize("dag_id", [GKE_DAG_ID, TPU_VM_DAG_ID])
@pytest.mark.parametrize("capacity", ["on-demand", "spot", "flex-start"])
def test_on_demand_spot_and_flex_start_check_no_reservation(
    pf: SandboxRun, dag_id: str, capacity: str
) -> None:
    result = _run(pf, dag_id, capacity=capacity, reservation="")
    assert (result["capacity"], result["reservation"], result["reservation_vms"]) == (capacity, None, None)
    assert not any(call["argv"][:3] == ["compute", "reservations", "describe"] for call in pf.calls())
    _created_nothing(pf)


def test_a_spot_preflight_naming_a_reservation_is_one_line(pf: SandboxRun) -> None:
    operator = pf.operator(TpuRlPreflightOperator, task_id="preflight", capacity="spot")
    with pytest.raises(
        AirflowFailException,
        match=r"capacity: spot capacity consumes no reservation: clear reservation \(res-1\)",
    ):
        operator.execute(pf.context(operator, pf.gke_conf(), apply_arguments=False))


def test_reservation_capacity_naming_no_reservation_is_one_line(pf: SandboxRun) -> None:
    operator = pf.operator(
        TpuRlPreflightOperator, task_id="preflight", capacity="reservation", reservation=""
    )
    with pytest.raises(
        AirflowFailException, match=r"^preflight: invalid argument: capacity: reservation capacity needs a"
    ):
        operator.execute(pf.context(operator, pf.gke_conf(), apply_arguments=False))


def test_without_a_capacity_a_named_reservation_is_consumed_and_none_is_on_demand(pf: SandboxRun) -> None:
    """An operator of one's own DAG that names no capacity: the reservation's, else on-demand."""
    for reservation, capacity in (("res-1", "reservation"), ("", "on-demand")):
        operator = pf.operator(
            TpuRlPreflightOperator, task_id="preflight", reservation=reservation, capacity=None
        )
        result = operator.execute(pf.context(operator, pf.gke_conf(), apply_arguments=False))
        assert (result["capacity"], result["reservation"]) == (capacity, reservation or None)


def test_every_problem_is_reported_at_once(pf: SandboxRun) -> None:
    update_settings(
        pf.layout,
        disabled_services=("secretmanager.googleapis.com", "storage.googleapis.com"),
        denied_permissions=("storage.buckets.create", "secretmanager.secrets.create"),
    )
    lines = _refusal(pf, TPU_VM_DAG_ID, reservation="res-nowhere")
    assert len(lines) == 5
    assert sum("gcloud services enable" in line for line in lines) == 2
    assert sum("--role=roles/" in line for line in lines) == 2
    assert "does not exist" in lines[-1]


@pytest.mark.parametrize("tool", ["terraform", "packer"])
def test_a_missing_deploy_tool_is_one_line(
    pf: SandboxRun, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    # Not on PATH, not next to the configured gcloud, none in a fresh cache, no download allowed.
    connection = json.loads(pf.info.env["AIRFLOW_CONN_GCLUSTER_DEFAULT"])
    gcloud_only = pf.work_dir / "gcloud-only"
    gcloud_only.mkdir()
    (gcloud_only / "gcloud").symlink_to(connection["extra"]["gcloud_path"])
    connection["extra"].update(
        gcloud_path=str(gcloud_only / "gcloud"),
        install_tools=False,
        cache_dir=str(pf.work_dir / "empty-cache"),
    )
    monkeypatch.setenv("AIRFLOW_CONN_GCLUSTER_DEFAULT", json.dumps(connection))
    monkeypatch.setenv("PATH", path_without([tool], pf.work_dir / "path"))
    lines = _refusal(pf)
    assert len(lines) == 1
    assert tool in lines[0]


def test_a_newer_gcluster_wanting_a_newer_terraform_is_one_line_naming_the_extra(pf: SandboxRun) -> None:
    """A gcluster release newer than the connection's terraform_version pin (here a hypothetical
    v1.200.0 requiring Terraform 1.14.0) would stop the deploy at its [y/N] prompt: preflight
    runs gcluster's own check without a prompt and says what to set, before anything is created."""
    update_settings(pf.layout, gcluster_release={"version": "v1.200.0", "terraform": "1.14.0"})
    before = len(read_calls(pf.layout))
    (line,) = _refusal(pf)
    assert line.startswith("gcluster v1.200.0 requires terraform >= 1.14.0 (found terraform 1.12.2 at "), line
    assert "the gcluster connection extra `terraform_version`" in line
    assert "set the gcluster connection extras terraform_version=1.14.0 and terraform_sha256" in line
    assert "terraform_1.14.0_SHA256SUMS" in line
    _created_nothing(pf)
    gcluster_calls = [call["argv"] for call in read_calls(pf.layout)[before:] if call["tool"] == "gcluster"]
    # the check, then `gcluster --version` for the line, and the blueprint's expansion: nothing else
    assert [argv[0] for argv in gcluster_calls] == ["export-outputs", "--version", "create"], gcluster_calls
    assert gcluster_calls[0][-1] == "--download-dependencies=false"


def test_the_gke_preflight_runs_gclusters_dependency_check(pf: SandboxRun) -> None:
    before = len(read_calls(pf.layout))
    assert _run(pf)["runner"] == "gke"
    gcluster_calls = [call["argv"] for call in read_calls(pf.layout)[before:] if call["tool"] == "gcluster"]
    assert [argv[0] for argv in gcluster_calls] == ["export-outputs", "create"]


def test_a_bad_shape_fails_before_any_command(pf: SandboxRun) -> None:
    conf = pf.gke_conf()
    operator = pf.operator(TpuRlPreflightOperator, GKE_DAG_ID, conf=conf, task_id="preflight")
    context = pf.context(operator, conf)
    operator.topology = "3x3"
    with pytest.raises(AirflowFailException, match="topology"):
        operator.execute(context)
    assert pf.calls() == []


def test_a_caller_who_cannot_list_apis_is_told_what_to_grant(pf: SandboxRun) -> None:
    update_settings(pf.layout, denied_permissions=("serviceusage.services.list",))
    listing, permission = _refusal(pf)
    assert listing.startswith(f"could not list the APIs enabled in project {pf.project} (ERROR:")
    assert "roles/serviceusage.serviceUsageConsumer" in listing
    assert "serviceusage.services.list" in permission
    _created_nothing(pf)


def test_a_caller_who_cannot_read_the_reservation_is_told_why(pf: SandboxRun) -> None:
    update_settings(pf.layout, denied_permissions=("compute.reservations.get",))
    permission, reading = _refusal(pf)
    assert reading.startswith("could not read reservation res-1 in zone us-east5-b (ERROR:")
    assert "Required 'compute.reservations.get' permission" in reading
    assert permission.startswith("the caller lacks compute.reservations.get")


def test_error_line_keeps_gclouds_reason() -> None:
    message = (
        "describe reservation failed with exit code 1 (config); last output:\n"
        "WARNING: noise\n"
        "ERROR: (gcloud.compute.reservations.describe) Could not fetch resource:\n"
        " - Required 'compute.reservations.get' permission for 'projects/p/zones/z/reservations/r'\n"
    )
    assert error_line(message) == (
        "ERROR: (gcloud.compute.reservations.describe) Could not fetch resource: "
        "- Required 'compute.reservations.get' permission for 'projects/p/zones/z/reservations/r'"
    )
    assert error_line("just one line") == "just one line"


# ------------------------------------------------------------------------------ the cluster lease
OTHER_RUN = "manual__2026-02-01T00:00:00+00:00"


def _gke_preflight(sb: SandboxRun) -> tuple[TpuRlPreflightOperator, Any]:
    """The GKE preflight with the cluster and bucket it checks the lease of."""
    conf = sb.gke_conf()
    operator = sb.operator(
        TpuRlPreflightOperator,
        GKE_DAG_ID,
        conf=conf,
        task_id="preflight",
        cluster_name=sb.cluster,
        bucket=sb.bucket,
    )
    return operator, sb.context(operator, conf)


def _lease_for(sb: SandboxRun, run_id: str, **kwargs: Any) -> Lease:
    if not sb.bucket_exists():
        sb.api.create_bucket(sb.bucket)
    return ClusterLeaseHook().acquire(
        sb.bucket, sb.cluster, dag_id=GKE_DAG_ID, run_id=run_id, ttl=kwargs.get("ttl", timedelta(hours=1))
    )


def test_a_free_expired_kept_or_own_lease_passes(pf: SandboxRun) -> None:
    operator, context = _gke_preflight(pf)
    assert operator.execute(context)["runner"] == "gke"  # no bucket yet: nobody holds a lease
    expired = _lease_for(pf, OTHER_RUN, ttl=timedelta(seconds=-1))
    assert operator.execute(context)["runner"] == "gke"
    hook = ClusterLeaseHook()
    own = hook.acquire(
        pf.bucket, pf.cluster, dag_id=GKE_DAG_ID, run_id=str(context["run_id"]), ttl=timedelta(hours=1)
    )
    assert own.generation != expired.generation
    assert operator.execute(context)["runner"] == "gke"
    hook.release(pf.bucket, own, keep=True)
    assert operator.execute(context)["runner"] == "gke"


# -- gcloud's account and gcluster's ADC (cmd/job/prereq.go ensureGCloudAuthenticated / getADCSetupCommand)
@pytest.mark.parametrize("dag_id", [GKE_DAG_ID, TPU_VM_DAG_ID])
def test_no_gcloud_account_is_one_line_and_no_other_gcloud_line(pf: SandboxRun, dag_id: str) -> None:
    update_settings(pf.layout, gcloud_logged_in=False)
    problems = _refusal(pf, dag_id)
    assert len(problems) == 1, problems
    assert problems[0].startswith("gcloud has no active account")
    assert "`gcloud auth login`" in problems[0]
    assert "gcloud auth activate-service-account" in problems[0]
    assert "Cloud Composer" in problems[0]
    _created_nothing(pf)


def test_no_adc_where_gcluster_runs_is_one_line(pf: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    # off Google Cloud: nothing answers as a metadata server (GCE_METADATA_HOST is not inherited)
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.adc.METADATA_HOST", "127.0.0.1:9")
    problems = _refusal(pf)
    assert len(problems) == 1, problems
    assert problems[0].startswith("gcluster job submit needs Application Default Credentials and finds none")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in problems[0]
    assert "gcloud auth application-default login" in problems[0]
    _created_nothing(pf)


def test_an_adc_file_the_worker_has_but_gcluster_cannot_see_is_named(
    pf: SandboxRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    key = pf.layout.root / "credentials" / "adc_service_account.json"
    config = tmp_path / "gcloud-config"
    config.mkdir()
    (config / "application_default_credentials.json").write_text(key.read_text())
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(config))
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.adc.METADATA_HOST", "127.0.0.1:9")
    (problem,) = _refusal(pf)
    wanted = f"GOOGLE_APPLICATION_CREDENTIALS={config / 'application_default_credentials.json'}"
    assert "gcluster runs with a fresh HOME" in problem, problem
    assert wanted in problem, problem


def test_an_adc_key_that_gives_no_token_is_one_line(
    pf: SandboxRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    key = json.loads((pf.layout.root / "credentials" / "adc_service_account.json").read_text())
    key["token_uri"] = "http://127.0.0.1:9/token"  # nothing listens there
    broken = tmp_path / "key.json"
    broken.write_text(json.dumps(key))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(broken))
    (problem,) = _refusal(pf)
    assert f"GOOGLE_APPLICATION_CREDENTIALS={broken}" in problem, problem


def test_the_tpu_vm_preflight_needs_no_adc(pf: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.adc.METADATA_HOST", "127.0.0.1:9")
    assert _run(pf, TPU_VM_DAG_ID)["runner"] == "tpu_vm"


def test_a_blueprint_the_edits_do_not_know_is_one_line_before_anything_is_made(pf: SandboxRun) -> None:
    """The bundle's blueprint is edited as the deploy will edit it (render/blueprint.py): a shape
    the edits do not know fails the preflight in one line, not the deploy after spending."""
    blueprint = pf.layout.bundle_dir / "examples" / "gke-tpu-v6e" / "gke-tpu-v6e-advanced.yaml"
    original = blueprint.read_text()
    blueprint.write_text(
        original.replace("  enable_pathways_for_tpus: true\n", "").replace(
            "      enable_pathways_for_tpus: $(vars.enable_pathways_for_tpus)\n", ""
        )
    )
    try:
        (line,) = _refusal(pf)
    finally:
        blueprint.write_text(original)  # the sandbox's bundle serves the module's other tests
    assert line.startswith("the Cluster Toolkit blueprint ")
    assert line.endswith(
        "does not take the run's edits: blueprint must set enable_pathways_for_tpus: true (in vars or on "
        "its gke-cluster module; it adds the cpu-np node pool the conversions run on)"
    )
    _created_nothing(pf)


def test_a_flex_start_tpu_vm_without_gcloud_alpha_is_one_line_before_anything_is_made(pf: SandboxRun) -> None:
    """Flex-start's create is ``gcloud alpha …``; a gcloud without the alpha component (one whose
    user cannot install it at run time) is named in one line, and nothing is created."""
    update_settings(pf.layout, gcloud_components=["beta"])
    (line,) = _refusal(pf, TPU_VM_DAG_ID, capacity="flex-start", reservation="")
    assert line.startswith(
        "flex-start capacity on a TPU VM runs `gcloud alpha compute instances create` (gcloud offers "
        "FLEX_START on its alpha track only) and this gcloud has no alpha component: install it"
    )
    _created_nothing(pf)
    # what the create itself would have met: gcloud's own refusal on an SDK its user cannot write
    err: list[str] = []
    code = Gcloud(pf.layout, {}, lambda: b"", lambda _: None, err.append).run(
        ["alpha", "compute", "instances", "create", "vm-1", "--zone=us-east5-b"]
    )
    assert code == 1
    assert err[0] == (
        "You do not currently have this command group installed.  Using it requires the installation of "
        "components: [alpha]\n"
    )
    assert err[1].startswith(
        "ERROR: (gcloud) You cannot perform this action because you do not have permission"
    )


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_other_capacities_need_no_gcloud_alpha(pf: SandboxRun, capacity: str) -> None:
    update_settings(pf.layout, gcloud_components=[])
    assert _run(pf, TPU_VM_DAG_ID, capacity=capacity, reservation="")["capacity"] == capacity


def test_the_default_gcloud_has_alpha_and_a_flex_start_tpu_vm_passes(pf: SandboxRun) -> None:
    assert _run(pf, TPU_VM_DAG_ID, capacity="flex-start", reservation="")["capacity"] == "flex-start"
    assert any(call["argv"] == ["version", "--format=json"] for call in read_calls(pf.layout))


@pytest.mark.parametrize(
    ("dag_id", "overrides"),
    [
        (GKE_DAG_ID, {}),
        (GKE_DAG_ID, {"capacity": "spot", "reservation": ""}),
        (TPU_VM_DAG_ID, {}),
        (TPU_VM_DAG_ID, {"capacity": "flex-start", "reservation": ""}),
    ],
)
def test_the_plan_shows_every_command_the_preflight_makes(
    pf: SandboxRun, dag_id: str, overrides: dict[str, Any]
) -> None:
    """``tpu-rl plan``'s preflight steps are the commands the task really runs, in its order, and
    the permission test as the API call it is."""
    from airflow_provider_tpu_rl.cli import build_plan

    before = len(read_calls(pf.layout))
    _run(pf, dag_id, **overrides)
    ran = [
        [
            call["tool"],
            *(
                "<tmp>/deployment/primary"
                if a.endswith("/deployment/primary")
                else re.sub(r"/\S*/tpu-rl-blueprint-check-[^/]+", "<tmp>", a)
                for a in call["argv"]
            ),
        ]
        for call in read_calls(pf.layout)[before:]
    ]
    conf = pf.gke_conf(**overrides) if dag_id == GKE_DAG_ID else pf.tpu_vm_conf(**overrides)
    plan = build_plan(dag_id, conf)
    assert [s["argv"] for s in plan["steps"] if s["task_id"] == "preflight"] == ran
    api, *claims = [c for c in plan["api_calls"] if c["task_id"] == "preflight"]
    assert (
        api["api"]
        == f"POST https://cloudresourcemanager.googleapis.com/v3/projects/{pf.project}:testIamPermissions"
    )
    assert api["body"]["permissions"]
    # who writes the run's training and export directories: their records' objects in the bucket
    conf = {**conf, "run_name": RUN_NAME}
    plan = build_plan(dag_id, conf)
    claims = [c for c in plan["api_calls"] if c["task_id"] == "preflight"][1:]
    operator = pf.operator(TpuRlPreflightOperator, dag_id, conf=conf, task_id="preflight")
    operator.render_template_fields(pf.context(operator, conf))
    assert [c["api"] for c in claims] == [
        f"GET https://storage.googleapis.com/storage/v1/b/{pf.bucket}/o/"
        f"{quote(run_record_object(directory), safe='')}?alt=media"
        for directory in operator.run_dirs.values()
    ]


@pytest.mark.parametrize(("dag_id", "chips"), [(GKE_DAG_ID, 32), (TPU_VM_DAG_ID, 8)])
@pytest.mark.parametrize("capacity", ["spot", "flex-start"])
def test_too_little_preemptible_v6e_quota_is_one_line_before_anything_is_made(
    pf: SandboxRun, dag_id: str, chips: int, capacity: str
) -> None:
    """Spot and flex-start take the region's preemptible TPU v6e quota: less free than the slice's
    chips is one line naming the metric, the region and the numbers."""
    update_settings(pf.layout, region_quotas={"PREEMPTIBLE_TPU_V6E": chips - 1, "N4_CPUS": 512})
    (line,) = _refusal(pf, dag_id, capacity=capacity, reservation="")
    assert line.startswith(
        f"quota PREEMPTIBLE_TPU_V6E in region us-east5 of project {pf.project} has {chips - 1} free"
    )
    assert f"the run needs {chips}:" in line
    _created_nothing(pf)
    update_settings(pf.layout, region_quotas={"PREEMPTIBLE_TPU_V6E": chips, "N4_CPUS": 512})
    assert _run(pf, dag_id, capacity=capacity, reservation="")["capacity"] == capacity


def test_gke_needs_n4_cpus_for_its_cpu_pool_whatever_the_capacity(pf: SandboxRun) -> None:
    update_settings(pf.layout, region_quotas={"PREEMPTIBLE_TPU_V6E": 64, "N4_CPUS": 32})
    (line,) = _refusal(pf)
    assert line.startswith(f"quota N4_CPUS in region us-east5 of project {pf.project} has 32 free")
    assert "the run needs 64:" in line
    # a TPU VM on its reservation takes neither: the region's quotas are read for its CPU VMs' N2 vCPUs only
    _run(pf, TPU_VM_DAG_ID)


def test_the_tpu_vms_cpu_vms_are_checked_against_the_regions_n2_and_the_projects_vcpus(
    pf: SandboxRun,
) -> None:
    """The bake VM (n2-standard-8) runs beside the conversion's CPU VM (n2-highmem-32): 40 N2
    vCPUs at once, in the region's N2_CPUS and the project's CPUS_ALL_REGIONS, which a new
    project's quota may not hold: one line each, before anything is created."""
    update_settings(pf.layout, region_quotas={"N2_CPUS": 32}, project_quotas={"CPUS_ALL_REGIONS": 24})
    both = "2 CPU VMs at once: n2-standard-8 + n2-highmem-32"
    assert _refusal(pf, TPU_VM_DAG_ID) == [
        f"quota N2_CPUS in region us-east5 of project {pf.project} has 32 free (limit 32, in use 0); "
        f"the run needs 40 ({both}): request more (IAM & Admin > Quotas) or choose another region",
        f"quota CPUS_ALL_REGIONS in project {pf.project} (all regions) has 24 free (limit 24, in use 0); "
        f"the run needs 40 ({both}): request more (IAM & Admin > Quotas) or delete VMs the project no longer needs",
    ]
    _created_nothing(pf)
    # without the bake the CPU VM alone takes 32, which fits
    update_settings(pf.layout, project_quotas={"CPUS_ALL_REGIONS": 32})
    assert _run(pf, TPU_VM_DAG_ID, bake_image=False)["runner"] == "tpu_vm"
    # a machine type whose quota is not known is a note, not a refusal
    update_settings(pf.layout, region_quotas={"N2_CPUS": 0}, project_quotas={"CPUS_ALL_REGIONS": 0})
    assert _run(pf, TPU_VM_DAG_ID, bake_image=False, cpu_machine_type="e2-standard-32")["runner"] == "tpu_vm"


def test_a_quota_the_region_does_not_list_is_a_note_not_a_refusal(pf: SandboxRun) -> None:
    from airflow_provider_tpu_rl.spec.preflight import quota_problems

    update_settings(pf.layout, region_quotas={"N4_CPUS": 512})
    assert _run(pf, TPU_VM_DAG_ID, capacity="spot", reservation="")["capacity"] == "spot"
    problems, notes = quota_problems("p", "us-east5", {"PREEMPTIBLE_TPU_V6E": 8}, {"quotas": []})
    assert problems == []
    assert notes == ["region us-east5 of project p lists no PREEMPTIBLE_TPU_V6E quota: not checked"]


def test_a_flex_start_zone_the_docs_do_not_list_is_a_note() -> None:
    from airflow_provider_tpu_rl.spec.preflight import flex_start_zone_note
    from airflow_provider_tpu_rl.spec.presets import Runner

    assert flex_start_zone_note(Runner.TPU_VM, "us-east5-b") is None
    assert flex_start_zone_note(Runner.GKE, "us-east5-b") is None
    note = flex_start_zone_note(Runner.GKE, "us-central1-a")
    assert note is not None
    assert note.startswith("flex-start v6e in zone us-central1-a: not among the zones the docs list")


def test_a_blueprint_older_than_gkes_v6e_is_one_line(pf: SandboxRun) -> None:
    blueprint = pf.layout.bundle_dir / "examples" / "gke-tpu-v6e" / "gke-tpu-v6e-advanced.yaml"
    original = blueprint.read_text()
    blueprint.write_text(original.replace('version_prefix: "1.35."', 'version_prefix: "1.30."', 1))
    try:
        (line,) = _refusal(pf)
    finally:
        blueprint.write_text(original)
    assert line.startswith("the blueprint's version_prefix '1.30.' picks a GKE older than 1.31.2-gke.1115000")


def test_a_gcluster_without_the_kueue_default_the_blueprint_relies_on_is_one_line(pf: SandboxRun) -> None:
    """The edited develop-shape blueprint names no kueue config_path, so the queue is kubectl-apply's
    default, which a gcluster before v1.92.0 does not carry: one line naming the file and the
    release, and nothing is created; v1.92.0 carries it."""
    update_settings(pf.layout, gcluster_release={"version": "v1.91.0"})
    (line,) = _refusal(pf)
    assert line.startswith(
        "the gcluster in use has no kueue/kueue-configuration-pathways.yaml.tftpl in its kubectl-apply "
        "module, the Kueue default the bundle's blueprint "
    ), line
    assert line.endswith(
        "no ClusterQueue would admit the run's jobs; use a Cluster Toolkit release v1.92.0 or newer for "
        "both gcluster and the bundle's examples"
    )
    _created_nothing(pf)
    update_settings(pf.layout, gcluster_release={"version": "v1.92.0"})
    assert _run(pf)["runner"] == "gke"


def test_a_kueue_file_the_bundle_lacks_is_one_line_from_gclusters_create(pf: SandboxRun) -> None:
    """The blueprint stages the example's kueue-configuration.yaml.tftpl: a bundle without it fails
    gcluster's create in the preflight, as it would fail the deploy."""
    staged = pf.layout.bundle_dir / "examples" / "gke-tpu-v6e" / "kueue-configuration.yaml.tftpl"
    original = staged.read_text()
    staged.unlink()
    try:
        (line,) = _refusal(pf)
    finally:
        staged.write_text(original)
    assert line.startswith("gcluster cannot expand the edited blueprint "), line
    assert "kueue-configuration.yaml.tftpl" in line
    _created_nothing(pf)


# ------------------------------------------------------------- the run's directories (issue 54 item 1)
RUN_NAME = "shared-rn"


def _claim_train_dir(sb: SandboxRun, run: str, expires_in: float) -> str:
    """Another run's job claims this run's training directory (as its train task does)."""
    from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords, WriterClaim
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf

    conf = sb.gke_conf(run_name=RUN_NAME)
    directory = gke_pipeline_from_conf(conf, dag_id=GKE_DAG_ID, run_id="r").written_run_dirs[0]
    if not sb.bucket_exists():
        sb.api.create_bucket(sb.bucket)
    where = f"{sb.project}/{conf['region']}/{sb.cluster}"
    writer = WriterClaim(run, "other-train-job", where, time.time() + expires_in, "gke")
    records = RunDirRecords()
    held = records.read(sb.bucket, directory).writer
    records.claim(sb.bucket, directory, run=run, settings={}, writer=writer, takeover=held)
    return directory


def test_a_run_dir_another_live_run_writes_is_one_line_before_anything_bills(pf: SandboxRun) -> None:
    """The refusal train would give after deploy_tpu_pool, given by preflight: nothing is created."""
    directory = _claim_train_dir(pf, f"{GKE_DAG_ID}/{OTHER_RUN}", expires_in=3600)
    problems = _refusal(pf, run_name=RUN_NAME)
    region = pf.gke_conf()["region"]
    assert problems == [
        f"{directory} is being written by job other-train-job ({pf.project}/{region}/{pf.cluster}) of "
        f"run {GKE_DAG_ID}/{OTHER_RUN}, claimed until {problems[0].split('claimed until ')[1].split(';')[0]}; "
        "never two jobs on one directory: wait for that run to end, or choose another run_name"
    ]
    assert pf.cluster_record() is None


def test_a_run_dir_claimed_by_this_run_or_by_a_dead_job_passes(pf: SandboxRun) -> None:
    conf = pf.gke_conf(run_name=RUN_NAME)
    operator = pf.operator(TpuRlPreflightOperator, GKE_DAG_ID, conf=conf, task_id="preflight")
    context = pf.context(operator, conf)
    _claim_train_dir(pf, f"{GKE_DAG_ID}/{context['run_id']}", expires_in=3600)  # this run's retry
    assert operator.execute(context)["runner"] == "gke"
    # an expired claim whose cluster does not exist (its job cannot run) and whose directory was
    # never written: proven dead as train would prove it, nothing to refuse
    _claim_train_dir(pf, f"{GKE_DAG_ID}/{OTHER_RUN}-expired", expires_in=-1)
    assert operator.execute(context)["runner"] == "gke"


# ================================================ an ordered capacity list (issue 56)
def test_a_quota_or_reservation_only_some_kinds_take_is_a_warning_in_a_list(pf: SandboxRun) -> None:
    """Short preemptible quota and a full reservation refuse a one-kind run; in a list with
    on-demand after them, create_vm falls through them: warnings, not refusals."""
    reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    reservations["us-east5-b/res-8"]["count"] = 0
    update_settings(pf.layout, region_quotas={**SandboxSettings().region_quotas, "PREEMPTIBLE_TPU_V6E": 0})
    update_settings(pf.layout, reservations=reservations)
    (line,) = _refusal(pf, TPU_VM_DAG_ID, capacity="spot", reservation="")
    assert line.startswith("quota PREEMPTIBLE_TPU_V6E in region us-east5")
    kinds = ["reservation", "spot", "flex-start", "on-demand"]
    result = _run(pf, TPU_VM_DAG_ID, capacity=kinds)
    assert result["capacity"] == kinds
    _created_nothing(pf)
    # every kind's need of the CPU VMs' quota is still a refusal
    update_settings(pf.layout, region_quotas={**SandboxSettings().region_quotas, "N2_CPUS": 8})
    lines = _refusal(pf, TPU_VM_DAG_ID, capacity=["spot", "on-demand"], reservation="")
    assert [line.split(" in ")[0] for line in lines] == ["quota N2_CPUS"]


def test_flex_start_before_another_kind_on_gke_passes(pf: SandboxRun) -> None:
    """No refusal of flex-start's place in the list on GKE (its pool is proved by a placeholder pod)."""
    result = _run(pf, GKE_DAG_ID, capacity=["flex-start", "on-demand"], reservation="")
    assert result["capacity"] == ["flex-start", "on-demand"]
    _created_nothing(pf)


def test_a_list_with_flex_start_checks_gcloud_alpha(pf: SandboxRun) -> None:
    update_settings(pf.layout, gcloud_components=["beta"])
    (line,) = _refusal(pf, TPU_VM_DAG_ID, capacity=["spot", "flex-start"], reservation="")
    assert line.startswith("flex-start capacity on a TPU VM runs `gcloud alpha compute instances create`")
