"""Job state and logs through the GKE and Kubernetes APIs: no process, no binary, no kubeconfig.

The worker asks the GKE API for the cluster's endpoint and CA (:class:`GkeClusterHook`, the google
provider's ``GKEHook``), the way ``GKEStartJobOperator`` does; the JobSet that ``gcluster job
submit`` created and its pods are then read with the google provider's ``GKEKubernetesAsyncHook``
(a bearer token from the GCP connection): :class:`JobSetClient`. The triggerer needs nothing but
the connection.

Object names and labels, checked at their sources:

* ``gcluster.google.com/workload=<name>`` on the JobSet, namespace found by a cluster-wide list
  (cluster-toolkit ``pkg/orchestrator/gke`` templates ``jobset.tmpl``/``pathways_jobset.tmpl``,
  ``DefaultKubeClient.GetJobNamespace``);
* the JobSet state as ``gcluster job list`` derives it (``parseJobStatus``): :func:`jobset_state`;
* pod labels of the jobset controller (``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name``,
  ``job-index``, ``restart-attempt``) and of the Job controller (``batch.kubernetes.io/job-completion-index``);
* the Pathways head pod's ``workload-container`` prints MaxText's progress; its sidecars
  ``pathways-proxy``/``pathways-rm`` and the workers do not.

Which run directory a JobSet writes: ``gcluster job submit`` has no label or annotation flag
(cluster-toolkit ``cmd/job/submit.go``), so the operator records it right after the submit with a
JSON merge patch of ``metadata.annotations`` (:data:`RUN_DIR_ANNOTATION`, :data:`RUN_ID_ANNOTATION`;
a custom resource takes ``application/json-patch+json`` and ``application/merge-patch+json``, not
the strategic merge patch: kubernetes ``apiextensions-apiserver/pkg/apiserver/customresource_handler.go``).
A JobSet without them (submitted by hand, or the patch never came) is judged by its containers'
``base_output_directory=``/``run_name=`` arguments: :func:`jobset_run_dir`.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_provider_tpu_rl.compat import conf
from airflow_provider_tpu_rl.exceptions import (
    ClusterNotFoundError,
    ConfigurationError,
    FailureKind,
    KubernetesApiError,
)
from airflow_provider_tpu_rl.maxtext.layout import run_dir
from airflow_provider_tpu_rl.spec.existing_cluster import (
    COMPUTE_CLASS_GROUP_VERSION,
    COMPUTE_CLASS_PLURAL,
    KUEUE_GROUP_VERSION,
)
from airflow_provider_tpu_rl.toolchain.job_output import JobState

if TYPE_CHECKING:
    from google.cloud.container_v1 import ClusterManagerClient
    from kubernetes_asyncio.client import ApiClient

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
# Kueue's LocalQueues (spec/existing_cluster.py KUEUE_GROUP_VERSION)
KUEUE_GROUP, KUEUE_VERSION = KUEUE_GROUP_VERSION.split("/")
JOBSET_PLURAL = "jobsets"
# GKE's ComputeClass (cluster-scoped; spec/existing_cluster.py COMPUTE_CLASS_GROUP_VERSION)
COMPUTE_CLASS_GROUP, COMPUTE_CLASS_VERSION = COMPUTE_CLASS_GROUP_VERSION.split("/")
WORKLOAD_LABEL = "gcluster.google.com/workload"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
PATHWAYS_HEAD_JOB = "pathways-head"
PATHWAYS_WORKLOAD_CONTAINER = "workload-container"
MAIN_JOB = "main-job"
# Annotation values may hold any string (a gs:// path); label values may not (63 characters of
# [A-Za-z0-9_.-]): k8s.io/apimachinery pkg/api/validation ValidateAnnotations, pkg/util/validation.
RUN_DIR_ANNOTATION = "tpu-rl.io/run-dir"
RUN_ID_ANNOTATION = "tpu-rl.io/run-id"
MERGE_PATCH = "application/merge-patch+json"

API_TIMEOUT = 60.0  # one Kubernetes or GKE API call (not a log stream)
T = TypeVar("T")
U = TypeVar("U")
CONNECT_TIMEOUT = 30.0
STREAM_IDLE_TIMEOUT = 300.0  # a followed log silent this long is re-opened (from its cursor)
CLIENT_REUSE_SECONDS = 1800.0  # GCP access tokens live an hour: a client is re-opened after half
# A cluster's endpoint and CA change only when it is re-created; a process re-asks after this.
CLUSTER_ACCESS_REUSE_SECONDS = 600.0


def container_endpoint() -> str | None:
    """``[tpu_rl] container_endpoint``: another GKE API endpoint (an emulator); empty = Google's."""
    return conf.get("tpu_rl", "container_endpoint", fallback="") or None


@dataclass(frozen=True)
class ClusterAccess:
    """Where a cluster's Kubernetes API is and the CA its serving certificate is signed by."""

    url: str
    ca_cert: str  # base64 PEM, as the GKE API returns it


