"""The TPU VM's network in the fake: the default VPC GCP creates, the SSH firewall rule, OS Login.

Each refusal is the real tool's: an instance on a network that does not exist (the API's 404), ssh
with no ingress rule for tcp:22 (ssh's connect times out, gcloud exits 255), OS Login without admin
login (the session logs in, sudo wants a password).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.sandbox.conftest import Cli
from tests.sandbox.test_vm import create_vm, ssh
from tests.support.waiting import wait_until
from tpu_rl_sandbox.world import vpc
from tpu_rl_sandbox.world.settings import reset_settings, update_settings


@pytest.fixture
def settings(cli: Cli) -> Iterator[None]:
    reset_settings(cli.layout)
    yield
    reset_settings(cli.layout)


def _rules(cli: Cli, project: str) -> dict[str, dict[str, object]]:
    listed = cli.gcloud("compute", "firewall-rules", "list", f"--project={project}", "--format=json")
    assert listed.code == 0, listed.text
    return {rule["name"]: rule for rule in json.loads(listed.out)}


def test_a_new_project_has_the_default_network_and_its_ssh_rule(cli: Cli, names: dict[str, str]) -> None:
    project = names["project"]
    network = cli.gcloud(
        "compute", "networks", "describe", "default", f"--project={project}", "--format=json"
    )
    assert network.code == 0, network.text
    assert json.loads(network.out)["autoCreateSubnetworks"] is True
    rules = _rules(cli, project)
    assert set(rules) == {
        "default-allow-internal",
        "default-allow-ssh",
        "default-allow-rdp",
        "default-allow-icmp",
    }
    ssh_rule = rules["default-allow-ssh"]
    assert ssh_rule["sourceRanges"] == ["0.0.0.0/0"]
    assert ssh_rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert str(ssh_rule["network"]).endswith(f"/projects/{project}/global/networks/default")


def test_a_vm_on_a_missing_network_is_refused(cli: Cli, names: dict[str, str]) -> None:
    project = names["project"]
    vpc.delete_network(cli.layout, project, "default")
    missing = cli.gcloud("compute", "networks", "describe", "default", f"--project={project}")
    assert missing.code == 1
    expected = f"The resource 'projects/{project}/global/networks/default' was not found"
    assert expected in missing.err
    result = cli.gcloud(
        "compute",
        "instances",
        "create",
        "vm-nonet",
        f"--zone={names['zone']}",
        f"--project={project}",
        "--machine-type=ct6e-standard-8t",
        "--reservation-affinity=specific",
        "--reservation=res-8",
    )
    assert result.code == 1
    assert expected in result.err
    assert f"{project}/{names['zone']}/vm-nonet" not in cli.state("vms")


def test_ssh_times_out_without_a_firewall_rule_until_one_is_created(cli: Cli, names: dict[str, str]) -> None:
    project, vm = names["project"], "vm-nossh"
    create_vm(cli, names, vm)
    assert ssh(cli, names, vm, "true\n")[0] == 0
    deleted = cli.gcloud(
        "compute", "firewall-rules", "delete", "default-allow-ssh", f"--project={project}", "--quiet"
    )
    assert deleted.code == 0, deleted.text
    code, _, err = ssh(cli, names, vm, "true\n")
    assert code == 255
    assert "port 22: Connection timed out" in err
    assert "ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255]." in err
    # a rule for IAP's range only does not let the worker's own connection in
    created = cli.gcloud(
        "compute",
        "firewall-rules",
        "create",
        "allow-iap",
        f"--project={project}",
        "--network=default",
        "--direction=INGRESS",
        "--allow=tcp:22",
        "--source-ranges=35.235.240.0/20",
    )
    assert created.code == 0, created.text
    assert ssh(cli, names, vm, "true\n")[0] == 255
    tunnel = cli.gcloud(
        "compute",
        "ssh",
        vm,
        f"--zone={names['zone']}",
        f"--project={project}",
        "--tunnel-through-iap",
        "--command=true",
    )
    assert tunnel.code == 0, tunnel.text
    # a higher-priority deny wins over the allow
    cli.gcloud(
        "compute",
        "firewall-rules",
        "create",
        "allow-ssh",
        f"--project={project}",
        "--allow=tcp:22",
        "--priority=2000",
    )
    assert ssh(cli, names, vm, "true\n")[0] == 0
    cli.gcloud(
        "compute",
        "firewall-rules",
        "create",
        "deny-ssh",
        f"--project={project}",
        "--action=DENY",
        "--rules=tcp:22",
        "--priority=1000",
    )
    assert ssh(cli, names, vm, "true\n")[0] == 255


def test_firewall_rules_create_keeps_gclouds_rules(cli: Cli, names: dict[str, str]) -> None:
    project = names["project"]
    both = cli.gcloud(
        "compute",
        "firewall-rules",
        "create",
        "r1",
        f"--project={project}",
        "--allow=tcp:22",
        "--rules=tcp:22",
    )
    assert both.code == 1
    assert "Can NOT specify --rules and --allow in the same request." in both.err
    no_action = cli.gcloud(
        "compute", "firewall-rules", "create", "r1", f"--project={project}", "--rules=tcp:22"
    )
    assert no_action.code == 1
    assert "Must specify --rules with --action." in no_action.err
    bad = cli.gcloud("compute", "firewall-rules", "create", "r1", f"--project={project}", "--allow=tcp:ssh")
    assert bad.code == 1
    assert "Firewall rules must be of the form" in bad.err
    elsewhere = cli.gcloud(
        "compute",
        "firewall-rules",
        "create",
        "r1",
        f"--project={project}",
        "--network=nowhere",
        "--allow=tcp:22",
    )
    assert elsewhere.code == 1
    assert f"'projects/{project}/global/networks/nowhere' was not found" in elsewhere.err


def test_os_login_without_admin_login_logs_in_without_sudo(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    project, vm = names["project"], "vm-oslogin"
    create_vm(cli, names, vm)
    added = cli.gcloud(
        "compute", "project-info", "add-metadata", f"--project={project}", "--metadata=enable-oslogin=TRUE"
    )
    assert added.code == 0, added.text
    info = json.loads(
        cli.gcloud("compute", "project-info", "describe", f"--project={project}", "--format=json").out
    )
    assert {"key": "enable-oslogin", "value": "TRUE"} in info["commonInstanceMetadata"]["items"]
    code, out, err = ssh(cli, names, vm, 'echo "${USER}"\nsudo true\n')
    assert code == 0, err  # an admin: the OS Login user, with sudo
    assert out.strip() == "sandbox_user_example_com"
    update_settings(cli.layout, denied_permissions=("compute.instances.osAdminLogin",))
    code, _, err = ssh(cli, names, vm, "set -e\nsudo apt-get update\n")
    assert code == 1
    assert "sudo: a password is required" in err
    update_settings(
        cli.layout, denied_permissions=("compute.instances.osAdminLogin", "compute.instances.osLogin")
    )
    code, _, err = ssh(cli, names, vm, "true\n")
    assert code == 255
    assert "Permission denied (publickey)." in err


def _ssh_to(cli: Cli, names: dict[str, str], vm: str, *extra: str) -> tuple[int, str]:
    result = cli.gcloud(
        "compute", "ssh", vm, f"--zone={names['zone']}", f"--project={names['project']}", "--command=true", *extra
    )  # fmt: skip
    return result.code, result.err


def _instances(cli: Cli, names: dict[str, str], verb: str, vm: str) -> None:
    done = cli.gcloud(
        "compute", "instances", verb, vm, f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert done.code == 0, done.text


def test_sshd_refuses_until_the_guest_has_booted_after_each_create_and_start(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    """A kept key (no poll): ssh's refused connect, exit 255, until ``guest_boot`` past RUNNING."""
    vm = "vm-boot"
    create_vm(cli, names, vm)
    assert _ssh_to(cli, names, vm)[0] == 0  # the key added (the scale off: no boot by default)
    # 10 s with the scale off: the three calls below come within it even on a loaded machine
    update_settings(cli.layout, capacity_minutes={"guest_boot": 100})
    _instances(cli, names, "stop", vm)
    _instances(cli, names, "start", vm)
    code, err = _ssh_to(cli, names, vm)
    assert code == 255
    assert err.endswith(
        "port 22: Connection refused\nERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n"
    )
    assert "Waiting for SSH key to propagate." not in err
    tunnel = _ssh_to(cli, names, vm, "--tunnel-through-iap")
    assert tunnel[0] == 255
    assert "[4003: 'failed to connect to backend']" in tunnel[1]
    wait_until(lambda: _ssh_to(cli, names, vm)[0] == 0, "the guest's sshd to answer after its boot")


