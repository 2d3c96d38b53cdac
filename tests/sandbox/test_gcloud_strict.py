"""The fake gcloud is as strict as the real one for IAM bindings, services, reservations, SSH keys
and the TPU VM's own service account (each rule from the Cloud SDK source it cites)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox.conftest import Cli
from tests.sandbox.test_vm import create_vm, ssh
from tpu_rl_sandbox.clis.gcloud.compute_ssh import project_ssh_key_entries, project_ssh_keys
from tpu_rl_sandbox.clis.gcloud.values import parse_duration
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.settings import (
    DEFAULT_RESERVATIONS,
    SandboxSettings,
    load_settings,
    reset_settings,
    update_settings,
)
from tpu_rl_sandbox.world.store import StateStore

REFUSED = (
    "Adding a binding without specifying a condition to a policy containing conditions is prohibited in "
    "non-interactive mode. Run the command again with `--condition=None`"
)
CONDITION = 'expression=request.time < timestamp("2031-01-01T00:00:00Z"),title=until-2031'


@pytest.fixture
def settings(cli: Cli) -> Iterator[None]:
    """Tests that change the shared sandbox's settings put the defaults back afterwards."""
    reset_settings(cli.layout)
    yield
    reset_settings(cli.layout)


@pytest.fixture
def prepared(cli: Cli, names: dict[str, str]) -> dict[str, str]:
    """A bucket and an ``hf`` secret in the test's project."""
    project = names["project"]
    assert (
        cli.gcloud("storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={project}").code
        == 0
    )
    assert (
        cli.gcloud("secrets", "create", "hf", f"--project={project}", "--data-file=-", stdin=b"hf_x").code
        == 0
    )
    return names


def sa(names: dict[str, str], name: str = "default") -> str:
    """A service account e-mail that needs no existence check (not ``*.iam.gserviceaccount.com``)."""
    return f"{name}-{names['project']}@developer.gserviceaccount.com"


