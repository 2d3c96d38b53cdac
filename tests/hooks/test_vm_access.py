"""``VmAccessReader`` (hooks/vm_access.py) against a fake gcloud: a missing resource is no error, a
refused read is one line naming the permission it needs, a transient failure raises for the task's
retries, output without JSON is named, and OS Login is read from the project's metadata."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_tpu_rl.exceptions import CommandError
from airflow_provider_tpu_rl.hooks.vm_access import VmAccessReader
from airflow_provider_tpu_rl.spec.preflight import network_not_found_problem, ssh_firewall_problem

PROJECT = "proj-vm-access"
SSH_RULE = {
    "name": "allow-ssh",
    "network": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks/default",
    "direction": "INGRESS",
    "priority": 1000,
    "sourceRanges": ["0.0.0.0/0"],
    "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
}


def _reader(make_hook: Any) -> VmAccessReader:
    return VmAccessReader(make_hook(), timeout=30.0)


def _json(value: Any) -> dict[str, Any]:
    return {"steps": [["err", "WARNING: a line before the JSON"], ["out", json.dumps(value)]]}


def test_os_login_is_read_from_the_projects_metadata(make_hook: Any, fake_tools: Any) -> None:
    metadata = {"commonInstanceMetadata": {"items": [{"key": "enable-oslogin", "value": "TRUE"}]}}
    fake_tools.respond({"match": ["project-info", "describe"], **_json(metadata)})

    assert _reader(make_hook).os_login(PROJECT) == (True, [])
    (call,) = fake_tools.calls()
    assert call["argv"][:3] == ["compute", "project-info", "describe"]


def test_a_network_with_a_rule_letting_ssh_in_is_no_problem(make_hook: Any, fake_tools: Any) -> None:
    fake_tools.respond(
        {"match": ["networks", "describe"], **_json({"name": "default"})},
        {"match": ["firewall-rules", "list"], **_json([SSH_RULE])},
    )

    assert _reader(make_hook).network_problems(PROJECT, []) == []


def test_a_missing_network_or_rule_is_its_own_problem(make_hook: Any, fake_tools: Any) -> None:
    missing = {
        "match": ["networks", "describe"],
        "steps": [["err", "ERROR: (gcloud) was not found"]],
        "exit": 1,
    }
    fake_tools.respond(missing)
    assert _reader(make_hook).network_problems(PROJECT, []) == [network_not_found_problem(PROJECT, "default")]

    fake_tools.respond(
        {"match": ["networks", "describe"], **_json({"name": "default"})},
        {"match": ["firewall-rules", "list"], **_json([{**SSH_RULE, "allowed": [{"IPProtocol": "icmp"}]}])},
    )
    assert _reader(make_hook).network_problems(PROJECT, []) == [ssh_firewall_problem(PROJECT, "default", [])]


def test_a_refused_read_is_one_line_naming_what_the_caller_needs(make_hook: Any, fake_tools: Any) -> None:
    denied = "ERROR: (gcloud.compute.networks.describe) Required 'compute.networks.get' permission"
    fake_tools.respond({"match": ["networks", "describe"], "steps": [["err", denied]], "exit": 1})

    (line,) = _reader(make_hook).network_problems(PROJECT, [])

    assert line.startswith(f"could not read network default ({denied})")
    assert line.endswith("the caller needs compute.networks.get (roles/compute.networkViewer)")


def test_a_transient_failure_raises_for_the_tasks_retries(make_hook: Any, fake_tools: Any) -> None:
    fake_tools.respond({"match": ["project-info"], "steps": [["err", "503 Service Unavailable"]], "exit": 1})

    with pytest.raises(CommandError) as raised:
        _reader(make_hook).os_login(PROJECT)
    assert raised.value.retryable


def test_output_without_json_is_named(make_hook: Any, fake_tools: Any) -> None:
    fake_tools.respond({"match": ["project-info"], "steps": [["out", "not json"]]})

    assert _reader(make_hook).os_login(PROJECT) == (
        False,
        [f"gcloud printed no JSON for project {PROJECT}'s metadata"],
    )