# (connection, chain, endpoint, project, location, cluster) -> (when asked, what the GKE API said)
_cluster_access: dict[tuple[Any, ...], tuple[float, ClusterAccess]] = {}


class GkeClusterHook:
    """The cluster's endpoint and CA from the GKE API, through the google provider's ``GKEHook``.

    What a cluster answered is kept for :data:`CLUSTER_ACCESS_REUSE_SECONDS` in the process (the
    convert, train and export tasks of one ``airflow dags test``, a worker running several tasks):
    one GKE API call per cluster, not one per task.

    :param gcp_conn_id: the Google Cloud connection.
    :param location: the cluster's region or zone.
    :param impersonation_chain: service account(s) to impersonate.
    :param api_endpoint: another GKE API endpoint (REST); default ``[tpu_rl] container_endpoint``.
    """

    def __init__(
        self,
        gcp_conn_id: str,
        location: str,
        impersonation_chain: str | Sequence[str] | None = None,
        api_endpoint: str | None = None,
    ) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.location = location
        self.impersonation_chain = impersonation_chain
        self.endpoint = api_endpoint if api_endpoint is not None else container_endpoint()

    @cached_property
    def hook(self) -> Any:
        """The google provider's ``GKEHook`` (on the process's shared credentials)."""
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEHook

        from airflow_provider_tpu_rl.hooks.credentials import SharedCredentials

        endpoint = self.endpoint

        class _Hook(SharedCredentials, GKEHook):
            def get_cluster_manager_client(self) -> ClusterManagerClient:
                if not endpoint:
                    return super().get_cluster_manager_client()
                if self._client is None:
                    from google.api_core.client_options import ClientOptions
                    from google.cloud.container_v1 import ClusterManagerClient

                    self._client = ClusterManagerClient(
                        credentials=self.get_credentials(),
                        transport="rest",
                        client_options=ClientOptions(api_endpoint=endpoint),
                    )
                return self._client

        return _Hook(
            gcp_conn_id=self.gcp_conn_id, location=self.location, impersonation_chain=self.impersonation_chain
        )

    def cluster_access(self, cluster_name: str, project_id: str) -> ClusterAccess:
        """``https://<endpoint>`` and the CA of ``cluster_name``; errors as the provider's own."""
        chain = self.impersonation_chain
        key = (
            self.gcp_conn_id,
            chain if chain is None or isinstance(chain, str) else tuple(chain),
            self.endpoint,
            project_id,
            self.location,
            cluster_name,
        )
        known = _cluster_access.get(key)
        if known is not None and time.monotonic() - known[0] < CLUSTER_ACCESS_REUSE_SECONDS:
            return known[1]
        access = self._describe(cluster_name, project_id)
        _cluster_access[key] = (time.monotonic(), access)
        return access

    def _describe(self, cluster_name: str, project_id: str) -> ClusterAccess:
        from google.api_core import exceptions as api_exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            cluster = self.hook.get_cluster(name=cluster_name, project_id=project_id, timeout=API_TIMEOUT)
        except api_exceptions.NotFound as err:
            raise ClusterNotFoundError(
                f"GKE cluster {cluster_name} not found in {project_id}/{self.location}: {_first(err)}"
            ) from err
        except (
            api_exceptions.Unauthenticated,
            api_exceptions.PermissionDenied,
            api_exceptions.Unauthorized,  # the REST transport's 401 and 403 (gRPC's: the two above)
            api_exceptions.Forbidden,
        ) as err:
            raise ConfigurationError(
                f"GKE API refused to describe cluster {cluster_name}: {_first(err)}"
            ) from err
        except (api_exceptions.GoogleAPIError, auth_exceptions.TransportError, OSError) as err:
            raise KubernetesApiError(
                f"GKE API: cannot describe cluster {cluster_name}: {_first(err)}", FailureKind.TRANSIENT
            ) from err
        except auth_exceptions.GoogleAuthError as err:
            raise ConfigurationError(f"GCP connection has no usable credentials: {_first(err)}") from err
        if not cluster.endpoint or not cluster.master_auth.cluster_ca_certificate:
            raise KubernetesApiError(
                f"GKE cluster {cluster_name} has no endpoint yet (status {cluster.status.name})",
                FailureKind.TRANSIENT,
            )
        return ClusterAccess(f"https://{cluster.endpoint}", cluster.master_auth.cluster_ca_certificate)


def _first(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


# ----------------------------------------------------------------------------------- JobSet state
def jobset_state(obj: Mapping[str, Any]) -> tuple[JobState, str | None]:
    """The state and completion time ``gcluster job list`` reports for a JobSet object.

    cluster-toolkit ``pkg/orchestrator/gke/gke_job_orchestrator.go`` ``parseJobStatus``: the base
    state is ``spec.suspend`` (Suspended/Running, Unknown when absent); a ``True`` condition
    ``Completed``/``Succeeded`` makes it Succeeded, ``Failed`` Failed, ``Suspended`` Suspended, in
    list order; the completion time is ``status.completionTime``, else that condition's transition.
    """
    state = JobState.UNKNOWN
    spec = obj.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("suspend"), bool):
        state = JobState.SUSPENDED if spec["suspend"] else JobState.RUNNING
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return state, None
    completed = status.get("completionTime") or None
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping) or cond.get("status") != "True":
            continue
        kind = cond.get("type")
        if kind in ("Completed", "Succeeded", "Failed"):
            state = JobState.FAILED if kind == "Failed" else JobState.SUCCEEDED
            completed = completed or cond.get("lastTransitionTime") or None
        elif kind == "Suspended":
            state = JobState.SUSPENDED
    return state, completed