# ==================================================================================== settings
def test_settings_default_to_a_strict_project_and_persist_atomically(cli: Cli, settings: None) -> None:
    current = load_settings(cli.layout)
    assert current == SandboxSettings()
    assert current.conditional_bindings is True
    assert set(DEFAULT_RESERVATIONS) == {
        "us-east5-b/res-1",
        "us-east5-b/demo-v6e-32",
        "us-east5-b/res-8",
        "us-east5-b/my-v6e-8-reservation",
    }
    changed = update_settings(cli.layout, disabled_services=["tpu.googleapis.com"])
    assert changed.disabled_services == ("tpu.googleapis.com",)
    assert load_settings(cli.layout) == changed
    assert dataclasses.replace(changed, disabled_services=()) == SandboxSettings()
    assert not list(cli.layout.state_dir.glob(".settings.*.tmp"))
    with pytest.raises(TypeError, match="unknown sandbox setting"):
        update_settings(cli.layout, conditional_binding=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.conditional_bindings = False  # type: ignore[misc]


# ========================================================================================= IAM
def test_project_binding_without_condition_is_refused_like_gcloud(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    project, member = names["project"], f"serviceAccount:{sa(names)}"
    for extra in ((), ("--quiet",)):
        refused = cli.gcloud(
            "projects",
            "add-iam-policy-binding",
            project,
            f"--member={member}",
            "--role=roles/storage.admin",
            *extra,
        )
        assert (refused.code, refused.err) == (
            1,
            f"ERROR: (gcloud.projects.add-iam-policy-binding) {REFUSED}\n",
        )
    assert iam_bindings(cli.layout, f"projects/{project}") == {}
    granted = cli.gcloud(
        "projects",
        "add-iam-policy-binding",
        project,
        f"--member={member}",
        "--role=roles/storage.admin",
        "--condition=None",
        "--format=json",
    )
    assert granted.code == 0, granted.text
    assert granted.err == f"Updated IAM policy for project [{project}].\n"
    policy = json.loads(granted.out)
    assert policy["version"] == 3
    assert any("condition" in b for b in policy["bindings"]), "the project's own conditional binding"
    assert iam_bindings(cli.layout, f"projects/{project}") == {"roles/storage.admin": [member]}
    # a project whose policy has no conditional binding takes it without --condition
    update_settings(cli.layout, conditional_bindings=False)
    plain = cli.gcloud(
        "projects", "add-iam-policy-binding", project, f"--member={member}", "--role=roles/viewer", "--quiet"
    )
    assert plain.code == 0, plain.text
    assert iam_bindings(cli.layout, f"projects/{project}")["roles/viewer"] == [member]


def test_the_shim_refuses_too(cli: Cli, names: dict[str, str], settings: None) -> None:
    """The real entry point, in its own process, stdin not a terminal."""
    argv = [
        "projects",
        "add-iam-policy-binding",
        names["project"],
        f"--member=user:a@{names['project']}.example",
    ]
    refused = cli.shim("gcloud", *argv, "--role=roles/browser", "--quiet")
    assert refused.code == 1
    assert REFUSED in refused.err
    assert cli.shim("gcloud", *argv, "--role=roles/browser", "--condition=None").code == 0


def test_condition_flag_is_parsed_like_iam_util(cli: Cli, names: dict[str, str], settings: None) -> None:
    base = ["projects", "add-iam-policy-binding", names["project"], f"--member=serviceAccount:{sa(names)}"]
    bad_key = cli.gcloud(*base, "--role=roles/browser", "--condition=foo=bar")
    assert bad_key.code == 2
    assert (
        "argument --condition: valid keys are [None, description, expression, title]; received: foo"
        in bad_key.err
    )
    no_title = cli.gcloud(*base, "--role=roles/browser", "--condition=expression=true")
    assert no_title.code == 1
    assert "Invalid value for [condition]: condition must be either `None`" in no_title.err
    both = cli.gcloud(*base, "--role=roles/browser", "--condition=None", "--condition-from-file=/dev/null")
    assert both.code == 2
    assert "At most one of --condition | --condition-from-file can be specified." in both.err
    basic = cli.gcloud(*base, "--role=roles/editor", f"--condition={CONDITION}")
    assert basic.code == 1
    assert "Binding with a condition and a basic role is not allowed." in basic.err
    conditional = cli.gcloud(*base, "--role=roles/browser", f"--condition={CONDITION}", "--format=json")
    assert conditional.code == 0, conditional.text
    added = [b for b in json.loads(conditional.out)["bindings"] if b["role"] == "roles/browser"]
    assert added == [
        {
            "condition": {
                "expression": 'request.time < timestamp("2031-01-01T00:00:00Z")',
                "title": "until-2031",
            },
            "members": [f"serviceAccount:{sa(names)}"],
            "role": "roles/browser",
        }
    ]
    # a conditional binding grants nothing unconditionally
    assert "roles/browser" not in iam_bindings(cli.layout, f"projects/{names['project']}")


def test_secret_bindings_follow_the_secrets_own_policy(cli: Cli, prepared: dict[str, str]) -> None:
    names = prepared
    base = ["secrets", "add-iam-policy-binding", "hf", f"--project={names['project']}"]
    reader = f"serviceAccount:{sa(names)}"
    # the secret's policy has no condition: no --condition needed, whatever the project's policy holds
    first = cli.gcloud(*base, f"--member={reader}", "--role=roles/secretmanager.secretAccessor")
    assert (first.code, first.err) == (0, "Updated IAM policy for secret [hf].\n")
    timed = cli.gcloud(
        *base,
        "--member=user:auditor@example.com",
        "--role=roles/secretmanager.viewer",
        f"--condition={CONDITION}",
    )
    assert timed.code == 0, timed.text
    assert "WARNING: Adding binding with condition to a policy without condition" in timed.err
    refused = cli.gcloud(*base, "--member=user:x@example.com", "--role=roles/secretmanager.secretAccessor")
    assert (refused.code, refused.err) == (1, f"ERROR: (gcloud.secrets.add-iam-policy-binding) {REFUSED}\n")
    again = cli.gcloud(
        *base, "--member=user:x@example.com", "--role=roles/secretmanager.secretAccessor", "--condition=None"
    )
    assert again.code == 0, again.text
    assert iam_bindings(cli.layout, f"projects/{names['project']}/secrets/hf") == {
        "roles/secretmanager.secretAccessor": [reader, "user:x@example.com"]
    }
    missing = cli.gcloud(
        "secrets",
        "add-iam-policy-binding",
        "nope",
        f"--project={names['project']}",
        f"--member={reader}",
        "--role=roles/secretmanager.secretAccessor",
    )
    assert missing.code == 1
    assert "NOT_FOUND: Secret" in missing.err
    policy = cli.gcloud("secrets", "get-iam-policy", "hf", f"--project={names['project']}", "--format=json")
    assert json.loads(policy.out)["version"] == 3


def test_bucket_bindings(cli: Cli, prepared: dict[str, str]) -> None:
    names = prepared
    url = f"gs://{names['bucket']}"
    writer = f"serviceAccount:{sa(names)}"
    added = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        url,
        f"--member={writer}",
        "--role=roles/storage.objectAdmin",
    )
    assert added.code == 0, added.text
    assert iam_bindings(cli.layout, f"b/{names['bucket']}") == {"roles/storage.objectAdmin": [writer]}
    shown = cli.gcloud("storage", "buckets", "get-iam-policy", url, "--format=json")
    assert {"members": [writer], "role": "roles/storage.objectAdmin"} in json.loads(shown.out)["bindings"]
    timed = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        url,
        "--member=user:a@example.com",
        "--role=roles/storage.objectViewer",
        f"--condition={CONDITION}",
    )
    assert timed.code == 0, timed.text
    refused = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        url,
        "--member=user:b@example.com",
        "--role=roles/storage.objectViewer",
    )
    assert (refused.code, refused.err) == (
        1,
        f"ERROR: (gcloud.storage.buckets.add-iam-policy-binding) {REFUSED}\n",
    )
    not_bucket = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        f"{url}/obj",
        f"--member={writer}",
        "--role=roles/storage.objectAdmin",
    )
    assert not_bucket.code == 1
    assert "only accepts bucket URLs." in not_bucket.err
    missing = cli.gcloud("storage", "buckets", "get-iam-policy", "gs://no-such-bucket-zz9")
    assert (missing.code, "HTTPError 404: The specified bucket does not exist." in missing.err) == (1, True)
    # a recreated bucket starts with an empty policy
    assert cli.gcloud("storage", "rm", "-r", url).code == 0
    assert cli.gcloud("storage", "buckets", "create", url, f"--project={names['project']}").code == 0
    assert iam_bindings(cli.layout, f"b/{names['bucket']}") == {}


