"""The fake Kubernetes API of a fake GKE cluster, endpoint by endpoint, against the real server.

Jobs are submitted with the fake ``gcluster job submit`` (which applies the JobSet as the real one
does) or POSTed; the API is read with ``kubernetes_asyncio`` (the client the provider's
``GKEKubernetesAsyncHook`` uses) or plain ``urllib`` over TLS verified against the cluster CA.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from tests.sandbox.conftest import Cli, Cluster, deploy_args, submit_args, wait_for
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.apis.kube_access import ClusterAccess

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) (.*)$")
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


@pytest.fixture
def access(cli: Cli, cluster: Cluster) -> ClusterAccess:
    return kube_access.cluster_access(cli.layout, cluster.project, cluster.region, cluster.name)


@asynccontextmanager
async def api_client(access: ClusterAccess) -> AsyncIterator[k8s.ApiClient]:
    """An ApiClient configured as GKEKubernetesAsyncHook configures it (CA file, Bearer header)."""
    with tempfile.NamedTemporaryFile("w", suffix=".crt", delete=False) as handle:
        handle.write(access.ca_pem)
    configuration = k8s.Configuration(host=access.url)
    configuration.ssl_ca_cert = handle.name
    api = k8s.ApiClient(configuration, header_name="Authorization", header_value=f"Bearer {access.token}")
    try:
        yield api
    finally:
        await api.close()
        Path(handle.name).unlink(missing_ok=True)


def get(access: ClusterAccess, path: str, **query: str) -> kube_access.Response:
    suffix = "?" + urllib.parse.urlencode(query) if query else ""
    return kube_access.request(access, "GET", path + suffix)


def jobset(access: ClusterAccess, name: str) -> dict[str, Any]:
    answer = get(access, f"{JOBSETS}/namespaces/default/jobsets/{name}")
    assert answer.status == 200, answer.text
    return dict(answer.json())


def finished(access: ClusterAccess, name: str) -> dict[str, Any]:
    return dict(
        wait_for(lambda: (js := jobset(access, name))["status"].get("terminalState") and js, what=name)
    )


def pods(access: ClusterAccess, name: str) -> list[dict[str, Any]]:
    answer = get(
        access, "/api/v1/namespaces/default/pods", labelSelector=f"jobset.sigs.k8s.io/jobset-name={name}"
    )
    assert answer.status == 200, answer.text
    return list(answer.json()["items"])


def log(access: ClusterAccess, pod: str, **query: str) -> kube_access.Response:
    return get(access, f"/api/v1/namespaces/default/pods/{pod}/log", **query)


def gated(cluster: Cluster, gate: str, lines: int) -> str:
    """A command that prints ``lines`` numbered lines, then waits for ``gs://<bucket>/<gate>``."""
    return (
        f'for i in $(seq 1 {lines}); do echo "workload line $i"; done; '
        f"until gcloud storage ls gs://{cluster.bucket}/{gate} >/dev/null 2>&1; do sleep 0.1; done; "
        f'for i in $(seq {lines + 1} {2 * lines}); do echo "workload line $i"; done'
    )


def release(cli: Cli, cluster: Cluster, gate: str) -> None:
    cli.api.upload(cluster.bucket, gate, b"go")


def submit(cli: Cli, name: str, command: str, *extra: str, env: dict[str, str] | None = None) -> None:
    result = cli.gcluster(*submit_args(name, command, *extra), env=env)
    assert result.code == 0, result.text


def pathways(cluster: Cluster) -> list[str]:
    return ["--pathways", "--pathways-gcs-location", f"gs://{cluster.bucket}/pathways/"]


# ===================================================================================== auth
@pytest.mark.parametrize("token", [None, "ya29.made-up"], ids=["no-token", "unknown-token"])
def test_every_endpoint_needs_an_issued_token(access: ClusterAccess, token: str | None) -> None:
    for path in (
        f"{JOBSETS}/jobsets",
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/default/pods/x/log",
    ):
        answer = kube_access.request(access, "GET", path, token=token)
        assert answer.status == 401
        assert answer.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        }


