"""The multi-host pipeline's commands (render/gke.py): selecting deployment groups, the argv checked
against the fake gcluster's cobra tree (the real flag set of ``deploy``/``destroy``/``export-outputs``).

The rendered commands against the tutorials' own text are tests/golden/test_gke_tutorials.py; the
training command's patch steps, test_workload_image.py."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from tpu_rl_sandbox.clis.gcluster.cobra import cobra_parse
from tpu_rl_sandbox.clis.gcluster.commands import build_tree


def _pipeline(**conf: Any) -> Any:
    return gke_pipeline_from_conf(
        {"model": "qwen3-30b-a3b", "project": "my-proj-123", "bucket": "my-bkt", **conf}
    )


def test_group_selection_argv_parses_as_gcluster_parses_it() -> None:
    cluster = _pipeline().cluster
    tree = build_tree()
    deploy = gke.deploy(cluster, "/w", skip_groups=("tpu",))
    parsed = cobra_parse(tree, list(deploy.argv[1:]))
    assert (parsed.get("skip"), "only" in parsed.changed) == (["tpu"], False)
    assert parsed.args == ["/w/gke-tpu-v6e-advanced.yaml"]

    pool = gke.deploy_groups(cluster, "/w", ("tpu",))
    assert pool.argv == ("gcluster", "deploy", "/w/tpu-rl", "--auto-approve", "--only=tpu")
    parsed = cobra_parse(tree, list(pool.argv[1:]))
    assert (parsed.get("only"), parsed.get("auto-approve")) == (["tpu"], True)

    destroy = gke.destroy(cluster, "/w", only_groups=("tpu",))
    parsed = cobra_parse(tree, list(destroy.argv[1:]))
    assert (parsed.get("only"), parsed.get("robust"), parsed.args) == (["tpu"], True, ["/w/tpu-rl"])
    # the whole cluster: no selection
    assert not any(a.startswith(("--only", "--skip")) for a in gke.destroy(cluster, "/w").argv)

    export = gke.export_outputs(cluster, "/w", "primary")
    assert cobra_parse(tree, list(export.argv[1:])).args == ["/w/tpu-rl/primary"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: gke.deploy_groups(c, "/w", ()), "at least one group"),
        (lambda c: gke.deploy(c, "/w", skip_groups=("tpu; rm -rf /",)), "not a deployment group name"),
        (lambda c: gke.destroy(c, "/w", only_groups=("--robust",)), "not a deployment group name"),
        (lambda c: gke.export_outputs(c, "/w", "../primary"), "not a deployment group name"),
    ],
)
def test_group_names_are_refused_unless_plain(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(_pipeline().cluster)


def test_the_flex_start_placeholder_pod_asks_for_one_vms_tpus_on_the_slices_nodes() -> None:
    cluster = _pipeline(capacity="flex-start", reservation="").cluster
    pod: Any = gke.capacity_probe_pod(cluster, "tpu-v6e-slice")
    assert pod["metadata"]["name"] == gke.capacity_probe_name(cluster.cluster_name)
    assert pod["metadata"]["labels"] == {gke.CAPACITY_PROBE_LABEL: cluster.cluster_name}
    spec = pod["spec"]
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x8",
    }
    (container,) = spec["containers"]
    assert container["resources"] == {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}
    assert spec["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (spec["restartPolicy"], spec["terminationGracePeriodSeconds"]) == ("Never", 0)
    assert len(gke.capacity_probe_name("a" * 20)) <= 63
