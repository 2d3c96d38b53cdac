"""A fake Kubernetes API per fake GKE cluster: JobSets, their pods and the pods' logs.

The objects and what each request does live here; :mod:`tpu_rl_sandbox.apis.kube_server` serves them
(only the API server process imports it).

Written from the Kubernetes API reference (https://kubernetes.io/docs/reference/kubernetes-api/)
and kubernetes-sigs/jobset (api/jobset/v1alpha2/jobset_types.go, pkg/constants/constants.go,
pkg/controllers/jobset_controller.go), not from any client. It serves only:

* ``GET /apis/jobset.x-k8s.io/v1alpha2/jobsets`` (all namespaces), ``GET|POST
  /apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets``, ``GET|DELETE|PATCH .../jobsets/{name}``
  (``PATCH``: JSON merge patch and JSON patch of ``metadata.labels``/``metadata.annotations``,
  :func:`patch_jobset`);
* ``GET /api/v1/namespaces/{ns}/pods`` (``labelSelector``), ``GET .../pods/{name}``;
* ``GET /api/v1/namespaces/{ns}/pods/{name}/log`` (``container``, ``follow``, ``timestamps``,
  ``sinceTime``, ``sinceSeconds``, ``tailLines``, ``limitBytes``, ``previous``);
* ``POST /api/v1/namespaces/{ns}/pods`` and ``DELETE .../pods/{name}`` of a standalone pod (not a
  JobSet's), placed or left Pending with its events at its create (:func:`create_pod`), and
  ``GET /api/v1/namespaces/{ns}/events`` (``fieldSelector``: :func:`list_events`).

Every request needs ``Authorization: Bearer <token>`` with a token the sandbox's token endpoint
issued (:mod:`tpu_rl_sandbox.apis.oauth`), else 401 ``Unauthorized``. TLS with the sandbox CA's
serving certificate (:mod:`tpu_rl_sandbox.apis.tls`). Each cluster is served on its own port and sees
only its own objects.

The objects live in the sandbox state: a JobSet is a record of the ``jobs`` document (its
``manifest`` as applied, plus what the controllers did: ``suspended``, ``attempt``, ``pods``), so
``gcluster job list|cancel|logs`` and this API read the same thing. Pods and container states are
written by the job worker (:mod:`tpu_rl_sandbox.machines.job_worker`, standing for the JobSet, Job and
kubelet controllers); container logs are CRI files (``<RFC3339Nano> stdout F <line>``) under
``jobs/<uid>/pods/<pod>/<container>.log``, read here as the kubelet does
(pkg/kubelet/kuberuntime/logs/logs.go ``ReadLogs``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tpu_rl_sandbox
from tpu_rl_sandbox.world import inventory
from tpu_rl_sandbox.world.inventory import PODS_DOC as PODS_DOC
from tpu_rl_sandbox.world.inventory import cluster_jobs as cluster_jobs
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timestamps import rfc3339

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
# kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go and pkg/constants/constants.go
JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_KEY = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_NAME_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS_KEY = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS_KEY = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX_KEY = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTARTS_KEY = "jobset.sigs.k8s.io/restart-attempt"
COORDINATOR_KEY = "jobset.sigs.k8s.io/coordinator"
# kubernetes pkg/apis/batch/types.go (labels and annotation the Job controller sets on pods)
JOB_COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID_KEY = "batch.kubernetes.io/controller-uid"
JOB_NAME_KEY = "batch.kubernetes.io/job-name"
QUEUE_NAME_KEY = "kueue.x-k8s.io/queue-name"
DEFAULT_NAMESPACE = "default"
# k8s.io/apimachinery/pkg/util/rand: the alphabet of generateName suffixes
NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
KUBE_ENDPOINTS_DOC = "kube_endpoints"
# While this file exists, a submitted job's pods stay Pending with their containers waiting
# (ContainerCreating / PodInitializing), as while nodes come up or images are pulled. A file that
# reads POD_HOLD_TPU_ONLY holds only the jobs that request TPUs (the CPU pool is up, the TPU nodes
# are still coming), so a run's conversion goes on and its training waits.
POD_HOLD_ENV = "TPU_RL_SANDBOX_POD_HOLD_FILE"
POD_HOLD_TPU_ONLY = "tpu"

__all__ = [
    "CriLog",
    "collect_garbage",
    "container_log_path",
    "create_jobset",
    "delete_jobset",
    "jobset_object",
    "jobset_status",
    "pod_objects",
    "read_log",
]


# =============================================================================== time helpers
def rfc3339_nano(moment_ns: int) -> str:
    """Go's ``time.RFC3339Nano`` for a UTC time in nanoseconds (trailing zeros trimmed)."""
    seconds, nanos = divmod(moment_ns, 1_000_000_000)
    base = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time (fractional seconds up to nanoseconds)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text.strip())
    if match is None:
        raise ValueError(f"parsing time {text!r} as RFC3339")
    base = dt.datetime.fromisoformat(match.group(1) + (match.group(3).replace("Z", "+00:00")))
    nanos = int((match.group(2) or "0").ljust(9, "0"))
    return int(base.timestamp()) * 1_000_000_000 + nanos


