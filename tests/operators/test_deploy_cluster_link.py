"""``deploy_cluster`` links the GKE cluster's console page from the start of its try."""

from __future__ import annotations

from typing import Any, cast
from unittest import mock

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.links import GKEClusterLink
from airflow_provider_tpu_rl.operators.gke import GclusterDeployOperator


@pytest.mark.parametrize(
    ("task_id", "groups"),
    [("deploy_cluster", {"skip_groups": ["tpu"]}), ("deploy_tpu_pool", {"only_groups": ["tpu"]})],
)
def test_the_cluster_link_is_persisted_before_anything_runs(task_id: str, groups: dict[str, Any]) -> None:
    """Both deploys of the pipeline (the cluster, then its TPU pool alone) save the link they
    register: Airflow 3 shows an "Extra Links" heading for a registered link even when it is empty."""
    deploy = GclusterDeployOperator(
        task_id=task_id,
        project_id="my-proj",
        location="us-east5",
        zone="us-east5-b",
        cluster_name="tpu-rl",
        bucket="my-bucket",
        model="qwen3-30b-a3b",
        **groups,
    )
    hook = mock.MagicMock()
    hook.require_toolchain.side_effect = ConfigurationError("terraform is missing")
    deploy._hook = hook
    ti = mock.MagicMock()

    with pytest.raises(AirflowFailException, match="terraform is missing"):
        deploy.execute(cast("Any", {"ti": ti, "run_id": "manual__1", "dag_run": None}))

    ti.xcom_push.assert_called_once_with(
        key=GKEClusterLink.key,
        value={"project_id": "my-proj", "location": "us-east5", "cluster_name": "tpu-rl"},
    )
    assert GKEClusterLink.format_url(**ti.xcom_push.call_args.kwargs["value"]) == (
        "https://console.cloud.google.com/kubernetes/clusters/details/us-east5/tpu-rl/details?project=my-proj"
    )
    assert [link.name for link in GclusterDeployOperator.operator_extra_links] == ["GKE Cluster"]
