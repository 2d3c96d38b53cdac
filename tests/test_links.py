"""Console links: URLs built, persisted to XCom, read back by get_link."""

from __future__ import annotations

from typing import Any
from unittest import mock
from urllib.parse import unquote

import pytest

from airflow_provider_tpu_rl import links
from airflow_provider_tpu_rl.get_provider_info import get_provider_info
from airflow_provider_tpu_rl.links import (
    CloudLoggingJobLink,
    GCSBrowserLink,
    GKEClusterLink,
    GKEWorkloadLink,
    RunDashboardLink,
)


def test_gke_workload_link_points_at_the_pathways_head_job() -> None:
    url = GKEWorkloadLink.format_url(
        project_id="my-proj", location="us-east5", cluster_name="rl-v6e", jobset_name="rl-qwen3-0822"
    )

    assert url == (
        "https://console.cloud.google.com/kubernetes/job/us-east5/rl-v6e/default/"
        "rl-qwen3-0822-pathways-head-0/details?project=my-proj"
    )


def test_gke_workload_link_without_pathways_uses_the_first_main_job() -> None:
    url = GKEWorkloadLink.format_url(
        project_id="p",
        location="us-east5",
        cluster_name="c",
        jobset_name="convert-ckpt",
        namespace="ml",
        pathways=False,
    )

    assert (
        url
        == "https://console.cloud.google.com/kubernetes/job/us-east5/c/ml/convert-ckpt-main-job-0/details?project=p"
    )


@pytest.mark.parametrize(
    ("uri", "project", "expected"),
    [
        (
            "gs://bkt/qwen3-30b-a3b/trained/rl/checkpoints/actor/",
            "p",
            "https://console.cloud.google.com/storage/browser/bkt/qwen3-30b-a3b/trained/rl/checkpoints/actor/?project=p",
        ),
        ("gs://bkt", None, "https://console.cloud.google.com/storage/browser/bkt"),
        (
            "gs://bkt/odd name#1/",
            None,
            "https://console.cloud.google.com/storage/browser/bkt/odd%20name%231/",
        ),
    ],
)
def test_gcs_browser_link(uri: str, project: str | None, expected: str) -> None:
    assert GCSBrowserLink.format_url(uri=uri, project_id=project) == expected


def test_gcs_browser_link_rejects_non_gcs_uris() -> None:
    with pytest.raises(ValueError):
        GCSBrowserLink.format_url(uri="/dev/shm/llama/hf-trained/")


def test_cloud_logging_link_queries_the_jobset_pods() -> None:
    url = CloudLoggingJobLink.format_url(
        project_id="my-proj", jobset_name="rl-gemma4", location="us-east5", cluster_name="rl-v6e"
    )

    prefix = "https://console.cloud.google.com/logs/query;query="
    assert url.startswith(prefix)
    query_part, _, project_part = url[len(prefix) :].partition("?")
    encoded_query, *matrix = query_part.split(";")
    assert matrix == ["storageScope=project", "duration=P1D"]
    assert project_part == "project=my-proj"
    assert "\n" not in encoded_query
    assert " " not in encoded_query
    assert unquote(encoded_query).splitlines() == [
        'resource.type="k8s_container"',
        'resource.labels.project_id="my-proj"',
        'resource.labels.location="us-east5"',
        'resource.labels.cluster_name="rl-v6e"',
        'resource.labels.namespace_name="default"',
        'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"="rl-gemma4"',
    ]


def test_logging_filter_escapes_quotes() -> None:
    query = CloudLoggingJobLink.logging_filter(project_id="p", jobset_name='a"b')

    assert query.splitlines()[-1] == 'labels."k8s-pod/jobset_sigs_k8s_io/jobset-name"="a\\"b"'
    assert "cluster_name" not in query


def test_persist_pushes_the_values_under_the_link_key() -> None:
    ti = mock.MagicMock()

    CloudLoggingJobLink.persist({"ti": ti}, project_id="p", jobset_name="j")

    ti.xcom_push.assert_called_once_with(
        key="tpu_rl_cloud_logging_job", value={"project_id": "p", "jobset_name": "j"}
    )


def test_get_link_in_the_persisting_try_reads_no_xcom_and_another_try_reads_it(monkeypatch) -> None:
    """Airflow 3's worker formats the links as the task ends, in the process that persisted them."""
    get_value = mock.MagicMock(return_value={"uri": "gs://b/earlier/"})
    monkeypatch.setattr(links.XCom, "get_value", get_value)
    ti = mock.MagicMock(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=2)

    GCSBrowserLink.persist({"ti": ti}, uri="gs://b/now/")

    assert GCSBrowserLink().get_link(mock.MagicMock(), ti_key=ti) == (
        "https://console.cloud.google.com/storage/browser/b/now/"
    )
    get_value.assert_not_called()
    earlier = mock.MagicMock(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)
    assert GCSBrowserLink().get_link(mock.MagicMock(), ti_key=earlier) == (
        "https://console.cloud.google.com/storage/browser/b/earlier/"
    )
    get_value.assert_called_once_with(key="tpu_rl_gcs_browser", ti_key=earlier)


