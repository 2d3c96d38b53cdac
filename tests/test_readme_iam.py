"""docs/first-real-run.md's roles table and API list say what ``preflight`` checks, role for role."""

from __future__ import annotations

import re
from pathlib import Path

from airflow_provider_tpu_rl.spec.preflight import (
    REQUIRED_PERMISSIONS,
    REQUIRED_SERVICES,
    STREAMING_PERMISSIONS,
)
from airflow_provider_tpu_rl.spec.presets import Runner

README = Path(__file__).resolve().parents[1] / "docs" / "first-real-run.md"
# ✓: checked on every run of that pipeline; (✓): on a GKE run that streams its image (image_repository)
ROW = re.compile(r"^\| `(roles/[\w.]+)` \| (✓?|\(✓\)) \| (✓?) \| .+ \|$")


def _section() -> str:
    text = README.read_text()
    start = text.index("## Before the first real run")
    return text[start : text.index("\n## ", start + 1)]


def test_the_roles_table_lists_exactly_the_roles_preflight_checks() -> None:
    rows = [ROW.match(line) for line in _section().splitlines() if line.startswith("| `roles/")]
    assert rows
    assert all(rows), "every roles row has the form | `roles/x` | ✓ or (✓) | ✓ | why |"
    table = {m[1]: (m[2], bool(m[3])) for m in rows if m}
    gke, tpu_vm = (set(REQUIRED_PERMISSIONS[runner].values()) for runner in (Runner.GKE, Runner.TPU_VM))
    assert {role for role, (g, _) in table.items() if g == "✓"} == gke
    # the streaming rows name a role of each service whose permissions the copy needs (the table's
    # roles/artifactregistry.admin holds the writer's and reader's: IAM's roles reference)
    streaming = {role for role, (g, _) in table.items() if g == "(✓)"}
    assert streaming
    assert {role.split(".")[0] for role in streaming} == {
        role.split(".")[0] for role in STREAMING_PERMISSIONS.values()
    }
    assert {role for role, (_, v) in table.items() if v} == tpu_vm


def test_the_api_lists_name_every_required_service() -> None:
    section = _section()
    gke_line = section[section.index("GKE pipeline:") : section.index("TPU VM pipeline:")]
    vm_line = section[section.index("TPU VM pipeline:") : section.index("**Roles")]
    for runner, line in ((Runner.GKE, gke_line), (Runner.TPU_VM, vm_line)):
        listed = {f"{name}.googleapis.com" for name in re.findall(r"`([a-z]+)`", line)}
        assert listed == set(REQUIRED_SERVICES[runner]), runner