def test_bucket_binding_removal(cli: Cli, prepared: dict[str, str]) -> None:
    """surface/storage/buckets/remove_iam_policy_binding.py: the binding must be there (under the
    condition given), a policy holding a conditional binding needs --condition or --all, and a
    missing bucket is a 404."""
    names = prepared
    url = f"gs://{names['bucket']}"
    writer = f"serviceAccount:{sa(names)}"
    role = "--role=roles/storage.objectAdmin"

    def remove(*extra: str, target: str = url) -> Any:
        return cli.gcloud("storage", "buckets", "remove-iam-policy-binding", target, *extra)

    assert (
        cli.gcloud("storage", "buckets", "add-iam-policy-binding", url, f"--member={writer}", role).code == 0
    )
    assert remove(f"--member={writer}", role).code == 0
    assert iam_bindings(cli.layout, f"b/{names['bucket']}") == {}
    gone = remove(f"--member={writer}", role)
    assert gone.code == 1
    assert "Policy binding with the specified principal, role, and condition not found!" in gone.err

    assert (
        cli.gcloud("storage", "buckets", "add-iam-policy-binding", url, f"--member={writer}", role).code == 0
    )
    timed = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        url,
        "--member=user:a@example.com",
        "--role=roles/storage.objectViewer",
        f"--condition={CONDITION}",
    )
    assert timed.code == 0, timed.text
    refused = remove(f"--member={writer}", role)
    assert refused.code == 1
    assert "prohibited in non-interactive mode" in refused.err
    both = remove(f"--member={writer}", role, "--all", "--condition=None")
    assert both.code == 2
    assert remove(f"--member={writer}", role, "--condition=None").code == 0
    assert "roles/storage.objectAdmin" not in iam_bindings(cli.layout, f"b/{names['bucket']}")
    missing = remove(f"--member={writer}", role, "--condition=None", target="gs://no-such-bucket-zz9")
    assert (missing.code, "HTTPError 404: The specified bucket does not exist." in missing.err) == (1, True)