def test_tls_is_verified_against_the_cluster_ca(access: ClusterAccess) -> None:
    with pytest.raises(urllib.error.URLError) as raised:
        urllib.request.urlopen(  # noqa: S310
            access.url + f"{JOBSETS}/jobsets", timeout=10, context=ssl.create_default_context()
        )
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)


# ================================================================================== JobSets
def test_submitted_jobset_is_listed_got_and_finishes_as_the_controller_writes_it(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    submit(cli, "plain", "echo hello")
    listed = get(access, f"{JOBSETS}/jobsets", labelSelector="gcluster.google.com/workload=plain").json()
    assert listed["kind"] == "JobSetList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["plain"]
    assert (
        get(access, f"{JOBSETS}/jobsets", labelSelector="gcluster.google.com/workload=other").json()["items"]
        == []
    )
    done = finished(access, "plain")
    assert done["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert done["metadata"]["namespace"] == "default"
    assert done["metadata"]["labels"] == {
        "gcluster.google.com/workload": "plain",
        "kueue.x-k8s.io/queue-name": "default-queue",
    }
    assert done["spec"]["suspend"] is False
    [main] = done["spec"]["replicatedJobs"]
    assert main["name"] == "main-job"
    assert main["replicas"] == 1
    assert main["template"]["spec"]["parallelism"] == 8  # 4x8 on ct6e-standard-4t
    container = main["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "workload-container"
    assert container["command"] == ["/bin/bash", "-c", "echo hello"]
    status = done["status"]
    assert status["terminalState"] == "Completed"
    assert status["restarts"] == 0
    completed = [c for c in status["conditions"] if c["type"] == "Completed"]
    assert completed[0]["status"] == "True"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", completed[0]["lastTransitionTime"])
    assert status["replicatedJobsStatus"] == [
        {"name": "main-job", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]
    listed_by_cli = cli.gcluster("job", "list")
    assert re.search(
        r"^plain\s+Succeeded\s+\S+\s+" + completed[0]["lastTransitionTime"], listed_by_cli.out, re.M
    )


def test_unknown_jobset_is_a_not_found_status(access: ClusterAccess) -> None:
    answer = get(access, f"{JOBSETS}/namespaces/default/jobsets/nope")
    assert answer.status == 404
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'jobsets.jobset.x-k8s.io "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "jobsets", "group": "jobset.x-k8s.io"},
        "code": 404,
    }


def _two_container_jobset(name: str, command: str) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"team": "rl"}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "main",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {
                                            "name": "app",
                                            "image": "python:3.12",
                                            "command": ["/bin/bash", "-c", command],
                                        },
                                        {"name": "helper", "image": "busybox"},
                                    ],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }


def test_create_conflict_container_errors_and_delete(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    async def scenario() -> None:
        async with api_client(access) as api:
            custom = k8s.CustomObjectsApi(api)
            body = _two_container_jobset("posted", gated(cluster, "posted-go", 3))
            created = await custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
            assert created["metadata"]["name"] == "posted"
            assert created["spec"]["suspend"] is False
            with pytest.raises(ApiException) as conflict:
                await custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
            assert conflict.value.status == 409
            assert '"reason":"AlreadyExists"' in str(conflict.value.body).replace(" ", "")
            listed = await custom.list_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, label_selector="team=rl"
            )
            assert [i["metadata"]["name"] for i in listed["items"]] == ["posted"]

            core = k8s.CoreV1Api(api)

            async def running() -> str:
                found = await core.list_namespaced_pod(
                    "default", label_selector="jobset.sigs.k8s.io/jobset-name=posted"
                )
                if found.items and found.items[0].status.phase == "Running":
                    return str(found.items[0].metadata.name)
                return ""

            pod = ""
            deadline = time.monotonic() + 60
            while not pod and time.monotonic() < deadline:
                pod = await running()
                await asyncio.sleep(0.05)
            assert pod.startswith("posted-main-0-0-")
            with pytest.raises(ApiException) as unnamed:
                await core.read_namespaced_pod_log(pod, "default")
            assert unnamed.value.status == 400
            assert f"a container name must be specified for pod {pod}, choose one of: [app helper]" in str(
                unnamed.value.body
            )
            with pytest.raises(ApiException) as unknown:
                await core.read_namespaced_pod_log(pod, "default", container="nope")
            assert unknown.value.status == 400
            assert f"container nope is not valid for pod {pod}" in str(unknown.value.body)
            wait_for(lambda: "workload line 3" in log(access, pod, container="app").text, what="first lines")

            deleted = await custom.delete_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, "posted"
            )
            assert deleted["status"] == "Success"
            assert deleted["details"]["name"] == "posted"
            with pytest.raises(ApiException) as gone:
                await custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "posted")
            assert gone.value.status == 404
            assert (
                await core.list_namespaced_pod(
                    "default", label_selector="jobset.sigs.k8s.io/jobset-name=posted"
                )
            ).items == []

    asyncio.run(scenario())
    assert cli.job(cluster.project, cluster.region, cluster.name, "posted") is None


