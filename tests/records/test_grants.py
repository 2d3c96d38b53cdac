"""The grants a resource holds (``records/grants.py``) on the GCS emulator, with a stand-in for
gcloud that keeps one IAM policy: holders counted, pre-existing bindings kept, a holder that
comes while the last one lets go gets the binding back, and racing holders never lose each other."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_tpu_rl.records.grants import Binding, GrantRegistry, RunGrants, policy_members
from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import gke
from tests.support.gcs_emulator import EMULATOR_BUCKET, GcsEmulator

CONN = "google_cloud_default"
MEMBER = "serviceAccount:sa@p.iam.gserviceaccount.com"


class PolicyGcloud:
    """Answers the policy read, add and remove of one binding's resource (argv as rendered)."""

    def __init__(self, members: set[str] | None = None) -> None:
        self.members = set(members or ())
        self.verbs: list[str] = []
        self.on_remove: Callable[[], None] | None = None

    def run_checked(self, command: Any, **_: Any) -> Any:
        argv = command.argv
        verb = next(a for a in argv if a.endswith("-iam-policy-binding") or a == "get-iam-policy")
        self.verbs.append(verb)
        member = next((a.split("=", 1)[1] for a in argv if a.startswith("--member=")), "")
        if verb == "add-iam-policy-binding":
            self.members.add(member)
        elif verb == "remove-iam-policy-binding":
            self.members.discard(member)
            if self.on_remove is not None:
                self.on_remove()
        policy = {"bindings": [{"role": gke.STORAGE_OBJECT_ADMIN, "members": sorted(self.members)}]}
        return SimpleNamespace(output_lines=[json.dumps(policy)])


@pytest.fixture
def binding() -> Binding:
    return Binding("bucket", "p", f"b-{uuid.uuid4().hex[:8]}", gke.STORAGE_OBJECT_ADMIN, MEMBER)


def _holder(gcs_emulator: GcsEmulator) -> str:
    name = f"vm-{uuid.uuid4().hex[:8]}"
    write_resource_record(CONN, EMULATOR_BUCKET, name, {"kind": "vm", "name": name})
    return name


def test_the_last_holder_removes_what_no_one_had_before(gcs_emulator: GcsEmulator, binding: Binding) -> None:
    gcloud = PolicyGcloud()
    grants = RunGrants(gcloud, CONN)  # type: ignore[arg-type]
    first, second = _holder(gcs_emulator), _holder(gcs_emulator)

    assert grants.grant(EMULATOR_BUCKET, first, [binding]) == [binding]
    assert grants.grant(EMULATOR_BUCKET, second, [binding]) == [binding]  # held, not pre-existing
    assert read_resource_record(CONN, EMULATOR_BUCKET, first)["grants"][0]["member"] == MEMBER  # type: ignore[index]

    assert grants.release(EMULATOR_BUCKET, first) == []
    assert MEMBER in gcloud.members
    assert "remove-iam-policy-binding" not in gcloud.verbs
    assert grants.release(EMULATOR_BUCKET, second) == [binding]
    assert MEMBER not in gcloud.members
    assert grants.release(EMULATOR_BUCKET, second) == []  # a retried teardown: nothing more


def test_a_pre_existing_binding_is_nobodys(gcs_emulator: GcsEmulator, binding: Binding) -> None:
    gcloud = PolicyGcloud({MEMBER})
    grants = RunGrants(gcloud, CONN)  # type: ignore[arg-type]
    holder = _holder(gcs_emulator)

    assert grants.grant(EMULATOR_BUCKET, holder, [binding]) == []
    assert grants.release(EMULATOR_BUCKET, holder) == []
    assert MEMBER in gcloud.members


def test_a_holder_without_a_record_holds_nothing(gcs_emulator: GcsEmulator, binding: Binding) -> None:
    gcloud = PolicyGcloud()
    assert RunGrants(gcloud, CONN).grant(EMULATOR_BUCKET, "no-record-vm", [binding]) is None  # type: ignore[arg-type]
    assert gcloud.verbs == []


def test_a_holder_that_comes_while_the_last_lets_go_gets_the_binding_back(
    gcs_emulator: GcsEmulator, binding: Binding
) -> None:
    gcloud = PolicyGcloud()
    grants = RunGrants(gcloud, CONN)  # type: ignore[arg-type]
    first, late = _holder(gcs_emulator), _holder(gcs_emulator)
    grants.grant(EMULATOR_BUCKET, first, [binding])
    # the late holder reads the policy (still there) and holds it while the first removes it
    gcloud.on_remove = lambda: GrantRegistry(CONN).hold(EMULATOR_BUCKET, binding, late, lambda: True)

    assert grants.release(EMULATOR_BUCKET, first) == []

    assert MEMBER in gcloud.members
    assert gcloud.verbs[-2:] == ["remove-iam-policy-binding", "add-iam-policy-binding"]


def test_two_holders_racing_never_lose_each_other(gcs_emulator: GcsEmulator, binding: Binding) -> None:
    registry = GrantRegistry(CONN)

    def present() -> bool:  # another holder writes between this one's read and its write
        if not registry.read(EMULATOR_BUCKET, binding).holders:
            registry.hold(EMULATOR_BUCKET, binding, "other", lambda: False)
        return False

    registry.hold(EMULATOR_BUCKET, binding, "mine", present)

    assert sorted(registry.read(EMULATOR_BUCKET, binding).holders) == ["mine", "other"]


def test_policy_members_reads_only_unconditional_bindings() -> None:
    lines = [
        "WARNING: something",
        '{"bindings": [{"role": "r", "members": ["a"]},',
        ' {"role": "r", "members": ["b"], "condition": {"title": "t", "expression": "e"}}]}',
    ]
    assert policy_members(lines, "r") == {"a"}
    assert policy_members(["{}"], "r") == set()


def test_a_removal_that_fails_keeps_the_hold_for_the_retry(
    gcs_emulator: GcsEmulator, binding: Binding
) -> None:
    gcloud = PolicyGcloud()
    grants = RunGrants(gcloud, CONN)  # type: ignore[arg-type]
    holder = _holder(gcs_emulator)
    grants.grant(EMULATOR_BUCKET, holder, [binding])

    def refuse() -> None:
        raise RuntimeError("transient")

    gcloud.on_remove = refuse
    with pytest.raises(RuntimeError):
        grants.release(EMULATOR_BUCKET, holder)
    gcloud.on_remove = None
    gcloud.members.add(MEMBER)  # the failed call changed nothing

    assert grants.release(EMULATOR_BUCKET, holder) == [binding]  # the teardown's retry
    assert MEMBER not in gcloud.members
