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
    GCSObjectLink,
    GKEClusterLink,
    GKEWorkloadLink,
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


LINK_CLASSES = [GKEClusterLink, GKEWorkloadLink, GCSBrowserLink, GCSObjectLink, CloudLoggingJobLink]


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


def test_gcs_object_link_opens_the_objects_details_page() -> None:
    url = GCSObjectLink.format_url(uri="gs://bkt/qwen3/trained/rl/tpu-rl-curves-ab12.png", project_id="p")

    assert url == (
        "https://console.cloud.google.com/storage/browser/_details/bkt/qwen3/trained/rl/"
        "tpu-rl-curves-ab12.png;tab=live_object?project=p"
    )


@pytest.mark.parametrize("uri", ["gs://bkt", "gs://bkt/folder/", "/tmp/x.png"])
def test_gcs_object_link_refuses_what_is_not_an_object(uri: str) -> None:
    with pytest.raises(ValueError):
        GCSObjectLink.format_url(uri=uri)


def test_persist_none_leaves_an_empty_link(monkeypatch) -> None:
    ti = mock.MagicMock()

    GCSObjectLink.persist_none({"ti": ti})

    ti.xcom_push.assert_called_once_with(key="tpu_rl_run_curves", value="")
    monkeypatch.setattr(links.XCom, "get_value", mock.MagicMock(return_value=""))
    assert GCSObjectLink().get_link(mock.MagicMock(), ti_key=mock.sentinel.ti_key) == ""


def test_provider_info_follows_airflows_schema() -> None:
    import json
    from pathlib import Path

    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    assert "airflow_provider_tpu_rl.operators.ledger" in get_provider_info()["operators"][0]["python-modules"]


def test_every_module_the_provider_lists_imports() -> None:
    import importlib

    info = get_provider_info()
    modules = [
        module
        for kind in ("hooks", "operators", "sensors", "triggers")
        for entry in info[kind]
        for module in entry["python-modules"]
    ]
    for module in modules:
        importlib.import_module(module)
    for link in info["extra-links"]:
        module, _, name = link.rpartition(".")
        assert hasattr(importlib.import_module(module), name), link
