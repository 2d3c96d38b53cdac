"""The ``--filter`` of every machine-clock read (render/billing.py), through gcloud 528's own filter
engine (``googlecloudsdk.core.resource.resource_filter``, and the compute API's server-side rewrite
``api_lib.compute.filter_rewrite``) on sample resources: it selects exactly the resources meant.

gcloud evaluates ``--filter`` client-side on what the API returns (and sends a rewritten superset
to the server), so its engine, run offline on the API's resource shapes, is the real part here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.render import billing
from airflow_provider_tpu_rl.render.command import Command

GCLOUD = shutil.which("gcloud")
pytestmark = pytest.mark.skipif(GCLOUD is None, reason="the Google Cloud CLI is not installed")
ZONE_URL = "https://www.googleapis.com/compute/v1/projects/p1/zones/us-east5-b"
ENGINE = """
import json, sys
root = sys.argv[1]
sys.path[:0] = [root + "/lib", root + "/lib/third_party"]
from googlecloudsdk.core.resource import resource_filter
from googlecloudsdk.api_lib.compute import filter_rewrite
cases = json.load(sys.stdin)
out = []
for expression, resources in cases:
    compiled = resource_filter.Compile(expression)
    filter_rewrite.Rewriter().Rewrite(expression)  # the server-side form parses too
    out.append([bool(compiled.Evaluate(resource)) for resource in resources])
print(json.dumps(out))
"""


def _filter(command: Command) -> str:
    (flag,) = [arg for arg in command.argv if arg.startswith("--filter=")]
    return flag.removeprefix("--filter=")


def _evaluate(cases: list[tuple[str, list[dict[str, Any]]]], tmp_path: Path) -> list[list[bool]]:
    assert GCLOUD is not None
    root = Path(os.path.realpath(GCLOUD)).parents[1]
    bundled = root / "platform" / "bundledpythonunix" / "bin" / "python3"
    python = str(bundled) if bundled.exists() else sys.executable
    done = subprocess.run(
        [python, "-c", ENGINE, str(root)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "WARNING" not in done.stderr, done.stderr  # no filter whose meaning is changing
    return list(json.loads(done.stdout))


def _op(name: str) -> dict[str, Any]:
    return {"operationType": "delete", "targetLink": f"{ZONE_URL}/instances/{name}"}


def _node(cluster: str, pool: str) -> dict[str, Any]:
    return {"name": "n", "labels": {"goog-k8s-cluster-name": cluster, "goog-k8s-node-pool-name": pool}}


def test_the_vms_operations_are_its_own_not_a_prefixs_nor_its_cpu_vms(tmp_path: Path) -> None:
    vm_ops = _filter(billing.list_instance_operations("p1", "us-east5-b", ["tpu-vm"]))
    pool_ops = _filter(
        billing.list_instance_operations(
            "p1", "us-east5-b", ["gke-c1-pool-1a2b3c4d", "gke-c1-pool-9f9f9f9f"], group_bases=True
        )
    )
    nodes = _filter(
        billing.list_pool_nodes("p1", "us-east5-b", "c1", ["gke-tpu-v6e-pool", "gke-tpu-v6e-pool-0"])
    )
    any_pool = _filter(billing.list_pool_nodes("p1", "us-east5-b", "c1"))
    results = _evaluate(
        [
            (vm_ops, [_op("tpu-vm"), _op("tpu-vm-cpu"), _op("old-tpu-vm"), {**_op("tpu-vm"), "targetLink": f"{ZONE_URL}/disks/tpu-vm"}]),
            (pool_ops, [_op("gke-c1-pool-1a2b3c4d-abcd"), _op("gke-c1-pool-9f9f9f9f-x1y2"), _op("gke-c1-pool-1a2b3c4d"), _op("gke-c1-pool-1a2b3c4d-abcd-e"), _op("gke-c2-pool-1a2b3c4d-abcd")]),
            (nodes, [_node("c1", "gke-tpu-v6e-pool"), _node("c1", "gke-tpu-v6e-pool-0"), _node("c1", "cpu-np"), _node("c10", "gke-tpu-v6e-pool")]),
            (any_pool, [_node("c1", "cpu-np"), _node("c2", "gke-tpu-v6e-pool"), _node("c1-b", "cpu-np")]),
        ],
        tmp_path,
    )  # fmt: skip
    assert results == [
        [True, False, False, False],
        [True, True, False, False, False],
        [True, True, False, False],
        [True, False, False],
    ]


def test_names_that_are_no_compute_engine_names_are_refused() -> None:
    from airflow_provider_tpu_rl.spec.errors import SpecError

    with pytest.raises(SpecError):
        billing.list_instance_operations("p1", "us-east5-b", ["vm1|.*"])
    with pytest.raises(SpecError):
        billing.list_pool_nodes("p1", "us-east5-b", "c1", ["pool) OR (x"])
    with pytest.raises(ValueError, match="at least one name"):
        billing.list_instance_operations("p1", "us-east5-b", [])