def test_iam_bindings_rejects_an_unknown_resource(cli: Cli) -> None:
    with pytest.raises(ValueError, match="unknown IAM resource"):
        iam_bindings(cli.layout, "folders/1")


# ==================================================================================== services
def test_services_list_models_service_usage(cli: Cli, names: dict[str, str], settings: None) -> None:
    project = names["project"]
    enabled = cli.shim(
        "gcloud", "services", "list", "--enabled", f"--project={project}", "--format=value(config.name)"
    )
    assert enabled.code == 0, enabled.err
    listed = enabled.out.split()
    assert listed == sorted(listed)
    for api in (
        "compute",
        "container",
        "tpu",
        "storage",
        "secretmanager",
        "iam",
        "cloudresourcemanager",
        "serviceusage",
        "artifactregistry",
    ):
        assert f"{api}.googleapis.com" in listed
    table = cli.gcloud("services", "list", f"--project={project}")
    assert table.out.splitlines()[0].split() == ["NAME", "TITLE"]
    assert "tpu.googleapis.com                   Cloud TPU API" in table.out
    update_settings(cli.layout, disabled_services=("tpu.googleapis.com",))
    after = cli.gcloud("services", "list", "--enabled", f"--project={project}", "--format=value(config.name)")
    assert "tpu.googleapis.com" not in after.out.split()
    available = cli.gcloud(
        "services",
        "list",
        "--available",
        f"--project={project}",
        "--filter=config.name=tpu.googleapis.com",
        "--format=json",
    )
    (tpu,) = json.loads(available.out)
    assert tpu["state"] == "DISABLED"
    assert tpu["name"].endswith("/services/tpu.googleapis.com")
    both = cli.gcloud("services", "list", "--enabled", "--available", f"--project={project}")
    assert both.code == 2
    update_settings(cli.layout, denied_permissions=("serviceusage.services.list",))
    denied = cli.gcloud("services", "list", "--enabled", f"--project={project}")
    assert denied.code == 1
    assert (
        "PERMISSION_DENIED: Permission denied to list services for consumer container [projects/"
        in denied.err
    )


# ================================================================================ reservations
def describe_reservation(cli: Cli, names: dict[str, str], name: str, *extra: str) -> tuple[int, str, str]:
    result = cli.gcloud("compute", "reservations", "describe", name, f"--project={names['project']}", *extra)
    return result.code, result.out, result.err