def test_a_new_keys_poll_waits_for_the_guest_or_gives_up_after_a_minute(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    """gcloud's SSHPoller after a newly added key: every 5 s for 60 s (0.1 s a minute with the scale
    off), each refused try shown; a boot longer than that ends in ssh_utils.NetworkError, exit 1."""
    update_settings(cli.layout, capacity_minutes={"guest_boot": 200})  # 20 s: past the poll's 0.1 s
    create_vm(cli, names, "vm-slow")
    code, err = _ssh_to(cli, names, "vm-slow")
    assert code == 1
    assert "Waiting for SSH key to propagate." in err
    assert 2 <= err.count("port 22: Connection refused") <= 13
    assert "ERROR: (gcloud.compute.ssh) Could not SSH into the instance." in err
    deleted = cli.gcloud(
        "compute", "instances", "delete", "vm-slow", f"--zone={names['zone']}", f"--project={names['project']}",
        "--quiet",
    )  # fmt: skip
    assert deleted.code == 0, deleted.text  # the reservation's one VM
    # on the scale, a boot within the poll's minute is waited for: ssh answers
    update_settings(
        cli.layout,
        minute_seconds=10.0,  # the poll's minute: 10 s; the boot, 5 s: the ssh comes within it
        capacity_minutes={"vm_provisioning": 0, "vm_staging": 0, "vm_stopping": 0, "guest_boot": 0.5},
    )
    create_vm(cli, names, "vm-fast")
    started = time.time()
    code, err = _ssh_to(cli, names, "vm-fast", "--ssh-key-expire-after=1d")  # a new entry: polled
    assert code == 0, err
    assert "Waiting for SSH key to propagate." in err
    assert "port 22: Connection refused" in err
    assert time.time() - started >= 1.0  # half a minute on the scale: 5 s from RUNNING