# ===================================================================================== pods
def test_pods_by_label_carry_jobset_and_job_metadata(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    submit(cli, "labelled", "echo hi", *pathways(cluster))
    finished(access, "labelled")
    everything = pods(access, "labelled")
    assert len(everything) == 9
    head = get(
        access,
        "/api/v1/namespaces/default/pods",
        labelSelector="jobset.sigs.k8s.io/jobset-name=labelled,jobset.sigs.k8s.io/replicatedjob-name=pathways-head",
    ).json()["items"]
    assert len(head) == 1
    meta = head[0]["metadata"]
    assert re.fullmatch(r"labelled-pathways-head-0-0-[bcdfghjklmnpqrstvwxz2456789]{5}", meta["name"])
    assert meta["namespace"] == "default"
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    for key, value in {
        "jobset.sigs.k8s.io/jobset-name": "labelled",
        "jobset.sigs.k8s.io/replicatedjob-name": "pathways-head",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": "0",
        "batch.kubernetes.io/job-completion-index": "0",
        "batch.kubernetes.io/job-name": "labelled-pathways-head-0",
    }.items():
        assert meta["labels"][key] == value
        if key != "batch.kubernetes.io/job-name":
            assert meta["annotations"][key] == value
    spec = head[0]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["pathways-proxy", "pathways-rm"]
    assert [c["restartPolicy"] for c in spec["initContainers"]] == ["Always", "Always"]
    assert [c["name"] for c in spec["containers"]] == ["workload-container"]
    status = head[0]["status"]
    assert status["phase"] == "Succeeded"
    assert status["startTime"]
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert [s["name"] for s in status["initContainerStatuses"]] == ["pathways-proxy", "pathways-rm"]
    workers = get(
        access,
        "/api/v1/namespaces/default/pods",
        labelSelector="jobset.sigs.k8s.io/jobset-name=labelled,jobset.sigs.k8s.io/replicatedjob-name!=pathways-head",
    ).json()["items"]
    assert sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in workers) == [
        str(i) for i in range(8)
    ]
    assert {c["name"] for p in workers for c in p["spec"]["containers"]} == {"pathways-worker"}
    assert (
        get(access, f"/api/v1/namespaces/default/pods/{meta['name']}").json()["metadata"]["uid"]
        == meta["uid"]
    )
    assert get(access, "/api/v1/namespaces/default/pods/nope").json()["message"] == 'pods "nope" not found'
    assert (
        get(
            access, "/api/v1/namespaces/other/pods", labelSelector="jobset.sigs.k8s.io/jobset-name=labelled"
        ).json()["items"]
        == []
    )


