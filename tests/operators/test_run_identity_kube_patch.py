"""``PATCH`` of a JobSet in the fake Kubernetes API, as the real API server answers it, and the
provider's ``JobSetClient.annotate``/``writing`` against it.

Rules (kubernetes ``staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/customresource_handler.go``,
``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go``): a custom resource takes JSON
patch and JSON merge patch, not the strategic merge patch (415 ``UnsupportedMediaType``, checked
before the object is looked up); a missing object is 404; a stale ``resourceVersion`` in the patch
is 409 ``Conflict``; a write bumps ``resourceVersion``, a no-op patch does not.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_tpu_rl.hooks.kubernetes import (
    RUN_DIR_ANNOTATION,
    RUN_ID_ANNOTATION,
    ClusterAccess,
    JobSetClient,
    RunDirJob,
)
from airflow_provider_tpu_rl.toolchain.job_output import JobState
from tests.support.sandbox_run import SandboxRun, prepare_cluster
from tpu_rl_sandbox.apis import kube_access

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
MERGE = "application/merge-patch+json"
RUN_DIR = "gs://bkt/model/trained/rl-7/"


def _jobset(name: str, script: str) -> dict[str, Any]:
    container = {"name": "workload", "image": "busybox", "command": ["/bin/bash", "-c", script]}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "main-job",
                    "replicas": 1,
                    "template": {
                        "spec": {"parallelism": 1, "template": {"spec": {"containers": [container]}}}
                    },
                }
            ]
        },
    }


@pytest.fixture
def access(sb: SandboxRun) -> kube_access.ClusterAccess:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf)
    access = sb.kube()
    script = "python3 -m maxtext.trainers.post_train.rl.train_rl run_name=rl-7 base_output_directory=gs://bkt/model/trained"
    created = kube_access.request(access, "POST", JOBSETS, _jobset("js-1", script))
    assert created.status == 201, created.text
    return access


def _patch(
    access: kube_access.ClusterAccess, body: Any, content_type: str = MERGE, name: str = "js-1"
) -> Any:
    return kube_access.request(access, "PATCH", f"{JOBSETS}/{name}", body, content_type=content_type)


def test_merge_patch_sets_and_removes_annotations_and_bumps_the_resource_version(
    access: kube_access.ClusterAccess,
) -> None:
    # A suspended JobSet: no controller writes its status while the test runs, so a resourceVersion
    # that moves is the patches' own doing (js-1's pods start and run meanwhile, at the load's pace).
    still = _jobset("js-still", "true")
    still["spec"]["suspend"] = True
    created = kube_access.request(access, "POST", JOBSETS, still)
    assert created.status == 201, created.text
    before = kube_access.request(access, "GET", f"{JOBSETS}/js-still").json()

    def patch(body: Any) -> Any:
        return _patch(access, body, name="js-still")

    added = patch({"metadata": {"annotations": {RUN_DIR_ANNOTATION: RUN_DIR, "a.io/b": "c"}}})

    assert added.status == 200, added.text
    body = added.json()
    assert body["metadata"]["annotations"] == {RUN_DIR_ANNOTATION: RUN_DIR, "a.io/b": "c"}
    assert body["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert body["spec"]["replicatedJobs"] == before["spec"]["replicatedJobs"]
    got = kube_access.request(access, "GET", f"{JOBSETS}/js-still").json()
    assert got["metadata"]["annotations"] == body["metadata"]["annotations"]

    # the same patch again changes nothing: no write, the same resourceVersion
    again = patch({"metadata": {"annotations": {RUN_DIR_ANNOTATION: RUN_DIR}}})
    assert again.json()["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]

    removed = patch({"metadata": {"annotations": {"a.io/b": None}}})
    assert removed.json()["metadata"]["annotations"] == {RUN_DIR_ANNOTATION: RUN_DIR}


def test_json_patch_is_accepted(access: kube_access.ClusterAccess) -> None:
    answer = _patch(
        access,
        [{"op": "add", "path": "/metadata/annotations", "value": {"x.io/y": "z"}}],
        content_type="application/json-patch+json",
    )
    assert answer.status == 200, answer.text
    assert answer.json()["metadata"]["annotations"] == {"x.io/y": "z"}


@pytest.mark.parametrize(
    "content_type",
    ["application/strategic-merge-patch+json", "application/json", "text/plain"],
)
def test_other_content_types_are_415_even_for_a_missing_object(
    access: kube_access.ClusterAccess, content_type: str
) -> None:
    for name in ("js-1", "absent"):
        answer = _patch(access, {"metadata": {"annotations": {"a": "b"}}}, content_type, name=name)
        assert answer.status == 415, answer.text
        assert answer.json()["reason"] == "UnsupportedMediaType"
        assert "application/merge-patch+json" in answer.json()["message"]


def test_a_missing_jobset_is_404(access: kube_access.ClusterAccess) -> None:
    answer = _patch(access, {"metadata": {"annotations": {"a": "b"}}}, name="absent")
    assert answer.status == 404
    assert answer.json()["reason"] == "NotFound"


def test_a_stale_resource_version_is_a_conflict(access: kube_access.ClusterAccess) -> None:
    answer = _patch(access, {"metadata": {"resourceVersion": "1", "annotations": {"a": "b"}}})
    assert answer.status == 409, answer.text
    assert answer.json()["reason"] == "Conflict"


def test_invalid_labels_and_spec_changes_are_refused(access: kube_access.ClusterAccess) -> None:
    label = _patch(access, {"metadata": {"labels": {"tpu-rl.io/run-dir": RUN_DIR}}})  # a label cannot hold it
    assert label.status == 422, label.text
    spec = _patch(access, {"spec": {"replicatedJobs": None}})
    assert spec.status == 422, spec.text


def _client(access: kube_access.ClusterAccess, sb: SandboxRun) -> JobSetClient:
    import base64

    ca = base64.b64encode(access.ca_pem.encode()).decode()
    return JobSetClient(ClusterAccess(access.url, ca), "google_cloud_default")


def test_the_hook_annotates_and_finds_the_jobs_writing_a_directory(
    sb: SandboxRun, access: kube_access.ClusterAccess
) -> None:
    client = _client(access, sb)

    async def scenario() -> tuple[list[RunDirJob], dict[str, Any] | None, list[RunDirJob], Any]:
        try:
            async with client.connection() as api:
                by_command = await client.writing(api, RUN_DIR.rstrip("/"))
                patched = await client.annotate(
                    api, "default", "js-1", {RUN_DIR_ANNOTATION: "gs://bkt/other/", RUN_ID_ANNOTATION: "d/r"}
                )
                by_annotation = await client.writing(api, "gs://bkt/other")
                missing = await client.annotate(api, "default", "absent", {RUN_ID_ANNOTATION: "d/r"})
                return by_command, patched, by_annotation, missing
        finally:
            await client.close()

    by_command, patched, by_annotation, missing = asyncio.run(scenario())

    assert [(j.name, j.namespace, j.run_id) for j in by_command] == [("js-1", "default", None)]
    assert patched is not None
    assert patched["metadata"]["annotations"][RUN_ID_ANNOTATION] == "d/r"
    # the annotation wins over the command line
    assert [(j.name, j.run_id) for j in by_annotation] == [("js-1", "d/r")]
    assert isinstance(by_annotation[0].state, JobState)
    assert missing is None
