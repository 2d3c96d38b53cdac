"""``deploy_cluster`` links the GKE cluster's console page from the start of its try."""

from __future__ import annotations

from typing import Any, cast
from unittest import mock

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.links import GKEClusterLink
from airflow_provider_tpu_rl.operators.gke import GclusterDeployOperator


def test_the_cluster_link_is_persisted_before_anything_runs() -> None:
    deploy = GclusterDeployOperator(
        task_id="deploy_cluster",
        project_id="my-proj",
        location="us-east5",
        zone="us-east5-b",
        cluster_name="tpu-rl",
        bucket="my-bucket",
        model="qwen3-30b-a3b",
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