def test_reservation_describe_has_the_real_fields(cli: Cli, names: dict[str, str]) -> None:
    code, out, err = describe_reservation(cli, names, "res-1", "--zone=us-east5-b", "--format=json")
    assert code == 0, err
    resource = json.loads(out)
    assert resource["name"] == "res-1"
    assert (
        resource["zone"]
        == f"https://www.googleapis.com/compute/v1/projects/{names['project']}/zones/us-east5-b"
    )
    assert resource["status"] == "READY"
    assert resource["specificReservationRequired"] is True
    assert resource["specificReservation"] == {
        "assuredCount": "8",
        "count": "8",
        "inUseCount": "0",
        "instanceProperties": {"machineType": "ct6e-standard-4t"},
    }
    code, out, err = describe_reservation(cli, names, "no-such-res", "--zone=us-east5-b")
    assert (code, out) == (1, "")
    assert err == (
        "ERROR: (gcloud.compute.reservations.describe) Could not fetch resource:\n - The resource "
        f"'projects/{names['project']}/zones/us-east5-b/reservations/no-such-res' was not found\n"
    )
    code, _, err = describe_reservation(cli, names, "res-1", "--zone=us-central1-a")
    assert code == 1
    assert "was not found" in err
    code, _, err = describe_reservation(cli, names, "res-1")
    assert code == 1
    assert "Failed to find attribute [zone]." in err


def test_vm_create_consumes_a_reservation_like_gce(cli: Cli, names: dict[str, str]) -> None:
    def create(vm: str, reservation: str, machine: str = "ct6e-standard-8t") -> tuple[int, str]:
        result = cli.gcloud(
            "compute",
            "instances",
            "create",
            vm,
            f"--zone={names['zone']}",
            f"--project={names['project']}",
            f"--machine-type={machine}",
            "--reservation-affinity=specific",
            f"--reservation={reservation}",
        )
        return result.code, result.err

    code, err = create("vm-a", "nope")
    assert (code, "Specified reservation 'nope' does not exist." in err) == (1, True)
    code, err = create("vm-a", "res-1")  # a v6e-32 reservation of ct6e-standard-4t VMs
    assert (code, "No available resources in specified reservations 'res-1'" in err) == (1, True)
    code, err = create("vm-a", "res-8")
    assert code == 0, err
    code, out, _ = describe_reservation(
        cli, names, "res-8", f"--zone={names['zone']}", "--format=value(specificReservation.inUseCount)"
    )
    assert out.strip() == "1"
    code, err = create("vm-b", "res-8")
    assert code == 1
    assert "Specified reservation 'res-8' does not have available resources for the request." in err
    deleted = cli.gcloud(
        "compute",
        "instances",
        "delete",
        "vm-a",
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--quiet",
    )
    assert deleted.code == 0
    assert create("vm-b", "res-8")[0] == 0