def test_a_jobset_created_suspended_without_a_queue_label_stays_suspended(
    cli: Cli, access: ClusterAccess
) -> None:
    """Kueue manages only jobs with a queue label: a JobSet created suspended without one is in no
    queue, and nothing resumes it, while a job submitted after it is admitted and runs."""
    held = _two_container_jobset("held", "echo never")
    held["spec"]["suspend"] = True
    created = kube_access.request(access, "POST", f"{JOBSETS}/namespaces/default/jobsets", held)
    assert created.status == 201, created.text
    submit(cli, "after", "echo ran")
    assert finished(access, "after")["status"]["terminalState"] == "Completed"
    still = jobset(access, "held")
    assert still["spec"]["suspend"] is True
    assert [c["type"] for c in still["status"]["conditions"]] == ["Suspended"]
    assert pods(access, "held") == []
    assert still["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]


def test_a_restart_makes_new_pods_with_the_next_restart_attempt(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    command = (
        f"if gcloud storage ls gs://{cluster.bucket}/first-try >/dev/null 2>&1; then echo second try; else "
        f"echo first > /tmp/first && gcloud storage cp /tmp/first gs://{cluster.bucket}/first-try && exit 3; fi"
    )
    submit(cli, "again", command, "--restarts", "1")
    done = finished(access, "again")
    assert done["status"]["terminalState"] == "Completed"
    assert done["status"]["restarts"] == 1
    current = pods(access, "again")
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in current} == {"1"}
    main = next(p for p in current if p["metadata"]["name"].startswith("again-main-job-0-0-"))
    assert log(access, main["metadata"]["name"]).text == "second try\n"


# ===================================================================================== logs
def test_log_options_timestamps_tail_since_and_refusals(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    submit(cli, "logged", 'for i in $(seq 1 40); do echo "line $i"; done')
    finished(access, "logged")
    main = next(p for p in pods(access, "logged") if p["metadata"]["name"].startswith("logged-main-job-0-0-"))
    name = main["metadata"]["name"]
    plain = log(access, name)
    assert plain.status == 200
    assert plain.headers["Content-Type"].startswith("text/plain")
    assert plain.text == "".join(f"line {i}\n" for i in range(1, 41))
    stamped = log(access, name, timestamps="true").text.splitlines()
    parsed = [STAMP.match(line) for line in stamped]
    assert all(parsed)
    assert [m.group(2) for m in parsed if m] == [f"line {i}" for i in range(1, 41)]
    times = [m.group(1) for m in parsed if m]
    assert times == sorted(times, key=lambda t: (t[:19], t[20:-1].ljust(9, "0")))
    assert log(access, name, tailLines="3").text == "line 38\nline 39\nline 40\n"
    assert log(access, name, tailLines="0").text == ""
    assert log(access, name, limitBytes="8").text == "line 1\nl"
    # sinceTime is truncated to whole seconds on its way to the kubelet: every line of that second comes back
    last = times[-1]
    second = last[:19]
    expected = [f"line {i + 1}" for i, t in enumerate(times) if t[:19] >= second]
    assert log(access, name, sinceTime=last).text.splitlines() == expected
    assert log(access, name, sinceTime="2999-01-01T00:00:00Z").text == ""
    assert log(access, name, sinceTime="2000-01-01T00:00:00Z").text == plain.text
    assert log(access, name, sinceSeconds="3600").text == plain.text

    both = log(access, name, sinceTime=last, sinceSeconds="10")
    assert both.status == 422
    assert both.json()["reason"] == "Invalid"
    assert both.json()["message"] == (
        f'PodLogOptions "{name}" is invalid: : Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified'
    )
    assert log(access, name, tailLines="-1").status == 422
    previous = log(access, name, previous="true")
    assert previous.status == 400
    assert (
        previous.json()["message"]
        == f'previous terminated container "workload-container" in pod "{name}" not found'
    )
    unknown = log(access, name, container="nope")
    assert (unknown.status, unknown.json()["message"]) == (400, f"container nope is not valid for pod {name}")
    assert log(access, "nope").status == 404


def test_a_waiting_container_is_refused_until_it_starts(
    cli: Cli, cluster: Cluster, access: ClusterAccess, tmp_path: Path
) -> None:
    hold = tmp_path / "pods-wait"
    hold.touch()
    submit(cli, "waiting", "echo started", env={"TPU_RL_SANDBOX_POD_HOLD_FILE": str(hold)})
    current = wait_for(lambda: pods(access, "waiting"), what="pods")
    main = next(p for p in current if p["metadata"]["name"].startswith("waiting-main-job-0-0-"))
    assert main["status"]["phase"] == "Pending"
    assert main["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    name = main["metadata"]["name"]
    refused = log(access, name, container="workload-container")
    assert refused.status == 400
    assert refused.json()["message"] == (
        f'container "workload-container" in pod "{name}" is waiting to start: ContainerCreating'
    )
    hold.unlink()
    finished(access, "waiting")
    assert log(access, name).text == "started\n"


def test_one_cluster_cannot_see_another_clusters_objects(
    cli: Cli, cluster: Cluster, access: ClusterAccess, names: dict[str, str]
) -> None:
    submit(cli, "mine", "echo mine")
    finished(access, "mine")
    other_names = {**names, "cluster": names["cluster"] + "o"}
    deployed = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(other_names, backend=False))
    assert deployed.code == 0, deployed.text
    other = kube_access.cluster_access(cli.layout, cluster.project, cluster.region, other_names["cluster"])
    assert other.url != access.url
    assert get(other, f"{JOBSETS}/jobsets").json()["items"] == []
    assert get(other, f"{JOBSETS}/namespaces/default/jobsets/mine").status == 404
    assert get(other, "/api/v1/namespaces/default/pods").json()["items"] == []
    pod = pods(access, "mine")[0]["metadata"]["name"]
    assert log(other, pod).status == 404
    assert [i["metadata"]["name"] for i in get(access, f"{JOBSETS}/jobsets").json()["items"]] == ["mine"]


def _containers(items: list[dict[str, Any]]) -> list[str]:
    return [
        f"{p['metadata']['name']}/{c['name']}"
        for p in items
        for c in (p["spec"].get("initContainers") or []) + p["spec"]["containers"]
    ]


def test_pathways_v6e_32_job_has_11_containers_and_its_workload_is_followed_in_full(
    cli: Cli, cluster: Cluster, access: ClusterAccess
) -> None:
    lines = 300
    submit(cli, "pw32", gated(cluster, "pw32-go", lines), *pathways(cluster))

    def head_running() -> dict[str, Any] | None:
        for pod in pods(access, "pw32"):
            statuses = pod["status"].get("containerStatuses") or []
            if (
                pod["metadata"]["name"].startswith("pw32-pathways-head-0-0-")
                and "running" in statuses[0]["state"]
            ):
                return pod
        return None

    head = wait_for(head_running, what="workload container to run")
    assert len(_containers(pods(access, "pw32"))) == 11
    followed: list[str] = []

    async def follow() -> None:
        async with api_client(access) as api:
            response: Any = await k8s.CoreV1Api(api).read_namespaced_pod_log(
                head["metadata"]["name"],
                "default",
                container="workload-container",
                follow=True,
                timestamps=True,
                _preload_content=False,
            )
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                followed.extend(line.decode() for line in complete)
                if len(followed) == lines:  # the first half is in: let the program go on
                    release(cli, cluster, "pw32-go")
            assert buffer == b""

    asyncio.run(follow())
    texts = [m.group(2) for m in map(STAMP.match, followed) if m]
    assert texts == [f"workload line {i}" for i in range(1, 2 * lines + 1)]
    finished(access, "pw32")

    # a reader that resumes from its last timestamp gets that whole second again and nothing older
    resume_at = STAMP.match(followed[lines - 1])
    assert resume_at is not None
    again = log(
        access,
        head["metadata"]["name"],
        container="workload-container",
        timestamps="true",
        sinceTime=resume_at.group(1),
    )
    resumed = again.text.splitlines()
    assert resumed == [line for line in followed if line[:19] >= resume_at.group(1)[:19]]
    assert resumed[-1] == followed[-1]

    refused = cli.gcluster("job", "logs", "pw32", "-f")
    assert refused.code == 1
    assert (
        "error: you are attempting to follow 11 log streams, but maximum allowed concurrency is 10, use "
        "--max-log-requests to increase the limit\n" in refused.err
    )
    assert refused.err.endswith("Error: exit status 1\n")
    snapshot = cli.gcluster("job", "logs", "pw32")
    assert snapshot.code == 0
    assert snapshot.err.count("workload line") == 10  # kubectl's --tail=10 per container with a selector
    assert "Starting Pathways resource manager on port 29001" in snapshot.err


def test_a_hold_file_reading_tpu_holds_only_the_jobs_that_request_tpus(tmp_path: Path) -> None:
    from tpu_rl_sandbox.apis.kube_api import POD_HOLD_TPU_ONLY
    from tpu_rl_sandbox.machines.job_worker import _held

    hold = tmp_path / "hold"
    tpu_job, cpu_job = {"tpu": 32}, {"tpu": 0}
    assert not _held(hold, tpu_job)  # no file: nothing waits
    hold.write_text("hold")
    assert _held(hold, tpu_job)
    assert _held(hold, cpu_job)
    hold.write_text(POD_HOLD_TPU_ONLY + "\n")
    assert _held(hold, tpu_job)
    assert not _held(hold, cpu_job)


def test_a_finished_jobs_record_never_signals_the_process_that_took_its_pid() -> None:
    """pids are reused: a job whose worker ended keeps its pid in its record, and with two suites on
    one machine that pid once became another suite's API server (a session leader), which the
    job's deletion then killed. Only the job's own worker (its argv names the job's uid) is signalled."""
    import subprocess
    import sys

    from tpu_rl_sandbox.apis import kube_api

    stranger = subprocess.Popen(  # a session leader, as the API server and the job workers are
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        job = {"pid": stranger.pid, "uid": "a-finished-jobs-uid"}
        kube_api.stop_worker(job)
        kube_api.wait_worker_stopped(job, grace=0.2)
        time.sleep(0.2)
        assert stranger.poll() is None, "a process that is not the job's worker was signalled"
    finally:
        stranger.kill()
        stranger.wait(timeout=30)


def _placeholder(name: str, topology: str = "4x8") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": topology,
            },
            "containers": [
                {
                    "name": "placeholder",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}},
                }
            ],
        },
    }