# ============================================================================ Status objects
def status_object(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``metav1.Status`` failure as the API server answers it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def not_found(resource: str, name: str, group: str = "") -> dict[str, Any]:
    qualified = f"{resource}.{group}" if group else resource
    details = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return status_object(404, "NotFound", f'{qualified} "{name}" not found', details)


class KubeError(Exception):
    """A request the API refuses: HTTP status and ``Status`` body."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(str(body.get("message")))
        self.body = body
        self.code = int(body["code"])


def bad_request(message: str) -> KubeError:
    return KubeError(status_object(400, "BadRequest", message))


# ============================================================================ label selectors
def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``), comma-separated (AND).

    k8s.io/apimachinery/pkg/labels/selector.go; a set-based requirement is refused as unparsable.
    """
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        if re.search(r"\s(in|notin)\s*\(", term):
            raise bad_request(f"unable to parse requirement: set-based selector {term!r} is not supported")
        if "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "==" in term or "=" in term:
            key, value = (part.strip() for part in re.split(r"==?", term, maxsplit=1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


# ================================================================================ rendering
def k8s_uid(hex_uid: str) -> str:
    """The record's hex uid in the dashed form Kubernetes uses."""
    return str(uuid.UUID(hex=hex_uid))


def _resource_version(value: Any) -> str:
    return str(
        int(hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:11], 16)
    )


def _condition(kind: str, status: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when,
    }


def jobset_status(job: Mapping[str, Any]) -> dict[str, Any]:
    """``JobSetStatus`` as the jobset controller writes it (pkg/controllers/jobset_controller.go)."""
    manifest = job.get("manifest") or {}
    conditions: list[dict[str, Any]] = []
    created = str(job.get("created") or rfc3339())
    if job.get("suspended", False):
        conditions.append(_condition("Suspended", "True", "SuspendedJobs", "jobset is suspended", created))
    elif job.get("admitted"):
        conditions.append(
            _condition("Suspended", "False", "ResumeJobs", "jobset is resumed", str(job["admitted"]))
        )
    terminal = ""
    if job.get("condition") == "Completed":
        terminal = "Completed"
        conditions.append(
            _condition(
                "Completed",
                "True",
                "AllJobsCompleted",
                "jobset completed successfully",
                str(job.get("completed")),
            )
        )
    elif job.get("condition") == "Failed":
        terminal = "Failed"
        conditions.append(
            _condition(
                "Failed",
                "True",
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts",
                str(job.get("completed")),
            )
        )
    pods = list(job.get("pods") or [])
    replicated: list[dict[str, Any]] = []
    for rjob in (manifest.get("spec") or {}).get("replicatedJobs") or []:
        name = str(rjob.get("name"))
        replicas = int(rjob.get("replicas", 1))
        counts: dict[str, int] = {"ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        for index in range(replicas):
            members = [p for p in pods if p["replicatedJob"] == name and int(p["jobIndex"]) == index]
            if job.get("suspended", False):
                counts["suspended"] += 1
            elif not members:
                continue
            elif any(p.get("phase") == "Failed" for p in members):
                counts["failed"] += 1
            elif all(p.get("phase") == "Succeeded" for p in members):
                counts["succeeded"] += 1
            else:
                counts["active"] += 1
                if all(p.get("phase") == "Running" for p in members):
                    counts["ready"] += 1
        replicated.append({"name": name, **counts})
    status: dict[str, Any] = {"restarts": max(0, int(job.get("attempt") or 0) - 1)}
    if conditions:
        status["conditions"] = conditions
    if terminal:
        status["terminalState"] = terminal
    if replicated:
        status["replicatedJobsStatus"] = replicated
    return status


def jobset_object(job: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet as ``GET .../jobsets/{name}`` returns it.

    ``resourceVersion`` changes with every write that changes the object (the controllers', a
    ``PATCH``'s: ``metadata_writes``) and not with a no-op patch (the API server skips the write
    when the patched object equals the stored one: apiserver ``pkg/storage/etcd3/store.go``
    ``GuaranteedUpdate``).
    """
    manifest = json.loads(json.dumps(job.get("manifest") or {}))
    metadata = dict(manifest.get("metadata") or {})
    metadata.update(
        {
            "name": job["name"],
            "namespace": job.get("namespace", DEFAULT_NAMESPACE),
            "uid": k8s_uid(str(job["uid"])),
            "generation": 2
            if job.get("admitted") and (metadata.get("labels") or {}).get(QUEUE_NAME_KEY)
            else 1,
            "creationTimestamp": job.get("created"),
        }
    )
    spec = dict(manifest.get("spec") or {})
    spec["suspend"] = bool(job.get("suspended", False))
    spec.setdefault("managedBy", "jobset.sigs.k8s.io/jobset-controller")
    body: dict[str, Any] = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": metadata,
        "spec": spec,
        "status": jobset_status(job),
    }
    metadata["resourceVersion"] = _resource_version(
        {
            "spec": spec,
            "status": body["status"],
            "labels": metadata.get("labels") or {},
            "annotations": metadata.get("annotations") or {},
            "writes": int(job.get("metadata_writes") or 0),
        }
    )
    return body


def _replicated_jobs(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(((job.get("manifest") or {}).get("spec") or {}).get("replicatedJobs") or [])


def _coordinator(job: Mapping[str, Any]) -> str | None:
    spec = (job.get("manifest") or {}).get("spec") or {}
    coordinator = spec.get("coordinator")
    if not coordinator:
        return None
    name = str(job["name"])
    rjob = coordinator.get("replicatedJob")
    # jobset_controller.go coordinatorEndpoint: <jobset>-<rjob>-<jobIndex>-<podIndex>.<subdomain>
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    return f"{name}-{rjob}-{coordinator.get('jobIndex', 0)}-{coordinator.get('podIndex', 0)}.{subdomain}"


def _random_suffix(rng: random.Random) -> str:
    return "".join(rng.choice(NAME_SUFFIX_ALPHABET) for _ in range(5))


def plan_pods(job: Mapping[str, Any], restart_attempt: int) -> list[dict[str, Any]]:
    """The pods the JobSet and Job controllers create for one restart attempt (all containers waiting).

    Child Job ``<jobset>-<rjob>-<jobIndex>`` (jobset_controller.go ``placeholderPodName``/
    ``GenJobName``), Indexed pods ``<job>-<index>-<5 random>`` (pkg/controller/job
    ``podGenerateNameWithIndex``).
    """
    rng = random.Random(f"{job['uid']}/{restart_attempt}")
    pods: list[dict[str, Any]] = []
    for rjob in _replicated_jobs(job):
        template = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        spec = template.get("spec") or {}
        parallelism = int(((rjob.get("template") or {}).get("spec") or {}).get("parallelism", 1))
        for job_index in range(int(rjob.get("replicas", 1))):
            for pod_index in range(parallelism):
                init = [
                    {
                        "name": c["name"],
                        "state": "waiting",
                        "reason": "PodInitializing",
                        "sidecar": c.get("restartPolicy") == "Always",
                    }
                    for c in spec.get("initContainers") or []
                ]
                waiting = "PodInitializing" if init else "ContainerCreating"
                pods.append(
                    {
                        "name": f"{job['name']}-{rjob['name']}-{job_index}-{pod_index}-{_random_suffix(rng)}",
                        "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                        "jobUid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                        "replicatedJob": rjob["name"],
                        "jobIndex": job_index,
                        "podIndex": pod_index,
                        "restartAttempt": restart_attempt,
                        "created": rfc3339(),
                        "phase": "Pending",
                        "node": f"gke-{str(job.get('cluster', 'cluster'))[:20]}-{rjob['name'][:8]}-{rng.getrandbits(32):08x}",
                        "init": init,
                        "containers": [
                            {"name": c["name"], "state": "waiting", "reason": waiting}
                            for c in spec.get("containers") or []
                        ],
                    }
                )
    return pods


def _container_status(container: Mapping[str, Any], spec: Mapping[str, Any], pod_uid: str) -> dict[str, Any]:
    state = container.get("state", "waiting")
    container_id = "containerd://" + hashlib.sha256(f"{pod_uid}/{container['name']}".encode()).hexdigest()
    body: dict[str, Any] = {
        "name": container["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "lastState": {},
        "ready": state == "running",
        "restartCount": 0,
        "started": state == "running",
    }
    if state == "running":
        body["state"] = {"running": {"startedAt": container.get("startedAt")}}
        body["containerID"] = container_id
    elif state == "terminated":
        body["state"] = {
            "terminated": {
                "exitCode": int(container.get("exitCode", 0)),
                "reason": container.get("reason")
                or ("Completed" if int(container.get("exitCode", 0)) == 0 else "Error"),
                "startedAt": container.get("startedAt"),
                "finishedAt": container.get("finishedAt"),
                "containerID": container_id,
            }
        }
        body["containerID"] = container_id
    else:
        body["state"] = {"waiting": {"reason": container.get("reason", "ContainerCreating")}}
    return body


def _pod_template(job: Mapping[str, Any], rjob_name: str) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """(pod template, replicated job, replicas, parallelism) of ``rjob_name``."""
    for rjob in _replicated_jobs(job):
        if rjob.get("name") == rjob_name:
            job_spec = (rjob.get("template") or {}).get("spec") or {}
            return (
                job_spec.get("template") or {},
                rjob,
                int(rjob.get("replicas", 1)),
                int(job_spec.get("parallelism", 1)),
            )
    return {}, {}, 1, 1


# kubernetes pkg/kubelet/nodeshutdown: what the kubelet writes on a pod its node's shutdown ended.
NODE_SHUTDOWN_REASON = "Terminated"
NODE_SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


def pod_object(job: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod as ``GET /api/v1/namespaces/{ns}/pods/{name}`` returns it."""
    template, rjob, replicas, _ = _pod_template(job, str(pod["replicatedJob"]))
    namespace = str(job.get("namespace", DEFAULT_NAMESPACE))
    jobset_name = str(job["name"])
    job_name = f"{jobset_name}-{pod['replicatedJob']}-{pod['jobIndex']}"
    global_replicas = sum(int(r.get("replicas", 1)) for r in _replicated_jobs(job))
    offset = 0
    for other in _replicated_jobs(job):
        if other.get("name") == pod["replicatedJob"]:
            break
        offset += int(other.get("replicas", 1))
    jobset_keys = {
        JOBSET_NAME_KEY: jobset_name,
        JOBSET_UID_KEY: k8s_uid(str(job["uid"])),
        REPLICATED_JOB_NAME_KEY: str(pod["replicatedJob"]),
        REPLICATED_JOB_REPLICAS_KEY: str(replicas),
        GLOBAL_REPLICAS_KEY: str(global_replicas),
        JOB_INDEX_KEY: str(pod["jobIndex"]),
        JOB_GLOBAL_INDEX_KEY: str(offset + int(pod["jobIndex"])),
        JOB_KEY: hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest(),  # noqa: S324 (jobset's own choice)
        RESTARTS_KEY: str(pod["restartAttempt"]),
    }
    coordinator = _coordinator(job)
    if coordinator:
        jobset_keys[COORDINATOR_KEY] = coordinator
    template_meta = template.get("metadata") or {}
    labels = {
        **dict(template_meta.get("labels") or {}),
        **jobset_keys,
        CONTROLLER_UID_KEY: str(pod["jobUid"]),
        JOB_NAME_KEY: job_name,
        "controller-uid": str(pod["jobUid"]),
        "job-name": job_name,
        JOB_COMPLETION_INDEX_KEY: str(pod["podIndex"]),
    }
    annotations = {
        **dict(((rjob.get("template") or {}).get("metadata") or {}).get("annotations") or {}),
        **dict(template_meta.get("annotations") or {}),
        **jobset_keys,
        JOB_COMPLETION_INDEX_KEY: str(pod["podIndex"]),
    }
    spec = json.loads(json.dumps(template.get("spec") or {}))
    spec["nodeName"] = pod["node"]
    spec.setdefault("restartPolicy", "Always")
    network = ((job.get("manifest") or {}).get("spec") or {}).get("network") or {}
    if network.get("enableDNSHostnames", True):
        spec["hostname"] = f"{job_name}-{pod['podIndex']}"
        spec["subdomain"] = network.get("subdomain") or jobset_name
    specs = {c["name"]: c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    status: dict[str, Any] = {"phase": pod.get("phase", "Pending"), "qosClass": "Burstable"}
    if pod.get("disrupted"):
        status.update(
            reason=NODE_SHUTDOWN_REASON,
            message=NODE_SHUTDOWN_MESSAGE,
            conditions=[
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": NODE_SHUTDOWN_MESSAGE,
                    "lastTransitionTime": pod["disrupted"],
                }
            ],
        )
    if pod.get("startTime"):
        status["startTime"] = pod["startTime"]
        status["hostIP"] = "10.128.0." + str(
            1 + int(hashlib.sha256(str(pod["node"]).encode()).hexdigest()[:2], 16) % 250
        )
        status["podIP"] = status["hostIP"]  # hostNetwork
    if pod.get("init"):
        status["initContainerStatuses"] = [
            _container_status(c, specs.get(c["name"], {}), str(pod["uid"])) for c in pod["init"]
        ]
    status["containerStatuses"] = [
        _container_status(c, specs.get(c["name"], {}), str(pod["uid"])) for c in pod.get("containers") or []
    ]
    metadata = {
        "name": pod["name"],
        "generateName": f"{job_name}-{pod['podIndex']}-",
        "namespace": namespace,
        "uid": pod["uid"],
        "creationTimestamp": pod["created"],
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job_name,
                "uid": pod["jobUid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    body = {"metadata": metadata, "spec": spec, "status": status}
    metadata["resourceVersion"] = _resource_version(status)
    return {"kind": "Pod", "apiVersion": "v1", **body}


def pod_objects(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JobSet's current pods (sorted by name, as etcd lists them)."""
    return sorted(
        (pod_object(job, pod) for pod in job.get("pods") or []), key=lambda p: str(p["metadata"]["name"])
    )


# ================================================================================ the store
def record_key(project: str, location: str, cluster: str, name: str, namespace: str) -> str:
    """The ``jobs`` document key (the namespace shows only when it is not ``default``)."""
    key = inventory.job_key(project, location, cluster, name)
    return key if namespace == DEFAULT_NAMESPACE else f"{key}@{namespace}"


WORKER_MODULE = "tpu_rl_sandbox.machines.job_worker"


def _is_job_worker(pid: int, job: Mapping[str, Any]) -> bool:
    """Whether ``pid`` is still this job's worker (its argv names the module and the job's uid), not
    a process that took the pid after the worker ended: pids are reused, and with two suites on one
    machine a finished job's record once signalled another suite's API server."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return WORKER_MODULE.encode() in argv and str(job.get("uid")).encode() in argv


def stop_worker(job: Mapping[str, Any]) -> None:
    """Stop the job worker (its pods' processes), if it is still the process its record names."""
    pid = job.get("pid")
    if not pid or not _is_job_worker(int(pid), job):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(int(pid)) == int(pid):
            os.killpg(int(pid), signal.SIGTERM)
        else:
            os.kill(int(pid), signal.SIGTERM)


WORKER_STOP_SECONDS = 10.0  # the pods' grace period here: SIGTERM, then SIGKILL after this


def _worker_alive(pid: int) -> bool:
    """The worker process runs (a zombie, ended but not reaped by its parent, does not)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reaped here when this process started it
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_worker_stopped(job: Mapping[str, Any], grace: float = WORKER_STOP_SECONDS) -> None:
    """Stop the job worker and wait until it has: its pods' processes are gone (SIGKILL after
    ``grace`` seconds, as the kubelet does after a pod's termination grace period)."""
    pid = int(job.get("pid") or 0)
    if not pid:
        return
    stop_worker(job)

    def alive() -> bool:
        return _worker_alive(pid) and _is_job_worker(pid, job)

    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        while alive() and time.monotonic() < deadline + grace:
            time.sleep(0.02)


def delete_jobset(store: StateStore, job: Mapping[str, Any]) -> bool:
    """Delete the JobSet, its Jobs and its pods; False if already gone.

    Its pods' processes are stopped first and the JobSet and pods leave the API only once they
    have ended: a pod is listed (terminating) until its containers are gone, as the Kubernetes API
    shows a deleted pod until its grace period is over, so "no pod left" means nothing of the
    job runs any more.
    """
    current = store.read("jobs").get(str(job["key"]))
    if current is None or current.get("uid") != job["uid"]:
        stop_worker(job)
        return False
    wait_worker_stopped(current)
    deleted = False
    with store.txn() as txn:
        jobs = txn.doc("jobs")
        if jobs.get(str(job["key"]), {}).get("uid") == job["uid"]:
            del jobs[str(job["key"])]
            txn.save("jobs")
            deleted = True
    return deleted


def collect_garbage(store: StateStore) -> None:
    """The TTL-after-finished controller: delete JobSets finished longer than their TTL ago."""
    now = time.time()
    with store.txn() as txn:
        jobs = txn.doc("jobs")
        expired = [
            key
            for key, job in jobs.items()
            if job.get("completed_ts") is not None
            and now >= float(job["completed_ts"]) + float(job.get("ttl_effective", 3600))
        ]
        for key in expired:
            del jobs[key]
        if expired:
            txn.save("jobs")


def start_worker(layout: SandboxLayout, job: dict[str, Any], env: Mapping[str, str]) -> int:
    """Start the detached process that plays the controllers and the pods of ``job``; its pid."""
    log_dir = layout.jobs_dir / str(job["uid"])
    log_dir.mkdir(parents=True, exist_ok=True)
    package_parent = str(Path(tpu_rl_sandbox.__file__).resolve().parents[1])
    child_env = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    child_env["PYTHONPATH"] = package_parent + (
        os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else ""
    )
    with (log_dir / "worker.log").open("ab") as worker_log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                WORKER_MODULE,
                str(layout.root),
                str(job["key"]),
                str(job["uid"]),
            ],
            stdin=subprocess.DEVNULL,
            stdout=worker_log,
            stderr=worker_log,
            start_new_session=True,
            close_fds=True,
            env=child_env,
            cwd=str(layout.root),
        )
    with StateStore(layout).txn() as txn:
        stored = txn.doc("jobs").get(str(job["key"]))
        if stored is not None and stored["uid"] == job["uid"]:
            stored["pid"] = process.pid
            txn.save("jobs")
    job["pid"] = process.pid
    return process.pid


def _workload_container(manifest: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(replicated job name, container) that runs the program: the head's or the main job's."""
    for rjob in (manifest.get("spec") or {}).get("replicatedJobs") or []:
        spec = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
        for container in spec.get("containers") or []:
            if (container.get("command") or container.get("args")) and rjob.get("name") != "worker":
                return str(rjob.get("name")), container
    return "", {}


def create_jobset(
    layout: SandboxLayout,
    cluster: Mapping[str, Any],
    namespace: str,
    body: Any,
    sandbox_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Create a JobSet (``POST``); the stored record. Raises :class:`KubeError` as the API refuses.

    Kueue's webhook suspends a JobSet labelled ``kueue.x-k8s.io/queue-name`` until admission.
    ``sandbox_fields`` are the fake's own knobs (``gcluster job submit`` passes its record fields);
    a JobSet created through the API gets them from its workload container.
    """
    if not isinstance(body, dict):
        raise bad_request("the object provided is unrecognized (must be of type JobSet)")
    if body.get("apiVersion") != JOBSET_API_VERSION or body.get("kind") != "JobSet":
        raise bad_request(
            f"the API version in the data ({body.get('apiVersion')}) does not match the expected API version "
            f"({JOBSET_API_VERSION})"
        )
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name") or "")
    if metadata.get("namespace") not in (None, "", namespace):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    if not name:
        raise KubeError(
            status_object(
                422,
                "Invalid",
                'JobSet.jobset.x-k8s.io "" is invalid: metadata.name: Required value: name or generateName is required',
                {
                    "kind": "JobSet",
                    "group": JOBSET_GROUP,
                    "causes": [
                        {
                            "reason": "FieldValueRequired",
                            "message": "Required value: name or generateName is required",
                            "field": "metadata.name",
                        }
                    ],
                },
            )
        )
    if not DNS_1035_RE.match(name) or len(name) > 63:
        message = (
            f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '
            "'-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
            "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
        )
        raise KubeError(
            status_object(
                422,
                "Invalid",
                f'JobSet.jobset.x-k8s.io "{name}" is invalid: metadata.name: {message}',
                {
                    "name": name,
                    "group": JOBSET_GROUP,
                    "kind": "JobSet",
                    "causes": [{"reason": "FieldValueInvalid", "message": message, "field": "metadata.name"}],
                },
            )
        )
    if not (body.get("spec") or {}).get("replicatedJobs"):
        raise KubeError(
            status_object(
                422,
                "Invalid",
                f'JobSet.jobset.x-k8s.io "{name}" is invalid: spec.replicatedJobs: Required value',
                {"name": name, "group": JOBSET_GROUP, "kind": "JobSet"},
            )
        )
    project, location, cluster_name = str(cluster["project"]), str(cluster["region"]), str(cluster["name"])
    key = record_key(project, location, cluster_name, name, namespace)
    manifest: dict[str, Any] = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {k: v for k, v in metadata.items() if k in ("name", "labels", "annotations")},
        "spec": {k: v for k, v in (body.get("spec") or {}).items() if k != "suspend"},
    }
    labels = manifest["metadata"].get("labels") or {}
    # created suspended with no queue label: Kueue ignores it (it manages labelled jobs only: the
    # default label policy, Red Hat's Kueue docs "Configuring label policies for jobs", direct), so
    # nothing resumes it here (a PATCH takes labels and annotations only)
    held_by_user = bool((body.get("spec") or {}).get("suspend")) and not labels.get(QUEUE_NAME_KEY)
    suspended = held_by_user or bool(labels.get(QUEUE_NAME_KEY))
    spec = manifest["spec"]
    rjobs = spec["replicatedJobs"]
    head_name, container = _workload_container(manifest)
    command = list(container.get("command") or []) + list(container.get("args") or [])
    if command[:2] == ["/bin/bash", "-c"] and len(command) == 3:
        shell_command = command[2]
    else:
        shell_command = shlex.join(command)
    workers = next((r for r in rjobs if r.get("name") == "worker"), None)
    main: dict[str, Any] = next((r for r in rjobs if r.get("name") == head_name), {})
    slices_from = workers if workers is not None else main
    selectors = json.dumps(rjobs)
    now = time.time()
    record: dict[str, Any] = {
        "key": key,
        "uid": uuid.uuid4().hex,
        "name": name,
        "namespace": namespace,
        "project": project,
        "location": location,
        "cluster": cluster_name,
        "cluster_key": inventory.cluster_key(project, location, cluster_name),
        "status": "Suspended",
        "suspended": suspended,
        "held_by_user": held_by_user,
        "condition": None,
        "created": rfc3339(),
        "created_ts": now,
        "completed": None,
        "completed_ts": None,
        "ttl_seconds": int(spec.get("ttlSecondsAfterFinished", 3600) or 0),
        "ttl_effective": float(spec.get("ttlSecondsAfterFinished", 3600) or 0),
        "restarts": int((spec.get("failurePolicy") or {}).get("maxRestarts", 0)),
        "attempt": 0,
        "command": shell_command,
        "env": {str(e["name"]): str(e["value"]) for e in container.get("env") or [] if "value" in e},
        "pathways_env": {"proxy": {}, "server": {}, "worker": {}},
        "image": container.get("image"),
        "tpu": "gke-tpu-accelerator" in selectors,
        "num_slices": int((slices_from or {}).get("replicas", 1)),
        "pathways": any(r.get("name") == "pathways-head" for r in rjobs),
        "workload_name": f"jobset-{name}-{uuid.uuid4().hex[:5]}",
        "faults": "",
        "step_seconds": "",
        "hold_file": "",
        "pid": None,
    }
    record.update(dict(sandbox_fields or {}))
    record.update(
        {"key": key, "name": name, "namespace": namespace, "manifest": manifest, "suspended": suspended}
    )
    # the container whose command is the program (its pod: job index 0, pod index 0)
    record["workload"] = {"replicatedJob": head_name, "container": str(container.get("name", ""))}
    with StateStore(layout).txn() as txn:
        jobs = txn.doc("jobs")
        if key in jobs:
            raise KubeError(
                status_object(
                    409,
                    "AlreadyExists",
                    f'jobsets.{JOBSET_GROUP} "{name}" already exists',
                    {"name": name, "group": JOBSET_GROUP, "kind": "jobsets"},
                )
            )
        jobs[key] = record
        txn.save("jobs")
    return record


# ==================================================================================== patch
# apiextensions-apiserver pkg/apiserver/customresource_handler.go serveResource, verb "patch": a
# custom resource takes JSON patch, JSON merge patch and server-side apply, never the strategic
# merge patch (no Go struct to read patch strategies from). The sandbox serves no server-side
# apply; it answers it as an unsupported type, naming the types it does take.
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json")
# k8s.io/apimachinery pkg/api/validation/objectmeta.go TotalAnnotationSizeLimitB
ANNOTATIONS_SIZE_LIMIT = 256 * 1024
# k8s.io/apimachinery pkg/util/validation/validation.go IsQualifiedName / IsValidLabelValue
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def unsupported_media_type() -> KubeError:
    """apiserver ``pkg/endpoints/handlers/negotiation`` ``NewUnsupportedMediaTypeError`` (415)."""
    return KubeError(
        status_object(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(PATCH_TYPES),
        )
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` removes a key; a non-object replaces the target)."""
    if not isinstance(patch, dict):
        return json.loads(json.dumps(patch))
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer must be empty or start with a /: {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch: ``add``, ``remove``, ``replace`` and ``test`` (evanphx/json-patch)."""
    if not isinstance(operations, list):
        raise ValueError("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = json.loads(json.dumps(target))
    for op in operations:
        if not isinstance(op, dict) or op.get("op") not in ("add", "remove", "replace", "test"):
            raise ValueError(f"Unexpected kind: {op.get('op') if isinstance(op, dict) else op}")
        parts = _pointer(str(op.get("path", "")))
        if not parts:
            raise ValueError("the whole document cannot be patched here")
        parent = doc
        for part in parts[:-1]:
            if isinstance(parent, dict) and part in parent:
                parent = parent[part]
            elif isinstance(parent, list) and part.isdigit() and int(part) < len(parent):
                parent = parent[int(part)]
            else:
                raise ValueError(f"doc is missing path: {op['path']}")
        last = parts[-1]
        if not isinstance(parent, dict):
            raise ValueError(f"unable to patch {op['path']}: only object members are supported")
        if op["op"] == "add":
            parent[last] = op.get("value")
        elif last not in parent:
            raise ValueError(f"{op['op']} operation does not apply: doc is missing path: {op['path']}")
        elif op["op"] == "remove":
            del parent[last]
        elif op["op"] == "replace":
            parent[last] = op.get("value")
        elif parent[last] != op.get("value"):
            raise ValueError(f"testing value {op['path']} failed: test failed")
    return doc


def _metadata_errors(field: str, values: Any, labels: bool) -> list[tuple[str, str]]:
    """(field, message) of each invalid label or annotation (ValidateLabels/ValidateAnnotations)."""
    if values is None:
        return []
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        return [(field, "Invalid value: must be a map of strings")]
    errors: list[tuple[str, str]] = []
    for key, value in values.items():
        prefix, _, name = key.rpartition("/")
        if (
            not name
            or len(name) > 63
            or not _QUALIFIED_NAME_RE.match(name)
            or (prefix and (len(prefix) > 253 or not _DNS_1123_SUBDOMAIN_RE.match(prefix)))
            or ("/" in key and not prefix)
        ):
            errors.append(
                (
                    field,
                    f"Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or "
                    "'.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
                    "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an "
                    "optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                )
            )
        if labels and value and (len(value) > 63 or not _QUALIFIED_NAME_RE.match(value)):
            errors.append(
                (
                    field,
                    f'Invalid value: "{value}": a valid label must be an empty string or consist of alphanumeric '
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
    if not labels and sum(len(k) + len(v) for k, v in values.items()) > ANNOTATIONS_SIZE_LIMIT:
        errors.append((field, f"Too long: must have at most {ANNOTATIONS_SIZE_LIMIT} bytes"))
    return errors


def patch_jobset(store: StateStore, job: Mapping[str, Any], content_type: str, raw: bytes) -> dict[str, Any]:
    """``PATCH .../jobsets/{name}``: the patched JobSet. Raises :class:`KubeError` as the API does.

    apiserver ``pkg/endpoints/handlers/patch.go`` ``PatchResource``: the content type decides the
    patch kind (415 for another), the patch applies to the stored object, a ``resourceVersion`` in
    the patched object is a precondition (409 ``Conflict`` when stale), ``status`` changes are
    dropped (the status subresource: customresource_handler.go strategy ``PrepareForUpdate``), an
    unchanged object is not written. The sandbox's JobSets take changes of ``metadata.labels`` and
    ``metadata.annotations`` only (the jobset webhook keeps most of ``spec`` immutable).
    """
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind not in PATCH_TYPES:
        raise unsupported_media_type()
    try:
        patch = json.loads(raw or b"null")
    except ValueError as error:
        raise bad_request(f"error decoding patch: {error}") from None
    current = jobset_object(job)
    try:
        if kind == "application/merge-patch+json":
            if not isinstance(patch, dict):
                raise ValueError("json: cannot unmarshal into Go value of type map[string]interface {}")
            patched = merge_patch(current, patch)
        else:
            patched = json_patch(current, patch)
    except ValueError as error:
        raise KubeError(
            status_object(
                422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
            )
        ) from None
    name = str(job["name"])
    metadata = patched.get("metadata") if isinstance(patched.get("metadata"), dict) else {}
    wanted_version = metadata.get("resourceVersion")
    if wanted_version not in (None, "") and str(wanted_version) != current["metadata"]["resourceVersion"]:
        raise KubeError(
            status_object(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on jobsets.{JOBSET_GROUP} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "group": JOBSET_GROUP, "kind": "jobsets"},
            )
        )
    causes = _metadata_errors("metadata.labels", metadata.get("labels"), labels=True)
    causes += _metadata_errors("metadata.annotations", metadata.get("annotations"), labels=False)

    def rest(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = {
            k: v
            for k, v in (obj.get("metadata") or {}).items()
            if k not in ("labels", "annotations", "resourceVersion")
        }
        return {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}

    if rest(patched) != rest(current):
        causes.append(
            (
                "",
                "Forbidden: the sandbox's JobSets take changes of metadata.labels and metadata.annotations only",
            )
        )
    if causes:
        text = ", ".join(f"{field}: {message}" if field else message for field, message in causes)
        raise KubeError(
            status_object(
                422,
                "Invalid",
                f'JobSet.{JOBSET_GROUP} "{name}" is invalid: {text}',
                {
                    "name": name,
                    "group": JOBSET_GROUP,
                    "kind": "JobSet",
                    "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
                },
            )
        )
    labels = dict(metadata.get("labels") or {})
    annotations = dict(metadata.get("annotations") or {})
    before = current["metadata"]
    if labels == (before.get("labels") or {}) and annotations == (before.get("annotations") or {}):
        return current  # nothing changed: no write, the same resourceVersion
    with store.txn() as txn:
        jobs = txn.doc("jobs")
        stored = jobs.get(str(job["key"]))
        if stored is None or stored.get("uid") != job["uid"]:
            raise KubeError(not_found("jobsets", name, JOBSET_GROUP))
        manifest_meta = stored.setdefault("manifest", {}).setdefault("metadata", {})
        for field, value in (("labels", labels), ("annotations", annotations)):
            if value:
                manifest_meta[field] = value
            else:
                manifest_meta.pop(field, None)
        stored["metadata_writes"] = int(stored.get("metadata_writes") or 0) + 1
        txn.save("jobs")
        return jobset_object(stored)


# ===================================================================================== logs
def container_log_path(layout: SandboxLayout, job_uid: str, pod_name: str, container: str) -> Path:
    """Where the kubelet keeps a container's CRI log inside the sandbox."""
    return layout.jobs_dir / job_uid / "pods" / pod_name / f"{container}.log"


class CriLog:
    """Writes a container's output in the CRI log format, one timestamp per line.

    ``<RFC3339Nano> <stream> F <line>`` (containerd's cri log format, kubelet
    pkg/kubelet/kuberuntime/logs/logs.go ``parseCRILog``); the timestamp is when the line was
    read from the container. ``raw`` also gets the plain text (what ``attempt-N.log`` held).
    """

    def __init__(self, path: Path, raw: Path | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("ab", buffering=0)
        self._raw = raw.open("ab", buffering=0) if raw is not None else None
        self._pending = ""
        self._lock = threading.Lock()

    def line(self, text: str, stream: str = "stdout") -> None:
        """Write one complete line (no newline in ``text``)."""
        stamp = rfc3339_nano(time.time_ns())
        self._handle.write(f"{stamp} {stream} F {text}\n".encode())

    def write(self, text: str) -> None:
        """Output chunk of the program (any size; whole lines are stamped as they complete)."""
        with self._lock:
            if self._raw is not None:
                self._raw.write(text.encode())
            data = self._pending + text
            *lines, self._pending = data.split("\n")
            for line in lines:
                self.line(line)

    def close(self) -> None:
        with self._lock:
            if self._pending:
                self.line(self._pending)
                self._pending = ""
            self._handle.close()
            if self._raw is not None:
                self._raw.close()


def _parse_cri(line: bytes) -> tuple[int, str, bytes] | None:
    try:
        stamp, _stream, tag, content = line.rstrip(b"\n").split(b" ", 3)
    except ValueError:
        return None
    try:
        return parse_rfc3339_ns(stamp.decode()), tag.decode(), content
    except ValueError:
        return None


class LogOptions:
    """``PodLogOptions`` from the query (pkg/apis/core/validation ``ValidatePodLogOptions``)."""

    def __init__(self, pod_name: str, query: Mapping[str, list[str]]) -> None:
        def one(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None

        def boolean(name: str) -> bool:
            value = one(name)
            if value is None:
                return False
            if value.lower() in ("true", "1", "t"):
                return True
            if value.lower() in ("false", "0", "f", ""):
                return False
            raise bad_request(f'strconv.ParseBool: parsing "{value}": invalid syntax')

        def integer(name: str) -> int | None:
            value = one(name)
            if value is None:
                return None
            try:
                return int(value)
            except ValueError:
                raise bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax') from None

        self.container = one("container") or ""
        self.follow = boolean("follow")
        self.timestamps = boolean("timestamps")
        self.previous = boolean("previous")
        self.tail_lines = integer("tailLines")
        self.limit_bytes = integer("limitBytes")
        self.since_seconds = integer("sinceSeconds")
        since_time = one("sinceTime")
        self.since_ns: int | None = None
        if since_time is not None:
            try:
                parsed = parse_rfc3339_ns(since_time)
            except ValueError:
                raise bad_request(
                    f'parsing time "{since_time}" as "2006-01-02T15:04:05Z07:00": cannot parse as RFC3339'
                ) from None
            # The API server passes sinceTime to the kubelet as time.RFC3339: whole seconds
            # (pkg/registry/core/pod/strategy.go LogLocation).
            self.since_ns = parsed - parsed % 1_000_000_000
        causes = []
        if self.tail_lines is not None and self.tail_lines < 0:
            causes.append(
                (
                    "tailLines",
                    "FieldValueInvalid",
                    f"Invalid value: {self.tail_lines}: must be greater than or equal to 0",
                )
            )
        if self.limit_bytes is not None and self.limit_bytes < 1:
            causes.append(
                (
                    "limitBytes",
                    "FieldValueInvalid",
                    f"Invalid value: {self.limit_bytes}: must be greater than 0",
                )
            )
        if self.since_seconds is not None and since_time is not None:
            causes.append(
                (
                    "",
                    "FieldValueForbidden",
                    "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified",
                )
            )
        elif self.since_seconds is not None and self.since_seconds < 1:
            causes.append(
                (
                    "sinceSeconds",
                    "FieldValueInvalid",
                    f"Invalid value: {self.since_seconds}: must be greater than 0",
                )
            )
        if causes:
            text = ", ".join(f"{field}: {message}" for field, _, message in causes)
            if len(causes) > 1:
                text = f"[{text}]"
            raise KubeError(
                status_object(
                    422,
                    "Invalid",
                    f'PodLogOptions "{pod_name}" is invalid: {text}',
                    {
                        "name": pod_name,
                        "kind": "PodLogOptions",
                        "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes],
                    },
                )
            )
        if self.since_seconds is not None:
            self.since_ns = time.time_ns() - self.since_seconds * 1_000_000_000


def _tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of the file start."""
    data = path.read_bytes() if path.is_file() else b""
    if lines == 0:
        return len(data)
    ends = [i for i, b in enumerate(data) if b == 0x0A]
    if len(ends) <= lines:
        return 0
    return ends[-lines - 1] + 1


def read_log(
    path: Path,
    options: LogOptions,
    running: Callable[[], bool],
    emit: Callable[[bytes], None],
    poll: float = 0.05,
) -> None:
    """Stream a CRI log as the kubelet does: tail, then since, optional timestamps, follow while running."""
    offset = _tail_offset(path, options.tail_lines) if options.tail_lines is not None else 0
    remaining = options.limit_bytes
    buffer = b""
    while True:
        chunk = b""
        if path.is_file():
            with path.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
        if chunk:
            offset += len(chunk)
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            out = []
            for raw in complete:
                parsed = _parse_cri(raw)
                if parsed is None:
                    continue
                stamp, tag, content = parsed
                if options.since_ns is not None and stamp < options.since_ns:
                    continue
                text = content + (b"\n" if tag == "F" else b"")
                if options.timestamps:
                    text = rfc3339_nano(stamp).encode() + b" " + text
                out.append(text)
            data = b"".join(out)
            if remaining is not None:
                data = data[:remaining]
                remaining -= len(data)
            if data:
                emit(data)
            if remaining is not None and remaining <= 0:
                return
            continue
        if not options.follow or not running():
            # one last read: lines written just before the container stopped
            if options.follow and path.is_file() and path.stat().st_size > offset:
                continue
            return
        time.sleep(poll)


# ====================================================================== standalone pods and events
# Pods created on their own (``POST /api/v1/namespaces/{ns}/pods``: the provider's placeholder pod
# of a flex-start TPU pool), their scheduling and the cluster autoscaler's answer for them, decided
# when they are created; and the events that say it (``GET .../events``). Kept in the ``pods``
# document, keyed ``<cluster key>/<namespace>/<name>``.
TPU_RESOURCE = "google.com/tpu"
# kubernetes pkg/apis/core/validation ValidatePodCreate: a pod needs at least one container, each
# with a DNS-1123 label name and an image (the messages' field paths as the API server words them).
_DNS_1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The field selectors the API server accepts for events (k8s pkg/registry/core/event/strategy.go
# ``ToSelectableFields``: involvedObject.*, reason, source, type); others: "field label not supported".
EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.name",
    "metadata.namespace",
)


def _invalid_pod(name: str, causes: list[tuple[str, str]]) -> KubeError:
    message = f'Pod "{name}" is invalid: ' + ", ".join(f"{field}: {why}" for field, why in causes)
    details = {
        "name": name,
        "kind": "Pod",
        "causes": [{"reason": "FieldValueRequired", "message": why, "field": field} for field, why in causes],
    }
    return KubeError(status_object(422, "Invalid", message, details))


def _event(
    pod: Mapping[str, Any], reason: str, message: str, component: str, when: str, kind: str = "Warning"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{pod['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": pod["namespace"],
            "creationTimestamp": when,
        },
        "involvedObject": {
            "kind": "Pod",
            "namespace": pod["namespace"],
            "name": pod["name"],
            "uid": k8s_uid(str(pod["uid"])),
            "apiVersion": "v1",
        },
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "firstTimestamp": when,
        "lastTimestamp": when,
        "count": 1,
        "type": kind,
        "reportingComponent": component,
    }


def _tpu_pools_for(cluster: Mapping[str, Any], selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The cluster's TPU node pools a pod's nodeSelector can land on: GKE's TPU accelerator label
    asked for and, where it names one, the pool's topology (as ``gke_nodes.running_pod_graces``)."""
    from tpu_rl_sandbox.world import gke_nodes

    topology = selector.get(gke_nodes.TPU_TOPOLOGY_SELECTOR)
    return [
        pool
        for pool in cluster.get("node_pools") or []
        if gke_nodes.is_tpu_pool(pool)
        and gke_nodes.TPU_ACCELERATOR_SELECTOR in selector
        and (not topology or str(topology) == str(pool.get("topology")))
    ]


def create_pod(
    store: StateStore,
    cluster_key: str,
    cluster: Mapping[str, Any],
    namespace: str,
    body: Any,
    settings: Any = None,
) -> dict[str, Any]:
    """Create a standalone pod and decide at once what the scheduler and the cluster autoscaler do
    with it: placed on a node of a TPU pool that has nodes; else Pending, with the scheduler's
    ``FailedScheduling`` and, for a pool whose scale-up fails (a flex-start pool in a zone without
    flex-start capacity: the pool's ``scale_up_failure``), the autoscaler's ``FailedScaleUp``. A pod
    selecting a ComputeClass (``cloud.google.com/compute-class``) lands on a node of a pool of the
    class, or GKE auto-creates one for the first priority the zone can give
    (world/compute_classes.py ``scale_up``; ``settings``: the sandbox's)."""
    from tpu_rl_sandbox.world import compute_classes, gke_nodes
    from tpu_rl_sandbox.world.gke_nodes import pool_node_labels

    if not isinstance(body, dict) or body.get("kind") not in (None, "Pod"):
        raise bad_request("the body must be a Pod")
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name") or "")
    spec = body.get("spec") or {}
    containers = spec.get("containers") or []
    causes: list[tuple[str, str]] = []
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif not _DNS_1123_SUBDOMAIN_RE.match(name) or len(name) > 253:
        causes.append(
            (
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters',
            )
        )
    if not containers:
        causes.append(("spec.containers", "Required value"))
    for index, container in enumerate(containers):
        if not _DNS_1123_LABEL_RE.match(str(container.get("name") or "")):
            causes.append((f"spec.containers[{index}].name", "Required value"))
        if not container.get("image"):
            causes.append((f"spec.containers[{index}].image", "Required value"))
    if causes:
        raise _invalid_pod(name, causes)
    key = f"{cluster_key}/{namespace}/{name}"
    when = rfc3339()
    with store.txn() as txn:
        pods = txn.doc(PODS_DOC)
        if key in pods:
            raise KubeError(
                status_object(
                    409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"}
                )
            )
        record: dict[str, Any] = {
            "cluster_key": cluster_key,
            "namespace": namespace,
            "name": name,
            "uid": uuid.uuid4().hex,
            "created": when,
            "manifest": body,
            "node": None,
            "events": [],
        }
        selector = spec.get("nodeSelector") or {}
        asks_tpu = any(TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {}) for c in containers)
        pools = _tpu_pools_for(cluster, selector) if asks_tpu or selector else []
        class_name = selector.get(compute_classes.CLASS_LABEL)
        if class_name:
            current = txn.doc("clusters").get(cluster_key) or dict(cluster)
            pools = [
                p
                for p in current.get("node_pools") or []
                if all(pool_node_labels(p).get(k) == v for k, v in selector.items())
            ]
            klass = txn.doc(compute_classes.DOC).get(f"{cluster_key}/{class_name}")
            has = any(gke_nodes._nodes(txn, current, p) for p in pools)
            if not has and klass is not None and settings is not None:
                made, said = compute_classes.scale_up(txn, cluster_key, current, klass, settings, time.time())
                for reason, message in said:
                    kind = "Normal" if reason == "TriggeredScaleUp" else "Warning"
                    record["events"].append(_event(record, reason, message, "cluster-autoscaler", when, kind))
                pools = [made] if made is not None else []
            cluster = current
        with_nodes = [
            node
            for pool in pools
            for _, node in sorted(gke_nodes._nodes(txn, dict(cluster), pool), key=lambda item: item[0])
        ]
        if with_nodes:
            record["node"] = str(with_nodes[0]["name"])
        else:
            # the nodes the scheduler looked at: the cluster's other pools' (system, CPU)
            total = sum(
                int(p.get("nodes") or 1) for p in cluster.get("node_pools") or [] if not p.get("topology")
            )
            # kube-scheduler's unschedulable message (pkg/scheduler/framework: "0/N nodes are
            # available: ..." with the nodeaffinity plugin's "node(s) didn't match Pod's node
            # affinity/selector"; indirect, as pods' events show it)
            record["events"].append(
                _event(
                    record,
                    "FailedScheduling",
                    f"0/{total} nodes are available: {total} node(s) didn't match Pod's node affinity/selector.",
                    "default-scheduler",
                    when,
                )
            )
            failure = next((p["scale_up_failure"] for p in pools if p.get("scale_up_failure")), None)
            if failure is not None:
                zone = gke_nodes.pool_zone(dict(cluster), pools[0])
                # GKE's cluster autoscaler (k8s.io/gke-autoscaling cluster-autoscaler, package
                # events: reason FailedScaleUp, zonalErrorMessageTemplate; direct)
                record["events"].append(
                    _event(
                        record,
                        "FailedScaleUp",
                        f"Node scale up in zones {zone} associated with this pod failed: {failure}. "
                        "Pod is at risk of not being scheduled.",
                        "cluster-autoscaler",
                        when,
                    )
                )
        pods[key] = record
        txn.save(PODS_DOC)
    return standalone_pod_object(record)


def standalone_pods(store: StateStore, cluster_key: str, namespace: str | None) -> list[dict[str, Any]]:
    return [
        record
        for record in store.read(PODS_DOC).values()
        if record.get("cluster_key") == cluster_key
        and (namespace is None or record.get("namespace") == namespace)
    ]


def standalone_pod_object(record: Mapping[str, Any]) -> dict[str, Any]:
    """A standalone pod as ``GET .../pods/{name}`` returns it: Running on its node, or Pending
    with ``PodScheduled`` False (reason ``Unschedulable``)."""
    manifest = dict(record.get("manifest") or {})
    metadata = dict(manifest.get("metadata") or {})
    metadata.update(
        {
            "name": record["name"],
            "namespace": record["namespace"],
            "uid": k8s_uid(str(record["uid"])),
            "creationTimestamp": record["created"],
            "resourceVersion": _resource_version(record),
        }
    )
    spec = dict(manifest.get("spec") or {})
    if record.get("node"):
        spec["nodeName"] = record["node"]
        status = {
            "phase": "Running",
            "conditions": [_condition("PodScheduled", "True", "", "", str(record["created"]))],
            "startTime": record["created"],
        }
    else:
        events = record.get("events") or []
        status = {
            "phase": "Pending",
            "conditions": [
                _condition(
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    str(events[0]["message"]) if events else "",
                    str(record["created"]),
                )
            ],
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def delete_pod(store: StateStore, cluster_key: str, namespace: str, name: str) -> dict[str, Any] | None:
    """Delete a standalone pod (its events stay, as the API server keeps them for their TTL);
    the pod as it was, or None when there is none."""
    with store.txn() as txn:
        pods = txn.doc(PODS_DOC)
        record = pods.pop(f"{cluster_key}/{namespace}/{name}", None)
        if record is not None:
            txn.doc("pod_events").setdefault(cluster_key, []).extend(record.get("events") or [])
            txn.save(PODS_DOC)
            txn.save("pod_events")
    return None if record is None else standalone_pod_object(record)


def list_events(
    store: StateStore, cluster_key: str, namespace: str | None, field_selector: str
) -> list[dict[str, Any]]:
    """The events of the cluster's standalone pods (those of deleted pods too) matching
    ``field_selector`` (equality terms, comma-separated, on :data:`EVENT_FIELDS`)."""
    terms: list[tuple[str, str, bool]] = []
    for raw in field_selector.split(","):
        term = raw.strip()
        if not term:
            continue
        negate = "!=" in term
        field, _, value = term.partition("!=" if negate else "=")
        field, value = field.strip(), value.strip().lstrip("=")
        if field not in EVENT_FIELDS:
            raise bad_request(f"field label not supported: {field}")
        terms.append((field, value, negate))
    events = [e for r in standalone_pods(store, cluster_key, namespace) for e in r.get("events") or []]
    events += [
        e
        for e in store.read("pod_events").get(cluster_key) or []
        if namespace is None or e["metadata"]["namespace"] == namespace
    ]

    def field_value(event: Mapping[str, Any], field: str) -> str:
        value: Any = event
        for part in field.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if field == "source":
            value = (event.get("source") or {}).get("component")
        return "" if value is None else str(value)

    return [e for e in events if all((field_value(e, f) == v) != neg for f, v, neg in terms)]


def node_object(store: StateStore, cluster: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """``GET /api/v1/nodes/{name}``: a TPU node pool's node (its node VM) with the labels GKE puts
    on it: the pool's own (``--node-labels``, an auto-created pool's class and kind labels),
    ``cloud.google.com/gke-nodepool``, the TPU accelerator and topology; None when no such node."""
    from tpu_rl_sandbox.world import gke_nodes
    from tpu_rl_sandbox.world.gke_nodes import pool_node_labels

    record = next(
        (
            r
            for r in store.read("vms").values()
            if r.get("name") == name
            and (r.get("labels") or {}).get(gke_nodes.CLUSTER_LABEL) == cluster.get("name")
        ),
        None,
    )
    if record is None:
        return None
    pool_name = (record.get("labels") or {}).get(gke_nodes.POOL_LABEL)
    pool = next((p for p in cluster.get("node_pools") or [] if p.get("name") == pool_name), None)
    if pool is None:
        return None
    labels = {**pool_node_labels(pool), "kubernetes.io/hostname": name}
    if pool.get("topology"):
        labels[gke_nodes.TPU_ACCELERATOR_SELECTOR] = "tpu-v6e-slice"
        labels[gke_nodes.TPU_TOPOLOGY_SELECTOR] = str(pool["topology"])
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels, "creationTimestamp": record.get("created")},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def create_compute_class(store: StateStore, cluster_key: str, body: Any) -> dict[str, Any]:
    """``POST /apis/cloud.google.com/v1/computeclasses``: the object stored, or the API's 422
    (the CRD schema, world/compute_classes.py ``problems``) or 409 (the name taken)."""
    from tpu_rl_sandbox.world import compute_classes

    causes = compute_classes.problems(body)
    name = str(((body if isinstance(body, dict) else {}).get("metadata") or {}).get("name") or "")
    if causes:
        message = f'ComputeClass.cloud.google.com "{name}" is invalid: ' + ", ".join(
            f"{f}: {w}" for f, w in causes
        )
        details = {
            "name": name,
            "group": compute_classes.GROUP,
            "kind": "ComputeClass",
            "causes": [{"reason": "FieldValueInvalid", "message": w, "field": f} for f, w in causes],
        }
        raise KubeError(status_object(422, "Invalid", message, details))
    with store.txn() as txn:
        classes = txn.doc(compute_classes.DOC)
        key = f"{cluster_key}/{name}"
        if key in classes:
            raise KubeError(
                status_object(
                    409,
                    "AlreadyExists",
                    f'{compute_classes.PLURAL}.{compute_classes.GROUP} "{name}" already exists',
                    {"name": name, "group": compute_classes.GROUP, "kind": compute_classes.PLURAL},
                )
            )
        obj = compute_classes.stored(body, time.time())
        classes[key] = obj
        txn.save(compute_classes.DOC)
    return obj


def get_compute_class(store: StateStore, cluster_key: str, name: str) -> dict[str, Any]:
    from tpu_rl_sandbox.world import compute_classes

    found = store.read(compute_classes.DOC).get(f"{cluster_key}/{name}")
    if found is None:
        raise KubeError(not_found(compute_classes.PLURAL, name, compute_classes.GROUP))
    return dict(found)


def list_compute_classes(store: StateStore, cluster_key: str) -> list[dict[str, Any]]:
    from tpu_rl_sandbox.world import compute_classes

    return [
        dict(v) for k, v in sorted(store.read(compute_classes.DOC).items()) if k.startswith(f"{cluster_key}/")
    ]


def delete_compute_class(store: StateStore, cluster_key: str, name: str) -> dict[str, Any]:
    """Delete a ComputeClass: the API's ``Status`` Success; 404 when there is none. The node pools
    GKE auto-created for it stay until the autoscaler removes them (world/compute_classes.py)."""
    from tpu_rl_sandbox.world import compute_classes

    with store.txn() as txn:
        classes = txn.doc(compute_classes.DOC)
        found = classes.pop(f"{cluster_key}/{name}", None)
        if found is None:
            raise KubeError(not_found(compute_classes.PLURAL, name, compute_classes.GROUP))
        txn.save(compute_classes.DOC)
    # a custom resource deleted at once answers a Status of success with its details (the API
    # server's generic registry: ReturnDeletedObject is false for CustomResourceDefinitions)
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": name,
            "group": compute_classes.GROUP,
            "kind": compute_classes.PLURAL,
            "uid": (found.get("metadata") or {}).get("uid"),
        },
    }