def head_pod(pods: Sequence[Mapping[str, Any]], replicated_job: str) -> Mapping[str, Any] | None:
    """The pod whose log tells the job's progress: job 0, index 0 of ``replicated_job``, newest
    restart attempt (a JobSet restart recreates every pod)."""

    def labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
        return pod.get("metadata", {}).get("labels") or {}

    candidates = [
        pod
        for pod in pods
        if labels(pod).get(REPLICATED_JOB_LABEL) == replicated_job
        and labels(pod).get(JOB_INDEX_LABEL, "0") == "0"
        and labels(pod).get(COMPLETION_INDEX_LABEL, "0") == "0"
    ]
    if not candidates:
        return None

    def order(pod: Mapping[str, Any]) -> tuple[int, str]:
        try:
            attempt = int(labels(pod).get(RESTART_ATTEMPT_LABEL, "0"))
        except ValueError:
            attempt = 0
        return attempt, str(pod.get("metadata", {}).get("creationTimestamp") or "")

    return max(candidates, key=order)


def workload_container(pod: Mapping[str, Any], pathways: bool) -> str | None:
    """The container printing MaxText's lines: ``workload-container`` on a Pathways head pod, the
    first container otherwise (jobset.tmpl names it after the workload)."""
    containers = [c.get("name") for c in pod.get("spec", {}).get("containers") or []]
    if pathways:
        return PATHWAYS_WORKLOAD_CONTAINER if PATHWAYS_WORKLOAD_CONTAINER in containers else None
    return containers[0] if containers else None


def container_phase(pod: Mapping[str, Any], container: str) -> str:
    """``waiting``, ``running`` or ``terminated`` for ``container`` (``waiting`` when not reported)."""
    status = pod.get("status") or {}
    for item in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]:
        if item.get("name") != container:
            continue
        state = item.get("state") or {}
        for phase in ("terminated", "running", "waiting"):
            if state.get(phase) is not None:
                return phase
    return "waiting"


# ------------------------------------------------------------------------------- run directories
_ARG_RE = re.compile(r"^-{0,2}(base_output_directory|run_name)=(.*)$")