def test_persist_refuses_values_that_cannot_make_a_url() -> None:
    ti = mock.MagicMock()

    with pytest.raises(TypeError):
        GKEWorkloadLink.persist({"ti": ti}, project_id="p")
    with pytest.raises(ValueError):
        GCSBrowserLink.persist({"ti": ti}, uri="s3://bucket/x")
    ti.xcom_push.assert_not_called()


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({"uri": "gs://b/x/"}, "https://console.cloud.google.com/storage/browser/b/x/"),
        (
            "https://console.cloud.google.com/storage/browser/b/y/",
            "https://console.cloud.google.com/storage/browser/b/y/",
        ),
        ("javascript:alert(1)", ""),
        ({"uri": "not-a-uri"}, ""),
        (None, ""),
    ],
)
def test_get_link_reads_the_persisted_values(monkeypatch, stored: Any, expected: str) -> None:
    get_value = mock.MagicMock(return_value=stored)
    monkeypatch.setattr(links.XCom, "get_value", get_value)
    ti_key = mock.sentinel.ti_key

    assert GCSBrowserLink().get_link(mock.MagicMock(), ti_key=ti_key) == expected
    get_value.assert_called_once_with(key="tpu_rl_gcs_browser", ti_key=ti_key)


LINK_CLASSES = [GKEClusterLink, GKEWorkloadLink, GCSBrowserLink, RunDashboardLink, CloudLoggingJobLink]


def test_link_names_and_keys_are_distinct() -> None:
    assert len({c.name for c in LINK_CLASSES}) == len(LINK_CLASSES)
    assert len({c.key for c in LINK_CLASSES}) == len(LINK_CLASSES)
    assert all(c().xcom_key == c.key for c in LINK_CLASSES)


def test_every_link_is_registered_with_the_provider() -> None:
    registered = set(get_provider_info()["extra-links"])

    assert registered == {f"{c.__module__}.{c.__qualname__}" for c in LINK_CLASSES}


def test_gke_cluster_link_is_the_google_providers_cluster_page() -> None:
    from airflow.providers.google.cloud.links.kubernetes_engine import KUBERNETES_CLUSTER_LINK

    url = GKEClusterLink.format_url(project_id="my-proj", location="us-east5", cluster_name="rl-v6e")

    assert url == "https://console.cloud.google.com" + KUBERNETES_CLUSTER_LINK.format(
        location="us-east5", cluster_name="rl-v6e", project_id="my-proj"
    )
    assert url == (
        "https://console.cloud.google.com/kubernetes/clusters/details/us-east5/rl-v6e/details?project=my-proj"
    )


def test_gke_cluster_link_needs_every_part() -> None:
    with pytest.raises(ValueError):
        GKEClusterLink.format_url(project_id="p", location="", cluster_name="c")


def test_run_curves_link_opens_the_runs_page_on_the_dashboard(monkeypatch) -> None:
    monkeypatch.setattr(links, "web_base_url", lambda: "https://airflow.example.com/base")

    url = RunDashboardLink.format_url(
        dag_id="tpu_rl_gke_pipeline", run_id="manual__2026-12-01T10:00:00+00:00"
    )

    assert url == (
        "https://airflow.example.com/base/tpu-rl/runs/tpu_rl_gke_pipeline/"
        "manual__2026-12-01T10%3A00%3A00%2B00%3A00"
    )
    with pytest.raises(ValueError):
        RunDashboardLink.format_url(dag_id="d", run_id="")


def test_the_web_base_url_is_the_ui_s_configured_one(monkeypatch) -> None:
    from airflow_provider_tpu_rl import compat

    section = "API" if compat.AIRFLOW_V_3_0_PLUS else "WEBSERVER"
    monkeypatch.setenv(f"AIRFLOW__{section}__BASE_URL", "http://host:8080/")
    assert compat.web_base_url() == "http://host:8080"
    assert RunDashboardLink.format_url(dag_id="d", run_id="r") == "http://host:8080/tpu-rl/runs/d/r"


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({"dag_id": "d", "run_id": "r 1"}, "http://ui/tpu-rl/runs/d/r%201"),
        ("http://ui/tpu-rl/runs/d/r", "http://ui/tpu-rl/runs/d/r"),  # Airflow 3 stores the URL
        ("https://console.cloud.google.com/storage/browser/_details/b/x.png", ""),
        ("javascript:alert(1)", ""),
        ("", ""),
    ],
)
def test_run_curves_link_reads_only_its_own_urls(monkeypatch, stored: Any, expected: str) -> None:
    monkeypatch.setattr(links, "web_base_url", lambda: "http://ui")
    monkeypatch.setattr(links.XCom, "get_value", mock.MagicMock(return_value=stored))

    assert RunDashboardLink().get_link(mock.MagicMock(), ti_key=mock.sentinel.ti_key) == expected