# ====================================================================================== ssh keys
def ssh_to(
    cli: Cli, names: dict[str, str], vm: str, *flags: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    result = cli.gcloud(
        "compute",
        "ssh",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        *flags,
        "--command=true",
        env=env,
    )
    return result.code, result.err


def test_a_kept_key_file_is_added_to_project_metadata_once(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    vm = f"ssh-{names['cluster']}"
    create_vm(cli, names, vm)
    key = tmp_path / "cache" / "ssh" / "google_compute_engine"
    code, err = ssh_to(cli, names, vm, f"--ssh-key-file={key}")
    assert code == 0, err
    assert "SSH keygen will be executed to generate a key." in err
    assert "Updating project ssh metadata...done.\nWaiting for SSH key to propagate." in err
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert Path(f"{key}.pub").read_text().startswith("ssh-rsa ")
    public = " ".join(Path(f"{key}.pub").read_text().split()[:2])
    assert project_ssh_keys(cli.layout, names["project"]) == [public]
    code, err = ssh_to(cli, names, vm, f"--ssh-key-file={key}")
    assert code == 0, err
    assert "ssh metadata" not in err
    assert "keygen" not in err
    assert len(project_ssh_key_entries(cli.layout, names["project"])) == 1
    # without --ssh-key-file: $HOME/.ssh/google_compute_engine, a second key
    code, err = ssh_to(cli, names, vm)
    assert code == 0, err
    assert (Path(cli.env["HOME"]) / ".ssh" / "google_compute_engine.pub").is_file()
    assert len(project_ssh_keys(cli.layout, names["project"])) == 2
    # a fresh HOME per call (what the issue saw): a new key every time
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    assert ssh_to(cli, names, vm, env={"HOME": str(fresh)})[0] == 0
    assert len(project_ssh_keys(cli.layout, names["project"])) == 3


def test_expiring_keys_carry_their_expiry_and_expired_ones_are_dropped(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    vm = f"exp-{names['cluster']}"
    create_vm(cli, names, vm)
    key = tmp_path / "k" / "google_compute_engine"
    stale = f"olduser:ssh-rsa AAAAstale google-ssh {json.dumps({'userName': 'olduser', 'expireOn': '2020-01-01T00:00:00+0000'}).replace(' ', '')}"
    with StateStore(cli.layout).txn() as txn:
        txn.doc("project_metadata").setdefault(names["project"], {})["ssh-keys"] = [stale]
        txn.save("project_metadata")
    before = dt.datetime.now(dt.UTC)
    code, err = ssh_to(cli, names, vm, f"--ssh-key-file={key}", "--ssh-key-expire-after=1d")
    assert code == 0, err
    (entry,) = project_ssh_key_entries(cli.layout, names["project"])  # the expired entry is gone
    user, rest = entry.split(":", 1)
    assert user == "tester"
    kind, material, marker, blob = rest.split(" ", 3)
    assert (kind, marker) == ("ssh-rsa", "google-ssh")
    expire_on = dt.datetime.strptime(json.loads(blob)["expireOn"], "%Y-%m-%dT%H:%M:%S+0000").replace(
        tzinfo=dt.UTC
    )
    assert dt.timedelta(hours=23) < expire_on - before <= dt.timedelta(days=1, minutes=1)
    assert project_ssh_keys(cli.layout, names["project"]) == [f"ssh-rsa {material}"]
    bad = cli.gcloud(
        "compute",
        "ssh",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--ssh-key-expire-after=xyz",
        "--command=true",
    )
    assert bad.code == 2
    assert "argument --ssh-key-expire-after: Failed to parse duration:" in bad.err
    both = cli.gcloud(
        "compute",
        "ssh",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--ssh-key-expire-after=1d",
        "--ssh-key-expiration=2099-01-01T00:00:00Z",
        "--command=true",
    )
    assert both.code == 2


def test_broken_key_files_abort_unless_overwrite_is_forced(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    vm = f"brk-{names['cluster']}"
    create_vm(cli, names, vm)
    key = tmp_path / "google_compute_engine"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")  # the .pub is missing
    code, err = ssh_to(cli, names, vm, f"--ssh-key-file={key}")
    assert code == 1
    assert "Your SSH key files are broken." in err
    assert err.endswith("ERROR: (gcloud.compute.ssh) Aborted by user.\n")
    assert project_ssh_keys(cli.layout, names["project"]) == []
    code, err = ssh_to(cli, names, vm, f"--ssh-key-file={key}", "--force-key-file-overwrite")
    assert code == 0, err
    assert Path(f"{key}.pub").is_file()


def test_durations_parse_like_gcloud() -> None:
    assert [parse_duration(d) for d in ("1d", "2h30m", "PT1H", "P1D", "90", "45s")] == [
        86400,
        9000,
        3600,
        86400,
        90,
        45,
    ]
    for bad in ("xyz", "1w", "d"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# ========================================================================= the VM's own account
VM_READ = "gcloud secrets versions access latest --secret=hf --project={project}\n"
VM_WRITE = "echo x > /tmp/f && gcloud storage cp /tmp/f gs://{bucket}/out/f\n"


def test_inside_the_vm_gcloud_acts_as_the_default_compute_account(cli: Cli, prepared: dict[str, str]) -> None:
    names = prepared
    project, vm = names["project"], f"iam-{names['cluster']}"
    create_vm(cli, names, vm, "--scopes=cloud-platform")
    account = cli.gcloud(
        "compute",
        "instances",
        "describe",
        vm,
        f"--zone={names['zone']}",
        f"--project={project}",
        "--format=value(serviceAccounts[0].email)",
    ).out.strip()
    assert account.endswith("-compute@developer.gserviceaccount.com")
    code, out, err = ssh(cli, names, vm, VM_READ.format(project=project))
    assert code == 1
    assert err.strip().endswith(
        "ERROR: (gcloud.secrets.versions.access) PERMISSION_DENIED: Permission 'secretmanager.versions.access' "
        f"denied for resource 'projects/{project}/secrets/hf/versions/latest' (or it may not exist). This command "
        f"is authenticated as {account} which is the active account specified by the [core/account] property."
    )
    code, out, err = ssh(cli, names, vm, VM_WRITE.format(bucket=names["bucket"]))
    assert code == 1
    assert (
        f"HTTPError 403: {account} does not have storage.objects.create access to the Google Cloud Storage object."
        in err
    )
    assert cli.objects(names["bucket"]) == []
    # the operator's own gcloud is not the VM's account: it reads the secret fine
    assert (
        cli.gcloud("secrets", "versions", "access", "latest", "--secret=hf", f"--project={project}").code == 0
    )
    for grant in (
        (
            "secrets",
            "add-iam-policy-binding",
            "hf",
            f"--project={project}",
            "--role=roles/secretmanager.secretAccessor",
        ),
        (
            "storage",
            "buckets",
            "add-iam-policy-binding",
            f"gs://{names['bucket']}",
            "--role=roles/storage.objectAdmin",
        ),
    ):
        assert cli.gcloud(*grant, f"--member=serviceAccount:{account}", "--condition=None").code == 0
    time.sleep(load_settings(cli.layout).iam_propagation_seconds)  # a new secret grant takes effect
    code, out, err = ssh(
        cli, names, vm, VM_READ.format(project=project) + VM_WRITE.format(bucket=names["bucket"]) * 2
    )
    assert code == 0, err
    assert out.startswith("hf_sandbox_")
    assert cli.objects(names["bucket"]) == ["out/f"]


def test_object_creator_may_create_but_not_replace_and_project_roles_count(
    cli: Cli, prepared: dict[str, str]
) -> None:
    names = prepared
    project, vm = names["project"], f"own-{names['cluster']}"
    own = sa(names, "trainer")
    create_vm(cli, names, vm, "--scopes=cloud-platform", f"--service-account={own}")
    described = cli.gcloud(
        "compute",
        "instances",
        "describe",
        vm,
        f"--zone={names['zone']}",
        f"--project={project}",
        "--format=json",
    )
    assert json.loads(described.out)["serviceAccounts"][0]["email"] == own
    creator = cli.gcloud(
        "storage",
        "buckets",
        "add-iam-policy-binding",
        f"gs://{names['bucket']}",
        f"--member=serviceAccount:{own}",
        "--role=roles/storage.objectCreator",
    )
    assert creator.code == 0
    code, _, err = ssh(cli, names, vm, VM_WRITE.format(bucket=names["bucket"]))
    assert code == 0, err
    code, _, err = ssh(cli, names, vm, VM_WRITE.format(bucket=names["bucket"]))
    assert code == 1
    assert f"{own} does not have storage.objects.delete access" in err
    code, _, err = ssh(cli, names, vm, f"gcloud storage rm gs://{names['bucket']}/out/f\n")
    assert code == 1
    assert "storage.objects.delete" in err
    # project-level roles are inherited by the bucket and the secret
    for role in ("roles/storage.admin", "roles/secretmanager.secretAccessor"):
        granted = cli.gcloud(
            "projects",
            "add-iam-policy-binding",
            project,
            f"--member=serviceAccount:{own}",
            f"--role={role}",
            "--condition=None",
        )
        assert granted.code == 0, granted.text
    code, out, err = ssh(
        cli, names, vm, VM_WRITE.format(bucket=names["bucket"]) + VM_READ.format(project=project)
    )
    assert code == 0, err
    assert "hf_sandbox_" in out


def test_denied_permissions_fail_the_commands_that_need_them(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    project, zone = names["project"], names["zone"]
    update_settings(
        cli.layout,
        denied_permissions=(
            "compute.reservations.get",
            "compute.instances.create",
            "resourcemanager.projects.setIamPolicy",
        ),
    )
    code, _, err = describe_reservation(cli, names, "res-8", f"--zone={zone}")
    assert code == 1
    assert (
        f"Required 'compute.reservations.get' permission for 'projects/{project}/zones/{zone}/reservations/res-8'"
        in err
    )
    created = cli.gcloud("compute", "instances", "create", "vm-x", f"--zone={zone}", f"--project={project}")
    assert created.code == 1
    assert "Required 'compute.instances.create' permission" in created.err
    bound = cli.gcloud(
        "projects",
        "add-iam-policy-binding",
        project,
        "--member=user:a@example.com",
        "--role=roles/browser",
        "--condition=None",
    )
    assert bound.code == 1
    assert f"does not have permission to access projects instance [{project}:setIamPolicy]" in bound.err


def test_version_reports_the_sdk_like_gcloud(cli: Cli) -> None:
    as_json = cli.shim("gcloud", "version", "--format=json")
    assert as_json.code == 0, as_json.err
    assert json.loads(as_json.out)["Google Cloud SDK"] == "528.0.0"
    assert cli.gcloud("version").out.startswith("Google Cloud SDK 528.0.0\n")


def test_a_disabled_api_fails_its_commands(cli: Cli, names: dict[str, str], settings: None) -> None:
    update_settings(cli.layout, disabled_services=("secretmanager.googleapis.com",))
    created = cli.gcloud("secrets", "create", "hf", f"--project={names['project']}")
    assert created.code == 1
    assert "PERMISSION_DENIED: Secret Manager API has not been used in project" in created.err
    assert "secretmanager.googleapis.com/overview?project=" in created.err
    listed = cli.gcloud("compute", "instances", "list", f"--project={names['project']}")
    assert listed.code == 0


# ============================================================================== impersonation
def test_impersonation_runs_the_api_calls_as_the_target_and_says_so(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    """``--impersonate-service-account`` or ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT``: gcloud
    warns, and the API calls run as the chain's last account (store.py Load,
    ParseImpersonationAccounts): a refusal names that account."""
    project = names["project"]
    target = f"deployer@{project}.iam.gserviceaccount.com"
    update_settings(cli.layout, denied_permissions=("resourcemanager.projects.setIamPolicy",))
    bind = ("projects", "add-iam-policy-binding", project, "--member=user:a@example.com")
    bind += ("--role=roles/browser", "--condition=None")
    warning = (
        "WARNING: This command is using service account impersonation. All API calls will be executed as "
        f"[{target}]."
    )
    by_env = cli.gcloud(
        *bind,
        env={
            "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": f"first@{project}.iam.gserviceaccount.com,{target}"
        },
    )
    assert by_env.code == 1
    assert warning in by_env.err
    assert (
        f"[{target}] does not have permission to access projects instance [{project}:setIamPolicy]"
        in by_env.err
    )
    by_flag = cli.gcloud(*bind, f"--impersonate-service-account={target}")
    assert warning in by_flag.err
    assert f"[{target}] does not have permission" in by_flag.err
    plain = cli.gcloud(*bind)
    assert "impersonation" not in plain.err
    assert f"[{target}]" not in plain.err