def _container_scripts(obj: Mapping[str, Any]) -> list[str]:
    """Every container's ``command`` + ``args`` in the JobSet's pod templates, one string each."""
    scripts: list[str] = []
    for rjob in (obj.get("spec") or {}).get("replicatedJobs") or []:
        pod = ((((rjob or {}).get("template") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        ) or {}
        for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
            if words:
                scripts.append(" ".join(words))
    return scripts


def command_run_dir(script: str) -> str | None:
    """The directory a MaxText command line writes: ``base_output_directory`` joined with
    ``run_name`` for a trainer (MaxText's ``<base_output_directory>/<run_name>/``), the directory
    itself for a checkpoint conversion (``to_maxtext``/``to_huggingface`` ignore ``run_name``)."""
    try:
        words = shlex.split(script)
    except ValueError:  # an unbalanced quote: fall back to whitespace
        words = script.split()
    found: dict[str, str] = {}
    for word in words:
        match = _ARG_RE.match(word)
        if match:
            found[match[1]] = match[2]
    base = found.get("base_output_directory")
    if not base:
        return None
    if "checkpoint_conversion" in script or not found.get("run_name"):
        return run_dir(base)
    return run_dir(f"{base.rstrip('/')}/{found['run_name']}")


def jobset_run_dir(obj: Mapping[str, Any]) -> str | None:
    """The run directory a JobSet writes: its :data:`RUN_DIR_ANNOTATION`, else what its
    containers' MaxText arguments say; None when neither tells."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if annotations.get(RUN_DIR_ANNOTATION):
        return run_dir(str(annotations[RUN_DIR_ANNOTATION]))
    for script in _container_scripts(obj):
        found = command_run_dir(script)
        if found:
            return found
    return None


def jobset_run_id(obj: Mapping[str, Any]) -> str | None:
    """The ``<dag_id>/<run_id>`` that submitted the JobSet (:data:`RUN_ID_ANNOTATION`), if recorded."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(RUN_ID_ANNOTATION)
    return str(value) if value else None


@dataclass(frozen=True)
class RunDirJob:
    """A JobSet that writes a given run directory."""

    name: str
    namespace: str
    state: JobState
    run_id: str | None  # None: not recorded on the JobSet (judged by its command)

    @property
    def live(self) -> bool:
        return self.state not in (JobState.SUCCEEDED, JobState.FAILED)


# ------------------------------------------------------------------------------- pod disruption
# Why a pod went away under its job, as Kubernetes says it: the pod condition ``DisruptionTarget``
# (reasons PreemptionByScheduler, TerminationByKubelet, DeletionByTaintManager, EvictionByEvictionAPI:
# kubernetes pkg/apis/core/types.go, since 1.26), the kubelet's node-shutdown manager
# (``status.reason`` "Terminated" with "Pod was terminated in response to imminent node shutdown.",
# pkg/kubelet/nodeshutdown), an eviction (``status.reason`` "Evicted"). A job that failed that way
# failed for its nodes, not for its workload: a retry may pass.
_DISRUPTION_REASONS = ("Terminated", "Evicted", "NodeShutdown", "Shutdown", "Preempting", "NodeLost")


def pod_disruption(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The first pod disruption (preemption, node shutdown, eviction) among ``pods``, as one line."""
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name") or "a pod"
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if (
                isinstance(cond, Mapping)
                and cond.get("type") == "DisruptionTarget"
                and cond.get("status") == "True"
            ):
                return f"pod {name}: {cond.get('reason')}: {cond.get('message') or 'disrupted'}"
        if status.get("reason") in _DISRUPTION_REASONS:
            return f"pod {name}: {status.get('reason')}: {status.get('message') or 'lost its node'}"
    return None


TPU_RESOURCE = "google.com/tpu"


def _requests_tpu(pod: Mapping[str, Any]) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        if any(TPU_RESOURCE in (resources.get(kind) or {}) for kind in ("limits", "requests")):
            return True
    return False


def accelerator_start(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """When a JobSet's work began on its accelerators: the earliest ``status.startTime`` of its
    pods that request TPU chips (of all its pods when none does: a CPU job). None when no pod
    has started."""
    tpu_pods = [pod for pod in pods if _requests_tpu(pod)]
    starts = [
        str(start) for pod in (tpu_pods or pods) if (start := (pod.get("status") or {}).get("startTime"))
    ]
    return min(starts, key=rfc3339_seconds) if starts else None


def waiting_for(state: JobState, pods: Sequence[Mapping[str, Any]]) -> str:
    """What a job that has not started waits for, one line: Kueue's admission (a suspended
    JobSet: its ClusterQueue has no free quota for what it asks), or a node for its pods (the
    scheduler's ``PodScheduled=False`` message, e.g. "0/3 nodes are available: 3 Insufficient
    google.com/tpu"), or its pods to be created."""
    if state is JobState.SUSPENDED:
        return (
            "Kueue kept it suspended (its LocalQueue's ClusterQueue has no free quota for the "
            "resources it asks; `kubectl get workloads` shows why)"
        )
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if (
                isinstance(cond, Mapping)
                and cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
            ):
                name = (pod.get("metadata") or {}).get("name") or "a pod"
                detail = cond.get("message") or cond.get("reason") or "unschedulable"
                return f"no node took its pods (pod {name}: {detail}): the capacity it asks for is not there"
    if pods:
        return "its pods were created but none was placed on a node"
    return "Kueue admitted it but none of its pods was created"


def rfc3339_seconds(text: str) -> float:
    """Epoch seconds of an RFC 3339 time as the Kubernetes API writes it (``…Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------------------------------ log lines
_TIMESTAMP_RE = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?(?P<zone>Z|[+-]\d{2}:\d{2}) ?"
)


def split_timestamp(line: str) -> tuple[int, str] | None:
    """``(nanoseconds since the epoch, text)`` of a ``timestamps=true`` log line, None without one."""
    match = _TIMESTAMP_RE.match(line)
    if match is None:
        return None
    zone = "+00:00" if match["zone"] == "Z" else match["zone"]
    seconds = datetime.fromisoformat(match["date"] + zone).timestamp()
    nanos = int((match["frac"] or "0").ljust(9, "0"))
    return int(seconds) * 1_000_000_000 + nanos, line[match.end() :]


def format_since_time(nanos: int) -> str:
    """The whole second at or before ``nanos`` as RFC 3339 (``sinceTime``'s precision is a second
    on some API servers, so the cursor filters the rest)."""
    return datetime.fromtimestamp(nanos // 1_000_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LogCursor:
    """Where a followed container log is: the pod, the last line's time and how many lines with
    exactly that time were already relayed, so a re-read from ``sinceTime`` repeats none."""

    pod_uid: str | None = None
    last_nanos: int = 0
    at_last: int = 0
    lines: int = 0

    def accept(self, nanos: int) -> bool:
        """True if a line written at ``nanos`` is new; the cursor moves past it."""
        if nanos < self.last_nanos:
            return False
        if nanos == self.last_nanos:
            if self._skip > 0:
                self._skip -= 1
                return False
            self.at_last += 1
        else:
            self.last_nanos, self.at_last = nanos, 1
        self.lines += 1
        return True

    def rewind(self) -> None:
        """Before a re-read from ``sinceTime``: the lines at ``last_nanos`` come again, skip them."""
        self._skip = self.at_last

    def __post_init__(self) -> None:
        self._skip = 0

    def since_time(self) -> str | None:
        return format_since_time(self.last_nanos) if self.last_nanos else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pod_uid": self.pod_uid,
            "last_nanos": self.last_nanos,
            "at_last": self.at_last,
            "lines": self.lines,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LogCursor:
        if not data:
            return cls()
        return cls(
            pod_uid=data.get("pod_uid") or None,
            last_nanos=int(data.get("last_nanos") or 0),
            at_last=int(data.get("at_last") or 0),
            lines=int(data.get("lines") or 0),
        )


# ---------------------------------------------------------------------------------- API client
# The cluster autoscaler's event on a pod whose scale-up failed, as GKE's autoscaler emits it
# (k8s.io/gke-autoscaling cluster-autoscaler, package events: reason ``FailedScaleUp``, message
# "Node scale up in zones %v associated with this pod failed: %v. Pod is at risk of not being
# scheduled.", the failures joined by ", "; direct, read as the code corpus stores it). Of its
# failure texts, these two say the zone has no capacity of the pool's kind (scale.up.error.out.of.
# resources, scale.up.error.quota.exceeded: GKE's cluster-autoscaler-visibility page); the others
# ("Internal error", "Invalid TPU configuration", ...) decide nothing: the autoscaler tries again.
FAILED_SCALE_UP = "FailedScaleUp"
SCALE_UP_CAPACITY_FAILURES = ("GCE out of resources", "GCE quota exceeded")


def scale_up_refusal(events: Sequence[Mapping[str, Any]]) -> str | None:
    """``FailedScaleUp: <message>`` of the latest of ``events`` (a pod's) that says its node pool's
    zone has no capacity (:data:`SCALE_UP_CAPACITY_FAILURES`), or None."""
    refusals = [
        event
        for event in events
        if event.get("reason") == FAILED_SCALE_UP
        and any(failure in str(event.get("message") or "") for failure in SCALE_UP_CAPACITY_FAILURES)
    ]
    if not refusals:
        return None
    latest = max(refusals, key=lambda event: str(event.get("lastTimestamp") or event.get("eventTime") or ""))
    return f"{FAILED_SCALE_UP}: {' '.join(str(latest.get('message')).split())}"


def pod_scheduled(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler placed the pod on a node (its ``PodScheduled`` condition is True)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions)


def _api_error(err: Exception, what: str) -> Exception:
    """A Kubernetes client error as the provider's own: 401/403 are configuration, the rest may pass."""
    from kubernetes_asyncio.client.exceptions import ApiException

    if isinstance(err, ApiException):
        reason = _status_message(err)
        if err.status in (401, 403):
            return ConfigurationError(f"Kubernetes API refused {what} ({err.status}): {reason}")
        kind = (
            FailureKind.TRANSIENT if err.status in (0, 408, 429) or err.status >= 500 else FailureKind.CONFIG
        )
        return KubernetesApiError(f"Kubernetes API: {what} failed ({err.status}): {reason}", kind)
    return KubernetesApiError(
        f"Kubernetes API: {what} failed: {type(err).__name__}: {_first(err)}", FailureKind.TRANSIENT
    )


def _status_message(err: Any) -> str:
    import json

    body = getattr(err, "body", None)
    if isinstance(body, bytes | str) and body:
        with contextlib.suppress(ValueError, TypeError):
            message = json.loads(body).get("message")
            if message:
                return _first(Exception(message))
        return _first(Exception(body if isinstance(body, str) else body.decode(errors="replace")))
    return str(getattr(err, "reason", "") or err)


class JobSetClient:
    """Read, find and delete a JobSet and read its pods' logs, through ``GKEKubernetesAsyncHook``.

    :param access: the cluster's URL and CA (from :meth:`GkeClusterHook.cluster_access`).
    :param gcp_conn_id: the GCP connection whose token the Kubernetes API accepts.
    :param impersonation_chain: service account(s) to impersonate.
    """

    def __init__(
        self,
        access: ClusterAccess,
        gcp_conn_id: str,
        impersonation_chain: str | Sequence[str] | None = None,
    ) -> None:
        from airflow.providers.google.cloud.hooks.kubernetes_engine import GKEKubernetesAsyncHook

        from airflow_provider_tpu_rl.hooks.credentials import shared_hook_class

        class _AsyncHook(GKEKubernetesAsyncHook):  # its token from this process's shared credentials
            sync_hook_class = shared_hook_class(GKEKubernetesAsyncHook.sync_hook_class)

        self.access = access
        self.hook = _AsyncHook(
            cluster_url=access.url,
            ssl_ca_cert=access.ca_cert,
            gcp_conn_id=gcp_conn_id,
            impersonation_chain=impersonation_chain,
            enable_tcp_keepalive=True,
        )

    _manager: Any = None
    _client: ApiClient | None = None
    _opened_at = 0.0

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[ApiClient]:
        """The API client, opened once and re-opened (a fresh token) after :data:`CLIENT_REUSE_SECONDS`.

        Opening fetches the GCP connection and a token: done once, not per poll, so the triggerer's
        event loop is not held by it, and a trigger being cancelled needs no connection lookup.
        Auth errors surface as :class:`ConfigurationError`. :meth:`close` ends it.
        """
        from google.auth import exceptions as auth_exceptions

        if self._client is not None and time.monotonic() - self._opened_at > CLIENT_REUSE_SECONDS:
            await self.close()
        if self._client is None:
            try:
                manager = self.hook.get_conn()
                self._client = await manager.__aenter__()
            except (auth_exceptions.GoogleAuthError, ValueError) as err:
                raise ConfigurationError(
                    f"GCP connection has no usable token for the Kubernetes API: {_first(err)}"
                ) from err
            self._manager, self._opened_at = manager, time.monotonic()
        yield self._client

    async def close(self) -> None:
        """Close the API client (and its connection pool), if open."""
        manager, self._manager, self._client = self._manager, None, None
        if manager is not None:
            with contextlib.suppress(Exception):
                await manager.__aexit__(None, None, None)

    async def find(self, client: ApiClient, name: str) -> dict[str, Any] | None:
        """The JobSet ``name`` in any namespace (gcluster's ``GetJobNamespace``); None when absent."""
        from kubernetes_asyncio.client import CustomObjectsApi

        try:
            listed = await CustomObjectsApi(client).list_cluster_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                JOBSET_PLURAL,
                label_selector=f"{WORKLOAD_LABEL}={name}",
                _request_timeout=API_TIMEOUT,
            )
        except Exception as err:
            raise _api_error(err, f"list JobSets named {name}") from err
        items = [item for item in listed.get("items") or [] if item.get("metadata", {}).get("name") == name]
        if len(items) > 1:
            namespaces = sorted(str(item["metadata"].get("namespace")) for item in items)
            raise KubernetesApiError(
                f"found JobSets named {name} in several namespaces {namespaces}", FailureKind.CONFIG
            )
        return items[0] if items else None

    async def api_groups(self, client: ApiClient) -> dict[str, Any]:
        """The API server's discovery ``APIGroupList`` (``GET /apis``), as JSON: which controllers'
        APIs (JobSet, Kueue) the cluster serves."""
        from kubernetes_asyncio.client import ApisApi

        try:
            listed = await ApisApi(client).get_api_versions(_request_timeout=API_TIMEOUT)
        except Exception as err:
            raise _api_error(err, "read the API groups") from err
        document: dict[str, Any] = client.sanitize_for_serialization(listed)
        return document

    async def local_queues(self, client: ApiClient, namespace: str) -> list[str]:
        """The names of the Kueue LocalQueues of ``namespace`` (``kueue.x-k8s.io/v1beta1``)."""
        from kubernetes_asyncio.client import CustomObjectsApi

        try:
            listed = await CustomObjectsApi(client).list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", _request_timeout=API_TIMEOUT
            )
        except Exception as err:
            raise _api_error(err, f"list the LocalQueues of namespace {namespace}") from err
        return [str(item["metadata"]["name"]) for item in listed.get("items") or [] if item.get("metadata")]

    async def list_all(self, client: ApiClient) -> list[dict[str, Any]]:
        """Every JobSet of the cluster, in every namespace."""
        from kubernetes_asyncio.client import CustomObjectsApi

        try:
            listed = await CustomObjectsApi(client).list_cluster_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL, _request_timeout=API_TIMEOUT
            )
        except Exception as err:
            raise _api_error(err, "list JobSets") from err
        items: list[dict[str, Any]] = listed.get("items") or []
        return items

    async def writing(self, client: ApiClient, directory: str) -> list[RunDirJob]:
        """The JobSets (any state, any namespace) that write ``directory`` (:func:`jobset_run_dir`)."""
        wanted = run_dir(directory)
        found = []
        for obj in await self.list_all(client):
            if jobset_run_dir(obj) != wanted:
                continue
            metadata = obj.get("metadata") or {}
            found.append(
                RunDirJob(
                    name=str(metadata.get("name")),
                    namespace=str(metadata.get("namespace") or "default"),
                    state=jobset_state(obj)[0],
                    run_id=jobset_run_id(obj),
                )
            )
        return found

    async def annotate(
        self, client: ApiClient, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> dict[str, Any] | None:
        """Set (``None``: remove) annotations of the JobSet with a JSON merge patch (RFC 7386);
        the patched object, None when the JobSet does not exist."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            # Without _content_type the client sends a dict as application/json-patch+json (its
            # first choice for a custom object); the stubs omit the parameter the code reads.
            obj: dict[str, Any] = await CustomObjectsApi(client).patch_namespaced_custom_object(  # type: ignore[call-arg]
                JOBSET_GROUP,
                JOBSET_VERSION,
                namespace,
                JOBSET_PLURAL,
                name,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=API_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise _api_error(err, f"annotate JobSet {namespace}/{name}") from err
        except Exception as err:
            raise _api_error(err, f"annotate JobSet {namespace}/{name}") from err
        return obj

    async def get(self, client: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
        """The JobSet ``namespace/name``; None when it does not exist (deleted, TTL-collected)."""
        from kubernetes_asyncio.client import CustomObjectsApi
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            obj: dict[str, Any] = await CustomObjectsApi(client).get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, _request_timeout=API_TIMEOUT
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise _api_error(err, f"get JobSet {namespace}/{name}") from err
        except Exception as err:
            raise _api_error(err, f"get JobSet {namespace}/{name}") from err
        return obj

    async def delete(self, client: ApiClient, namespace: str, name: str) -> bool:
        """Delete the JobSet and, in the foreground, its jobs and pods; False when already gone."""
        from kubernetes_asyncio.client import CustomObjectsApi, V1DeleteOptions
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await CustomObjectsApi(client).delete_namespaced_custom_object(
                JOBSET_GROUP,
                JOBSET_VERSION,
                namespace,
                JOBSET_PLURAL,
                name,
                body=V1DeleteOptions(propagation_policy="Foreground"),
                _request_timeout=API_TIMEOUT,
            )
        except ApiException as err:
            if err.status == 404:
                return False
            raise _api_error(err, f"delete JobSet {namespace}/{name}") from err
        except Exception as err:
            raise _api_error(err, f"delete JobSet {namespace}/{name}") from err
        return True

    async def pods(self, client: ApiClient, namespace: str, jobset: str) -> list[dict[str, Any]]:
        """The JobSet's pods (as plain dicts, as the API sent them)."""
        from kubernetes_asyncio.client import CoreV1Api

        return await _listed_items(
            CoreV1Api(client).list_namespaced_pod(
                namespace,
                label_selector=f"{JOBSET_NAME_LABEL}={jobset}",
                _preload_content=False,
                _request_timeout=API_TIMEOUT,
            ),
            f"list pods of JobSet {namespace}/{jobset}",
        )

    async def create_pod(self, client: ApiClient, namespace: str, manifest: Mapping[str, Any]) -> None:
        """Create the pod ``manifest`` (a plain dict) in ``namespace``."""
        from kubernetes_asyncio.client import CoreV1Api

        name = (manifest.get("metadata") or {}).get("name")
        body: Any = dict(manifest)  # a plain dict: the client serializes it as it is
        try:
            await CoreV1Api(client).create_namespaced_pod(namespace, body, _request_timeout=API_TIMEOUT)
        except Exception as err:
            raise _api_error(err, f"create pod {namespace}/{name}") from err

    async def read_pod(self, client: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod ``namespace/name`` as the API sent it; None when it does not exist."""
        from kubernetes_asyncio.client import CoreV1Api

        call = CoreV1Api(client).read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=API_TIMEOUT
        )
        return await _unless_status(_json_body(call), 404, None, f"read pod {namespace}/{name}")

    async def pod_events(self, client: ApiClient, namespace: str, name: str) -> list[dict[str, Any]]:
        """The events of the pod ``namespace/name`` (``involvedObject.name`` field selector)."""
        from kubernetes_asyncio.client import CoreV1Api

        return await _listed_items(
            CoreV1Api(client).list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}",
                _preload_content=False,
                _request_timeout=API_TIMEOUT,
            ),
            f"list the events of pod {namespace}/{name}",
        )

    async def delete_pod(self, client: ApiClient, namespace: str, name: str) -> bool:
        """Delete the pod at once (grace period 0); False when already gone."""
        from kubernetes_asyncio.client import CoreV1Api

        call = CoreV1Api(client).delete_namespaced_pod(
            name, namespace, grace_period_seconds=0, _request_timeout=API_TIMEOUT
        )
        return await _unless_status(_done(call), 404, False, f"delete pod {namespace}/{name}")

    async def create_compute_class(self, client: ApiClient, manifest: Mapping[str, Any]) -> bool:
        """Create the ComputeClass ``manifest`` (cluster-scoped); False when one of its name exists."""
        from kubernetes_asyncio.client import CustomObjectsApi

        name = (manifest.get("metadata") or {}).get("name")
        call = CustomObjectsApi(client).create_cluster_custom_object(
            COMPUTE_CLASS_GROUP,
            COMPUTE_CLASS_VERSION,
            COMPUTE_CLASS_PLURAL,
            dict(manifest),
            _request_timeout=API_TIMEOUT,
        )
        return await _unless_status(_done(call), 409, False, f"create ComputeClass {name}")

    async def get_compute_class(self, client: ApiClient, name: str) -> dict[str, Any] | None:
        """The ComputeClass ``name``; None when it does not exist."""
        from kubernetes_asyncio.client import CustomObjectsApi

        call: Awaitable[dict[str, Any]] = CustomObjectsApi(client).get_cluster_custom_object(
            COMPUTE_CLASS_GROUP,
            COMPUTE_CLASS_VERSION,
            COMPUTE_CLASS_PLURAL,
            name,
            _request_timeout=API_TIMEOUT,
        )
        return await _unless_status(call, 404, None, f"get ComputeClass {name}")

    async def delete_compute_class(self, client: ApiClient, name: str) -> bool:
        """Delete the ComputeClass ``name``; False when already gone."""
        from kubernetes_asyncio.client import CustomObjectsApi

        call = CustomObjectsApi(client).delete_cluster_custom_object(
            COMPUTE_CLASS_GROUP,
            COMPUTE_CLASS_VERSION,
            COMPUTE_CLASS_PLURAL,
            name,
            _request_timeout=API_TIMEOUT,
        )
        return await _unless_status(_done(call), 404, False, f"delete ComputeClass {name}")

    async def read_node(self, client: ApiClient, name: str) -> dict[str, Any] | None:
        """The node ``name`` as the API sent it; None when it does not exist."""
        from kubernetes_asyncio.client import CoreV1Api

        call = CoreV1Api(client).read_node(name, _preload_content=False, _request_timeout=API_TIMEOUT)
        return await _unless_status(_json_body(call), 404, None, f"read node {name}")

    async def pods_anywhere(self, client: ApiClient, jobset: str) -> list[dict[str, Any]]:
        """The JobSet's pods in every namespace (they outlive a deleted JobSet while they end)."""
        from kubernetes_asyncio.client import CoreV1Api

        return await _listed_items(
            CoreV1Api(client).list_pod_for_all_namespaces(
                label_selector=f"{JOBSET_NAME_LABEL}={jobset}",
                _preload_content=False,
                _request_timeout=API_TIMEOUT,
            ),
            f"list pods of JobSet {jobset}",
        )

    async def log_lines(
        self,
        client: ApiClient,
        namespace: str,
        pod: str,
        container: str,
        *,
        since_time: str | None,
        follow: bool,
        tail_lines: int | None = None,
    ) -> AsyncIterator[str]:
        """The container's log lines with their timestamps, from ``since_time``; with ``follow``
        until the container ends, the stream is idle for :data:`STREAM_IDLE_TIMEOUT` or the
        connection drops (the caller re-opens from its cursor)."""
        from aiohttp import ClientTimeout

        query: list[tuple[str, Any]] = [
            ("container", container),
            ("timestamps", "true"),
            ("follow", "true" if follow else "false"),
        ]
        if tail_lines is not None:
            query.append(("tailLines", str(tail_lines)))
        if since_time:
            # sinceTime is a PodLogOptions field the generated client omits (kubernetes#...: only
            # sinceSeconds is in the OpenAPI operation); the API server reads it as a query parameter.
            query.append(("sinceTime", since_time))
        try:
            response: Any = await client.call_api(
                "/api/v1/namespaces/{namespace}/pods/{name}/log",
                "GET",
                path_params={"namespace": namespace, "name": pod},
                query_params=query,
                header_params={"Accept": "text/plain"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=ClientTimeout(
                    connect=CONNECT_TIMEOUT,
                    sock_connect=CONNECT_TIMEOUT,
                    sock_read=STREAM_IDLE_TIMEOUT if follow else API_TIMEOUT,
                ),
            )
        except Exception as err:
            raise _api_error(err, f"read the log of {namespace}/{pod}/{container}") from err
        try:
            pending = b""
            while True:
                try:
                    chunk = await response.content.readline()
                except TimeoutError:
                    return
                except Exception as err:  # the connection dropped: the caller re-opens from its cursor
                    raise _api_error(err, f"stream the log of {namespace}/{pod}/{container}") from err
                if not chunk:
                    break
                pending += chunk
                if not pending.endswith(b"\n"):
                    continue  # a line longer than the stream's buffer comes in parts
                yield pending.decode(errors="replace").rstrip("\r\n")
                pending = b""
            if pending:
                yield pending.decode(errors="replace").rstrip("\r\n")
        finally:
            response.release()


async def _listed_items(listing: Awaitable[Any], what: str) -> list[dict[str, Any]]:
    """The ``items`` of a list call made with ``_preload_content=False`` (plain dicts, as the API
    sent them); a failure is the provider's error saying ``what``."""
    import json

    try:
        response = await listing
        body = await response.read()
    except Exception as err:
        raise _api_error(err, what) from err
    items: list[dict[str, Any]] = json.loads(body).get("items") or []
    return items


async def _unless_status(call: Awaitable[T], status: int, instead: U, what: str) -> T | U:
    """``call``'s result; ``instead`` when the API answers ``status`` (404: gone, 409: exists); any
    other failure is the provider's error saying ``what``."""
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        return await call
    except ApiException as err:
        if err.status == status:
            return instead
        raise _api_error(err, what) from err
    except Exception as err:
        raise _api_error(err, what) from err


async def _done(call: Awaitable[Any]) -> bool:
    """True once ``call`` has answered (its body is not needed)."""
    await call
    return True


async def _json_body(call: Awaitable[Any]) -> dict[str, Any]:
    """The JSON body of a call made with ``_preload_content=False``."""
    import json

    response = await call
    body: dict[str, Any] = json.loads(await response.read())
    return body