def test_a_standalone_pod_is_placed_on_a_tpu_node_or_left_pending_with_its_events(
    access: ClusterAccess,
) -> None:
    pods_path = "/api/v1/namespaces/default/pods"
    created = kube_access.request(access, "POST", pods_path, _placeholder("probe"))
    assert created.status == 201, created.json()
    placed = get(access, f"{pods_path}/probe").json()
    assert placed["status"]["phase"] == "Running"
    assert placed["spec"]["nodeName"].startswith("gke-")
    assert {c["type"]: c["status"] for c in placed["status"]["conditions"]} == {"PodScheduled": "True"}
    assert "probe" in [p["metadata"]["name"] for p in get(access, pods_path).json()["items"]]
    again = kube_access.request(access, "POST", pods_path, _placeholder("probe"))
    assert (again.status, again.json()["reason"]) == (409, "AlreadyExists")
    invalid = kube_access.request(
        access, "POST", pods_path, {"metadata": {"name": "bad"}, "spec": {"containers": []}}
    )
    assert (invalid.status, invalid.json()["reason"]) == (422, "Invalid")
    assert invalid.json()["message"] == 'Pod "bad" is invalid: spec.containers: Required value'

    # no slice of that topology: Pending, the scheduler's FailedScheduling, no scale-up refusal
    assert kube_access.request(access, "POST", pods_path, _placeholder("nowhere", "2x4")).status == 201
    pending = get(access, f"{pods_path}/nowhere").json()
    assert pending["status"]["phase"] == "Pending"
    assert pending["status"]["conditions"][0]["reason"] == "Unschedulable"
    events = get(
        access,
        "/api/v1/namespaces/default/events",
        fieldSelector="involvedObject.kind=Pod,involvedObject.name=nowhere",
    ).json()
    assert [(e["reason"], e["source"]["component"]) for e in events["items"]] == [
        ("FailedScheduling", "default-scheduler")
    ]
    refused = get(access, "/api/v1/namespaces/default/events", fieldSelector="spec.nope=x")
    assert (refused.status, refused.json()["message"]) == (400, "field label not supported: spec.nope")

    for name in ("probe", "nowhere"):
        assert kube_access.request(access, "DELETE", f"{pods_path}/{name}").status == 200
        assert get(access, f"{pods_path}/{name}").status == 404
    assert kube_access.request(access, "DELETE", f"{pods_path}/probe").status == 404
