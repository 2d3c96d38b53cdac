"""``gcluster job submit|list|logs|cancel|config``, following cmd/job/*.go and the GKE orchestrator.

A submitted job becomes a JobSet in its cluster's fake Kubernetes API (:mod:`~tpu_rl_sandbox.apis.kube_api`: a record
in ``state/jobs.json`` holding the manifest as ``pathways_jobset.tmpl``/``jobset.tmpl`` render it)
plus a detached worker process (:mod:`~tpu_rl_sandbox.machines.job_worker`) that plays Kueue admission, the JobSet/Job
controllers, the pods and the program. ``job list|cancel|logs`` read and delete the same objects
the API serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis import kube_api
from tpu_rl_sandbox.clis.gcluster import adc
from tpu_rl_sandbox.clis.gcluster.cobra import CobraParse, required_flags_error
from tpu_rl_sandbox.clis.gcluster.console import Console, JobError
from tpu_rl_sandbox.clis.gcluster.gotime import (
    GoDurationError,
    duration_to_seconds_or_int,
    format_duration,
    parse_duration,
)
from tpu_rl_sandbox.world import existing_clusters, inventory
from tpu_rl_sandbox.world.faults import FAULT_ENV, parse_faults
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timestamps import parse_rfc3339, rfc3339

DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
TTL_SCALE_ENV = "TPU_RL_SANDBOX_TTL_SCALE"
PREREQ_FRESHNESS_SECONDS = 24 * 3600
AUTH_PLUGIN = "gke-gcloud-auth-plugin"
FINAL = ("Succeeded", "Failed")
MAX_FOLLOW_STREAMS = 10  # gcluster's kubectl logs -f --max-log-requests=10

PATHWAYS_FLAGS = (
    "pathways-proxy-server-image",
    "pathways-server-image",
    "pathways-worker-image",
    "pathways-headless",
    "pathways-gcs-location",
    "pathways-elastic-slices",
    "pathways-proxy-args",
    "pathways-server-args",
    "pathways-worker-args",
    "pathways-colocated-python-sidecar-image",
    "pathways-head-np",
    "pathways-proxy-env",
    "pathways-server-env",
    "pathways-worker-env",
)


# cmd/job/types.go missingPrereq: (name, commands)
MissingPrereqs = list[tuple[str, list[str]]]
# (pod record, container name) of one log stream
Streams = list[tuple[dict[str, Any], str]]


# vCPUs of the CPU machine types a cluster here can have (Compute Engine machine types; n4 has two
# threads per core, so getEffectiveCPUs keeps guestCpus).
CPU_MACHINE_VCPUS = {"n4-standard-64": 64, "n2-standard-8": 8, "e2-standard-4": 4}


def cpu_limit(compute_type: str) -> int:
    """gcluster's ``cpu`` limit for a CPU machine type: 95% of its vCPUs, at least 1
    (resource_resolver.go ``calculateResourceLimits``); 0 for a type not in the table."""
    cpus = CPU_MACHINE_VCPUS.get(compute_type, 0)
    return max(1, int(cpus * 0.95)) if cpus else 0


def is_tpu(machine_type: str) -> bool:
    """Cluster Toolkit's ``config.IsTPU``: ``ct*`` machine types and ``tpu``/``v<N>`` shorthands."""
    lowered = machine_type.lower()
    return lowered.startswith(("ct", "tpu")) or bool(re.match(r"^v\d+[a-z]*-\d+", lowered))


class JobContext:
    """Project/cluster/location resolution (flags, else ``$HOME/.gcluster/context.json``)."""

    def __init__(self, env: Mapping[str, str], console: Console) -> None:
        self.env = env
        self.console = console

    def home(self) -> Path | None:
        home = self.env.get("HOME")
        return Path(home) if home else None

    def context_file(self) -> Path | None:
        home = self.home()
        if home is None:
            self.console.error(
                "Failed to get context file path: could not get user home directory: $HOME is not defined"
            )
            return None
        directory = home / ".gcluster"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / "context.json"

    def load(self) -> dict[str, str]:
        path = self.context_file()
        if path is None or not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except ValueError as error:
            self.console.error(f"Failed to unmarshal context from {path}: {error}")
            return {}
        return {k: str(v) for k, v in data.items() if v}

    def save(self, data: dict[str, str]) -> None:
        path = self.context_file()
        if path is None:
            raise JobError("failed to get context file path for saving: could not get user home directory")
        ordered = {key: data.get(key, "") for key in ("project_id", "cluster_name", "location")}
        path.write_text(json.dumps(ordered, indent=2))
        self.console.info(f"CLI context saved to {path}")

    def resolve(self, parsed: CobraParse) -> tuple[str, str, str]:
        saved = self.load()
        cluster = parsed.get("cluster") or saved.get("cluster_name", "")
        location = parsed.get("location") or saved.get("location", "")
        project = parsed.get("project") or saved.get("project_id", "")
        if not cluster:
            raise JobError(
                "cluster name is required; please specify it using the --cluster flag or set a default value using "
                "'gcluster job config set cluster <value>'"
            )
        if not location:
            raise JobError(
                "location is required; please specify it using the --location flag or set a default value using "
                "'gcluster job config set location <value>'"
            )
        if not project:
            raise JobError(
                "project ID is required; please specify it using the --project flag or set a default value using "
                "'gcluster job config set project <value>'"
            )
        return str(project), str(location), str(cluster)


def extract_region(location: str) -> str:
    parts = location.split("-")
    return f"{parts[0]}-{parts[1]}" if len(parts) == 3 else location


# ============================================================================ job registry
class JobRegistry:
    """JobSets in the fake clusters."""

    def __init__(self, layout: SandboxLayout) -> None:
        self.layout = layout
        self.store = StateStore(layout)

    def collect_garbage(self) -> None:
        """Delete JobSets finished longer than their ``ttlSecondsAfterFinished`` ago."""
        kube_api.collect_garbage(self.store)

    def jobs_of_cluster(self, cluster_key: str) -> list[dict[str, Any]]:
        return [job for job in self.store.read("jobs").values() if job.get("cluster_key") == cluster_key]

    def find(self, cluster_key: str, name: str) -> dict[str, Any] | None:
        return next((job for job in self.jobs_of_cluster(cluster_key) if job["name"] == name), None)

    def log_dir(self, uid: str) -> Path:
        return self.layout.jobs_dir / uid

    def delete(self, job: dict[str, Any]) -> None:
        """Delete the JobSet (its pods stop)."""
        kube_api.delete_jobset(self.store, job)

    def delete_cluster_jobs(self, cluster: dict[str, Any]) -> None:
        key = inventory.cluster_key(str(cluster["project"]), str(cluster["region"]), str(cluster["name"]))
        for job in self.jobs_of_cluster(key):
            self.delete(job)


def stop_worker(job: dict[str, Any]) -> None:
    kube_api.stop_worker(job)


def job_status_condition(job: dict[str, Any]) -> str:
    """``getJobSetStatus``: the type of the JobSet's last condition whose status is ``True``."""
    conditions = kube_api.jobset_object(job)["status"].get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True"]
    return str(true[-1]["type"]) if true else ""


def parse_job_status(obj: dict[str, Any]) -> tuple[str, str]:
    """pkg/orchestrator/gke ``parseJobStatus``: (status, completion time) of a JobSet object."""
    status, completion = "Unknown", ""
    suspend = (obj.get("spec") or {}).get("suspend")
    if isinstance(suspend, bool):
        status = "Suspended" if suspend else "Running"
    body = obj.get("status") or {}
    completion = str(body.get("completionTime") or "")
    for condition in body.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if kind in ("Completed", "Succeeded", "Failed"):
            status = "Succeeded" if kind != "Failed" else "Failed"
            completion = completion or str(condition.get("lastTransitionTime") or "")
        elif kind == "Suspended":
            status = "Suspended"
    return status, completion


# ================================================================================= commands
class JobCommands:
    """Implementation of the ``gcluster job`` sub-commands."""

    def __init__(
        self,
        layout: SandboxLayout,
        env: Mapping[str, str],
        console: Console,
        cwd: str,
    ) -> None:
        self.layout = layout
        self.env = env
        self.console = console
        self.cwd = cwd
        self.registry = JobRegistry(layout)
        self.context = JobContext(env, console)

    # -- config ---------------------------------------------------------------------------
    def config_set(self, parsed: CobraParse) -> None:
        key, value = parsed.args[0].lower(), parsed.args[1]
        data = self.context.load()
        field = {"project": "project_id", "cluster": "cluster_name", "location": "location"}.get(key)
        if field is None:
            raise JobError(f"invalid configuration key: {key}. Supported keys: project, cluster, location")
        data[field] = value
        self.context.save(data)
        self.console.info("Configuration updated successfully.")

    def config_list(self, parsed: CobraParse) -> None:
        data = self.context.load()
        self.console.out("Current Configuration:\n")
        self.console.out(f"  project:  {data.get('project_id', '')}\n")
        self.console.out(f"  cluster:  {data.get('cluster_name', '')}\n")
        self.console.out(f"  location: {data.get('location', '')}\n")

    # -- shared ---------------------------------------------------------------------------
    def _cluster_or_credentials_error(self, project: str, location: str, name: str) -> dict[str, Any]:
        cluster = inventory.find_cluster(self.registry.store, project, location, name)
        if cluster is None:
            raise JobError(
                "failed to get GKE cluster credentials: ERROR: (gcloud.container.clusters.get-credentials) "
                f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/{name}.\n"
                f"No cluster named '{name}' in {project}.\n"
            )
        return cluster

    def _jobsets_error(self, cluster: dict[str, Any], selector: str) -> str | None:
        """client-go's error when the kubeconfig's exec credential plugin is not on PATH.

        ``gcluster job list|cancel|logs`` talk to the cluster through client-go
        (pkg/orchestrator/gke ``getDynamicClient``) with the kubeconfig ``gcloud container clusters
        get-credentials`` wrote, whose user runs ``gke-gcloud-auth-plugin``
        (client-go plugin/pkg/client/auth/exec ``wrapCmdRunErrorLocked``).
        """
        if shutil.which(AUTH_PLUGIN, path=self.env.get("PATH", "")) is not None:
            return None
        digest = hashlib.sha256(str(cluster["name"]).encode()).digest()
        endpoint = f"34.{digest[0]}.{digest[1]}.{digest[2] or 1}"  # the fake gcloud's cluster endpoint
        query = urllib.parse.quote(selector, safe="")
        return (
            f'Get "https://{endpoint}/apis/jobset.x-k8s.io/v1alpha2/jobsets?labelSelector={query}": getting '
            f"credentials: exec: executable {AUTH_PLUGIN} not found\n\nIt looks like you are trying to use a "
            "client-go credential plugin that is not installed.\n\nTo learn more about this feature, consult the "
            "documentation available at:\n      https://kubernetes.io/docs/reference/access-authn-authz/"
            f"authentication/#client-go-credential-plugins\n\nInstall {AUTH_PLUGIN} for use with kubectl by "
            "following https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-access-for-kubectl#install_plugin"
        )

    def _job_namespace_check(self, cluster: dict[str, Any], job_name: str) -> None:
        """``DefaultKubeClient.GetJobNamespace``'s list call (cancel, logs)."""
        error = self._jobsets_error(cluster, f"gcluster.google.com/workload={job_name}")
        if error is not None:
            raise JobError(f"failed to search for jobset {job_name} across namespaces: {error}")

    def existing_cluster_queue(
        self, cluster: Mapping[str, Any], requested: str, *, check: bool = True
    ) -> str:
        """The LocalQueue of a cluster made outside the provider, as gcluster resolves and checks it
        (cluster-toolkit v1.95.0 gke_job_orchestrator.go ``configureClusterEnvironment``,
        ``resolveKueueQueue``, ``checkLocalQueueExists``): the one named, else the only one, else
        ``multislice-queue``; several and none named is a warning and ``default-queue``. Then, unless
        the manifest is only written (``--dry-run-out``), a queue that does not exist makes gcluster
        *prompt* to create default Kueue resources (``shell.PromptYesNo``); with no answer on stdin
        (a task's subprocess) it ends on ``logging.Fatal`` of the read error (EOF), creating nothing."""
        queues = existing_clusters.local_queues(cluster)
        if requested:
            self.console.info(f"Using provided Kueue LocalQueue: {requested}")
            queue = requested
        elif not queues:
            self.console.info("No LocalQueues found. Defaulting to 'multislice-queue'.")
            queue = "multislice-queue"
        elif len(queues) == 1:
            self.console.info(f"Auto-discovered Kueue LocalQueue: {queues[0]}")
            queue = queues[0]
        else:
            self.console.info(
                f"Warning: Failed to auto-discover Kueue Queue Name: multiple LocalQueues found "
                f"([{' '.join(queues)}]). Please specify which one to use using --queue flag. Falling back "
                "to default-queue."
            )
            queue = "default-queue"
        if check and queue not in queues:
            self.console.out(
                f"LocalQueue '{queue}' does not exist. Do you want gcluster to create default Kueue resources "
                "(ClusterQueue and LocalQueue) with calculated cluster capacity? [Y/n]: "
            )
            raise JobError("EOF")
        return queue

    def _cluster_key(self, cluster: dict[str, Any]) -> str:
        return inventory.cluster_key(str(cluster["project"]), str(cluster["region"]), str(cluster["name"]))

    # -- list -----------------------------------------------------------------------------
    def list(self, parsed: CobraParse) -> None:
        status_filter = parsed.get("status")
        allowed = ("Pending", "Running", "Succeeded", "Failed", "Suspended")
        project, location, name = self.context.resolve(parsed)
        if status_filter and status_filter not in allowed:
            raise JobError(
                f"invalid value for --status: {status_filter}. Allowed values are: Pending, Running, Succeeded, Failed, Suspended"
            )
        self.console.info(f"Listing jobs in cluster '{name}'...")
        cluster = self._cluster_or_credentials_error(project, location, name)
        error = self._jobsets_error(cluster, "gcluster.google.com/workload")
        if error is not None:
            raise JobError(f"failed to list jobsets across all namespaces: {error}")
        self.registry.collect_garbage()
        rows = [("NAME", "STATUS", "CREATION_TIME", "COMPLETION_TIME")]
        for job in sorted(self.registry.jobs_of_cluster(self._cluster_key(cluster)), key=lambda j: j["name"]):
            if parsed.get("name-contains") and parsed.get("name-contains") not in job["name"]:
                continue
            manifest_labels = ((job.get("manifest") or {}).get("metadata") or {}).get("labels") or {}
            if "gcluster.google.com/workload" not in manifest_labels:
                continue  # ListJobSets("gcluster.google.com/workload")
            status, completion = parse_job_status(kube_api.jobset_object(job))
            if status_filter and status.lower() != status_filter.lower():
                continue
            rows.append((job["name"], status, job["created"], completion))
        self.console.out(tabwriter(rows, padding=3))

    # -- logs -----------------------------------------------------------------------------
    def logs(self, parsed: CobraParse) -> None:
        job_name = parsed.args[0]
        project, location, name = self.context.resolve(parsed)
        self.console.info(f"Fetching logs for job '{job_name}' in cluster '{name}'...")
        cluster = self._cluster_or_credentials_error(project, location, name)
        self._job_namespace_check(cluster, job_name)
        self.registry.collect_garbage()
        job = self.registry.find(self._cluster_key(cluster), job_name)
        if job is None:
            raise JobError(f"jobset {job_name} not found in any namespace")
        if shutil.which("kubectl", path=self.env.get("PATH", "")) is None:
            # GetJobLogs runs `kubectl logs ...`; a command that cannot start has exit code 1 and no output.
            raise JobError("failed to get logs: \n")
        main_only = bool(parsed.get("main-only"))
        streams = self._streams(job, main_only)
        if not streams:
            # No pods yet: ``kubectl logs -l ...`` finds nothing.
            if parsed.get("follow"):
                self.console.info(f"Streaming logs for job '{job_name}'...")
                self.console.err("No resources found in default namespace.\n")
                return
            self.console.err(
                "Job exists but has no live logs available (it may have finished or failed to start pods)\n\n"
            )
            return
        # kubectl logs with a label selector defaults to --tail=10 per container (--main-only: whole log)
        tail = None if main_only else 10
        if not parsed.get("follow"):
            output = "".join(
                self._read_stream(job, pod, container, tail, follow=False) for pod, container in streams
            )
            if not output.strip():
                output = (
                    "Job exists but has no live logs available (it may have finished or failed to start pods)"
                )
            # cobra's cmd.Println writes to stderr.
            self.console.err(output + ("\n" if not output.endswith("\n") else "") + "\n")
            return
        self.console.info(f"Streaming logs for job '{job_name}'...")
        if len(streams) > MAX_FOLLOW_STREAMS:
            # kubectl logs -f --max-log-requests=10 (staging/src/k8s.io/kubectl/pkg/cmd/logs/logs.go RunLogs)
            self.console.err(
                f"error: you are attempting to follow {len(streams)} log streams, but maximum allowed concurrency is "
                f"{MAX_FOLLOW_STREAMS}, use --max-log-requests to increase the limit\n"
            )
            raise JobError("exit status 1")
        lock = threading.Lock()

        def follow(pod: dict[str, Any], container: str) -> None:
            def emit(data: bytes) -> None:
                with lock:
                    self.console.out(data.decode(errors="replace"))

            self._read_stream(job, pod, container, tail, follow=True, emit=emit)

        threads = [threading.Thread(target=follow, args=stream, daemon=True) for stream in streams]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.console.err("\n")

    def _streams(self, job: dict[str, Any], main_only: bool) -> Streams:
        """(pod, container) pairs ``kubectl logs -l jobset-name=... --all-containers`` reads, in its order."""
        pods = sorted(job.get("pods") or [], key=lambda p: str(p["name"]))
        if main_only:
            head = "pathways-head" if job.get("pathways") else "main-job"
            main = [
                p for p in pods if p["replicatedJob"] == head and p["jobIndex"] == 0 and p["podIndex"] == 0
            ]
            return [(main[0], "workload-container")] if main else []
        return [
            (pod, container["name"])
            for pod in pods
            for container in (pod.get("init") or []) + (pod.get("containers") or [])
        ]

    def _read_stream(
        self,
        job: dict[str, Any],
        pod: dict[str, Any],
        container: str,
        tail: int | None,
        follow: bool,
        emit: Callable[[bytes], None] | None = None,
    ) -> str:
        """One container's log as the API serves it (``GET .../pods/{pod}/log?container=...``)."""
        query: dict[str, list[str]] = {"container": [container], "follow": ["true" if follow else "false"]}
        if tail is not None:
            query["tailLines"] = [str(tail)]
        options = kube_api.LogOptions(str(pod["name"]), query)
        path = kube_api.container_log_path(self.layout, str(job["uid"]), str(pod["name"]), container)
        chunks: list[bytes] = []

        def running() -> bool:
            current = self.registry.store.read("jobs").get(job["key"])
            if current is None or current.get("uid") != job["uid"]:
                return False
            for candidate in current.get("pods") or []:
                if candidate["name"] == pod["name"]:
                    states = (candidate.get("init") or []) + (candidate.get("containers") or [])
                    return any(c["name"] == container and c.get("state") != "terminated" for c in states)
            return False

        kube_api.read_log(path, options, running, emit or chunks.append)
        return b"".join(chunks).decode(errors="replace")

    # -- cancel ---------------------------------------------------------------------------
    def cancel(self, parsed: CobraParse) -> None:
        job_name = parsed.args[0]
        project, location, name = self.context.resolve(parsed)
        cluster = self._cluster_or_credentials_error(project, location, name)
        self._job_namespace_check(cluster, job_name)
        self.registry.collect_garbage()
        job = self.registry.find(self._cluster_key(cluster), job_name)
        if job is None:
            raise JobError(f"jobset {job_name} not found in any namespace")
        # getJobSetStatus runs `kubectl get jobset`; without kubectl its error makes the verb "Cancel".
        has_kubectl = shutil.which("kubectl", path=self.env.get("PATH", "")) is not None
        condition = job_status_condition(job) if has_kubectl else ""
        verb = "Cancel"
        if condition in ("Completed", "Failed"):
            verb = "Cleanup"
            self.console.info(
                f"Cleaning up resources for the '{condition}' job '{job_name}' in cluster '{name}'..."
            )
        else:
            self.console.info(f"Canceling job '{job_name}' in cluster '{name}'...")
        self.registry.delete(job)
        self.console.info(f"{verb} operation on Job '{job_name}' completed successfully.")

    # -- submit ---------------------------------------------------------------------------
    def submit_pre_run(self, parsed: CobraParse) -> tuple[str, str, str]:
        """PersistentPreRunE + PreRunE + required flags, in cobra's order."""
        project, location, cluster_name = self.context.resolve(parsed)
        name = str(parsed.get("name"))
        if len(name) > 28:
            raise JobError(
                "workload name cannot exceed 28 characters due to Kubernetes/GCE resource name limits. The provided "
                f'name "{name}" has {len(name)} characters'
            )
        image, base, build = parsed.get("image"), parsed.get("base-image"), parsed.get("build-context")
        if (not image and not base) or (build and not base):
            raise JobError("either --image or --base-image must be provided")
        if image and build:
            raise JobError("--build-context cannot be provided when --image is used as no build is performed")
        if base and not build:
            raise JobError("a --build-context must be provided when --base-image is used for a Crane build")
        if build and not self.env.get("GCLUSTER_IMAGE_REPO"):
            raise JobError(
                "GCLUSTER_IMAGE_REPO environment variable is required when using --build-context. Please set it in "
                "your environment with the repository name only (e.g., export GCLUSTER_IMAGE_REPO=gcluster-repo)"
            )
        if parsed.get("pathways"):
            if not parsed.get("pathways-gcs-location"):
                raise JobError("pathways-gcs-location is required when using --pathways")
        elif any(
            flag in parsed.changed for flag in PATHWAYS_FLAGS if flag != "pathways-max-slice-restarts"
        ) or (
            "pathways-max-slice-restarts" in parsed.changed and parsed.get("pathways-max-slice-restarts") != 1
        ):
            raise JobError("pathways flags specified but --pathways flag is missing")
        if not parsed.get("dry-run-out"):
            self.ensure_prerequisites(project, location)
        provisioning = str(parsed.get("gke-nap-provisioning") or "").lower()
        if provisioning and provisioning not in ("on-demand", "spot", "reservation"):
            raise JobError(
                f'invalid value "{provisioning}" for --gke-nap-provisioning. Allowed values: on-demand, spot, reservation'
            )
        if provisioning == "reservation" and not parsed.get("gke-nap-reservation"):
            raise JobError("--gke-nap-reservation is required when --gke-nap-provisioning=reservation")
        if provisioning != "reservation" and parsed.get("gke-nap-reservation"):
            raise JobError(
                "--gke-nap-reservation should only be provided when --gke-nap-provisioning=reservation"
            )
        for flag in ("env", "pathways-proxy-env", "pathways-server-env", "pathways-worker-env"):
            for item in parsed.get(flag):
                key, sep, _ = str(item).partition("=")
                if not sep or not key or not ENV_NAME_RE.match(key):
                    raise JobError(f'invalid value "{item}" for --{flag}: must be in KEY=VALUE format')
        missing = required_flags_error(parsed, ("command", "name", "compute-type"))
        if missing is not None:
            raise missing
        return project, location, cluster_name

    def ensure_prerequisites(self, project: str, location: str) -> None:
        """cmd/job/prereq.go ``ensurePrerequisites`` (cached 24h per project in ``~/.gcluster``).

        gcloud on PATH (a hard error), then every missing item listed at once: ``kubectl`` and
        ``gke-gcloud-auth-plugin`` (run through PATH as gcluster runs them), the Docker credential
        helpers and the Artifact Registry API (``gcloud services list``: the sandbox's
        ``state/settings.json`` says whether the API is disabled or the caller lacks
        ``serviceusage.services.list``). Before them, as gcluster orders them: the active gcloud
        account (``ensureGCloudAuthenticated``: ``gcloud auth list`` through PATH, so the fake
        gcloud's ``gcloud_logged_in`` setting decides) and ADC (``getADCSetupCommand``: the
        golang/oauth2 search over this process's env and a token fetch, :mod:`tpu_rl_sandbox.clis.gcluster.adc`).
        """
        home = self.context.home()
        state_file = home / ".gcluster" / "job_prereq_state.json" if home else None
        if state_file and state_file.is_file():
            try:
                saved = json.loads(state_file.read_text())
                checked = parse_rfc3339(saved["last_checked_timestamp"]).timestamp()
                if (
                    saved.get("last_checked_project_id") == project
                    and time.time() - checked < PREREQ_FRESHNESS_SECONDS
                ):
                    self.console.info(
                        f"Skipping checks; prerequisites are fresh (project: {project}, checked: "
                        f"{format_duration(time.time() - checked)} ago)."
                    )
                    return
            except (ValueError, KeyError, OSError):
                pass
        self.console.info("Prerequisites state is stale or project ID changed, performing fresh check.")
        if shutil.which("gcloud", path=self.env.get("PATH", "")) is None:
            raise JobError(
                "Google Cloud SDK (gcloud) is required to run prerequisite checks. Aborting job submission.\n"
                "Please install it from https://cloud.google.com/sdk/docs/install and ensure it's in your PATH.\n"
                "After installation, please run 'gcloud auth login' to authenticate.\nError: exec: \"gcloud\": "
                "executable file not found in $PATH"
            )
        missing: MissingPrereqs = []
        # ensureGCloudAuthenticated: exit 0 and a non-empty stdout
        auth = self._run(["gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"])
        if auth is None or auth.returncode != 0 or not auth.stdout.strip():
            missing.append(("Google Cloud Authentication", ["gcloud auth login"]))
        # getADCSetupCommand: FindDefaultCredentials(cloud-platform), then a token
        if adc.find_adc_problem(self.env) is not None:
            missing.append(
                ("Application Default Credentials (ADC)", ["gcloud auth application-default login"])
            )
        # checkK8sDependencies
        for tool, argv in (
            ("kubectl", ["kubectl", "version", "--client", "--output=json"]),
            ("gke-gcloud-auth-plugin", ["gke-gcloud-auth-plugin", "--version"]),
        ):
            if self._exit_code(argv) != 0:
                if self._component_manager_enabled():
                    commands = [f"gcloud components install {tool} --quiet"]
                else:
                    commands = [f"# Please install {tool} manually for your operating system."]
                missing.append((tool, commands))
        region = extract_region(location)
        if not self._docker_creds_configured(region):
            commands = ["gcloud auth configure-docker gcr.io --quiet"]
            if region:
                commands.append(f"gcloud auth configure-docker {region}-docker.pkg.dev --quiet")
            missing.append(("Docker Credentials", commands))
        if project and not self._artifact_registry_enabled():
            missing.append(
                (
                    "Artifact Registry API",
                    [f"gcloud services enable artifactregistry.googleapis.com --project {project} --quiet"],
                )
            )
        if missing:
            text = (
                "\nSome required prerequisites are missing. Please install the dependencies or configure the "
                "credentials listed below to proceed:\n"
            )
            for name, commands in missing:
                text += f"\n - {name}\n"
                if len(commands) == 1:
                    text += f"   Command: {commands[0]}\n"
                else:
                    text += "   Commands:\n" + "".join(f"     {c}\n" for c in commands)
            self.console.out(text + "\n")
            raise JobError("job could not be submitted because some prerequisites are missing.")
        if state_file is not None:
            state_file.parent.mkdir(parents=True, exist_ok=True)
            state_file.write_text(
                json.dumps(
                    {
                        "gcloud_sdk_installed": True,
                        "gcloud_project_configured": False,
                        "gcloud_authenticated": True,
                        "adc_configured": True,
                        "kubectl_installed": True,
                        "gke_gcloud_auth_plugin_installed": True,
                        "docker_creds_configured": True,
                        "artifact_registry_api_enabled": bool(project),
                        "last_checked_project_id": project,
                        "last_checked_timestamp": rfc3339(),
                    },
                    indent=2,
                )
            )
        self.console.info("Prerequisites checked successfully.")

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
        """pkg/shell ``ExecuteCommand`` through this process's PATH; ``None`` if it cannot start."""
        found = shutil.which(argv[0], path=self.env.get("PATH", ""))
        if found is None:
            return None
        try:
            return subprocess.run(
                [found, *argv[1:]],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=dict(self.env),
                cwd=self.cwd,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _exit_code(self, argv: Sequence[str]) -> int:
        done = self._run(argv)
        return 1 if done is None else done.returncode

    def _component_manager_enabled(self) -> bool:
        """``isGCloudComponentManagerEnabled``: ``gcloud components list --quiet`` does not say disabled."""
        done = self._run(["gcloud", "components", "list", "--quiet"])
        return "component manager is disabled" not in (done.stderr if done is not None else "")

    def _artifact_registry_enabled(self) -> bool:
        """``gcloud services list --filter=NAME:artifactregistry.googleapis.com`` prints ``ENABLED``.

        Read from the sandbox's ``state/settings.json`` (``disabled_services``,
        ``denied_permissions``, ``gcloud_logged_in``): a disabled API, a caller without
        ``serviceusage.services.list`` or no gcloud account prints nothing, which gcluster reads as
        "not enabled".
        """
        try:
            settings = json.loads((self.layout.state_dir / "settings.json").read_text())
        except (OSError, ValueError):
            return True
        if not isinstance(settings, dict):
            return True
        if not settings.get("gcloud_logged_in", True):
            return False  # gcloud without an account prints only its error, on stderr
        disabled = settings.get("disabled_services") or ()
        denied = settings.get("denied_permissions") or ()
        return (
            "artifactregistry.googleapis.com" not in disabled and "serviceusage.services.list" not in denied
        )

    def _docker_creds_configured(self, region: str) -> bool:
        directory = self.env.get("DOCKER_CONFIG")
        if not directory:
            home = self.context.home()
            if home is None:
                return False
            directory = str(home / ".docker")
        try:
            config = json.loads((Path(directory) / "config.json").read_text())
        except (OSError, ValueError):
            return False
        if config.get("credsStore") == "gcloud":
            return True
        helpers = config.get("credHelpers") or {}
        return helpers.get("gcr.io") == "gcloud" and helpers.get(f"{region}-docker.pkg.dev") == "gcloud"

    def submit(self, parsed: CobraParse) -> int:
        project, location, cluster_name = self.submit_pre_run(parsed)
        dry_run = str(parsed.get("dry-run-out") or "")
        if dry_run and (dry_run.endswith("/") or Path(dry_run).is_dir()):
            raise JobError(f'the dry-run-out path "{dry_run}" must be a file path, not a directory path')
        try:
            ttl = duration_to_seconds_or_int(
                str(parsed.get("gke-ttl-after-finished")), "--gke-ttl-after-finished"
            )
            duration_to_seconds_or_int(str(parsed.get("grace-period")), "--grace-period")
        except ValueError as error:
            raise JobError(str(error)) from None
        timeout = str(parsed.get("timeout"))
        await_completion = bool(parsed.get("await-job-completion")) or timeout != "-1s"
        compute_type = str(parsed.get("compute-type"))
        name = str(parsed.get("name"))
        if is_tpu(compute_type) and "num-nodes" in parsed.changed:
            raise JobError(
                "--num-nodes cannot be used with TPU jobs (it is calculated automatically from topology)"
            )

        self.console.info("Starting gcluster job submit workflow...")
        self.console.info(f"Fetching GKE cluster metadata for '{cluster_name}'...")
        cluster = inventory.find_cluster(self.registry.store, project, location, cluster_name)
        if cluster is None:
            raise JobError(
                f"failed to describe GKE cluster {cluster_name}: ERROR: (gcloud.container.clusters.describe) "
                f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/{cluster_name}.\n"
                f"No cluster named '{cluster_name}' in {project}.\n"
            )
        pools = cluster.get("node_pools", [])
        tpu_pools = [p for p in pools if p.get("topology")]
        cpus, tpus = 64 + 8 * len(pools), sum(_chips(p) for p in tpu_pools)
        self.console.info(f"Calculated cluster capacity: {{CPUs:{cpus} MemoryMB:262144 GPUs:0 TPUs:{tpus}}}")
        pathways = bool(parsed.get("pathways"))
        if pathways:
            head = parsed.get("pathways-head-np") or next(
                (p["name"] for p in pools if p["name"] in ("cpu-np", "pathways-np")), ""
            )
            if not head or head not in [p["name"] for p in pools]:
                raise JobError(
                    "failed to auto-detect a suitable CPU node pool (expected 'cpu-np' or 'pathways-np') for Pathways "
                    "head job. You can explicitly specify your head node pool name using the --pathways-head-np flag"
                )
        self.console.info(f"Configuring kubectl for GKE cluster '{cluster_name}'...")
        if cluster.get("made_outside"):
            self.existing_cluster_queue(cluster, str(parsed.get("queue") or ""), check=not dry_run)
        else:
            self.console.info("Auto-discovered Kueue LocalQueue: default-queue")
        self.console.info("Eagerly fetching and caching machine capabilities...")
        topology = str(parsed.get("topology") or "")
        machine_pools = [p for p in pools if p.get("machine_type") == compute_type and not p.get("failed")]
        if not machine_pools:
            raise JobError(
                f"no matching machine types found in cluster for shorthand {go_q(compute_type)}. Available candidates: "
                f"[{' '.join(sorted({str(p.get('machine_type')) for p in pools}))}]"
            )
        if not is_tpu(compute_type) and topology:
            raise JobError(
                "failed to generate GKE manifest: failed to build node selector: topology is not allowed "
                "for GPU and CPU jobs"
            )
        if is_tpu(compute_type):
            discovered = sorted({str(p["topology"]) for p in machine_pools if p.get("topology")})
            if topology:
                if topology not in discovered:
                    raise JobError(
                        f"requested topology {topology} is not valid for cluster. It must match or fit inside discovered limits: [{' '.join(discovered)}]"
                    )
                self.console.info(f"Validated provided Topology: {topology}")
            elif discovered:
                topology = discovered[0]
                self.console.info(f"Auto-discovered Topology: {topology}")
            nodes = max(1, _topology_chips(topology) // _chips_per_vm(compute_type))
            self.console.info(f"Dynamically determined nodes_per_slice for {topology}: {nodes}")
        self.registry.collect_garbage()
        cluster_key = self._cluster_key(cluster)
        existing = self.registry.find(cluster_key, name)
        if existing is not None:
            raise JobError(
                f"job with name '{name}' already exists in state '{existing['status']}'. You can cancel the existing job "
                f"using 'gcluster job cancel {name} --cluster {cluster_name} --location {location} --project {project}' "
                "or resubmit this workload with a different name using '--name'"
            )
        self.console.info(
            f"Using pre-existing container image: {parsed.get('image') or parsed.get('base-image')}"
        )
        self.console.info("Generating GKE manifest...")
        if dry_run:
            self.console.info(f"Saving GKE manifest to {dry_run}")
            Path(dry_run).write_text(
                f"# JobSet {name} (sandbox dry run)\nkind: JobSet\nmetadata:\n  name: {name}\n"
            )
            self.console.info("GKE manifest saved successfully.")
            self.console.info("gcluster job submit workflow completed.")
            return 0
        self.console.info("Applying GKE manifest to cluster...")
        if not DNS_1035_RE.match(name):
            raise JobError(
                'failed to apply GKE manifest: The JobSet "'
                + name
                + '" is invalid: metadata.name: Invalid value: "'
                + name
                + "\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
                "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            )
        job = self._create_job(parsed, project, location, cluster, name, ttl, topology, pathways)
        self.console.info("GKE workload deployed successfully.")
        self._print_links(project, location, cluster_name, name, pathways)
        if await_completion:
            return self._await(job, timeout, project, location, cluster_name)
        self.console.info("gcluster job submit workflow completed.")
        return 0

    def _create_job(
        self,
        parsed: CobraParse,
        project: str,
        location: str,
        cluster: dict[str, Any],
        name: str,
        ttl: int,
        topology: str,
        pathways: bool,
    ) -> dict[str, Any]:
        """Apply the JobSet manifest to the cluster's API and start the worker playing its controllers."""
        try:
            scale = float(self.env.get(TTL_SCALE_ENV, "") or 1.0)
        except ValueError:
            scale = 1.0
        parse_faults(self.env.get(FAULT_ENV))  # refuse bad fault specs at submit time
        uid = uuid.uuid4().hex
        now = time.time()

        def env_map(flag: str) -> dict[str, str]:
            return dict(str(item).split("=", 1) for item in parsed.get(flag))

        compute_type = str(parsed.get("compute-type"))
        tpu = is_tpu(compute_type)
        nodes = (
            max(1, _topology_chips(topology) // _chips_per_vm(compute_type))
            if tpu
            else int(parsed.get("num-nodes") or 1)
        )
        manifest = jobset_manifest(
            name=name,
            command=str(parsed.get("command")),
            image=str(parsed.get("image") or parsed.get("base-image")),
            ttl=ttl,
            max_restarts=int(parsed.get("restarts")),
            num_slices=int(parsed.get("num-slices")),
            nodes_per_slice=nodes,
            compute_type=compute_type,
            topology=topology,
            env=env_map("env"),
            grace_seconds=duration_to_seconds_or_int(str(parsed.get("grace-period")), "--grace-period"),
            node_constraint=dict(parsed.get("node-constraint") or {}),
            service_account=str(parsed.get("service-account") or ""),
            pathways=(
                {
                    "proxy_image": str(parsed.get("pathways-proxy-server-image") or DEFAULT_PROXY_IMAGE),
                    "server_image": str(parsed.get("pathways-server-image") or DEFAULT_SERVER_IMAGE),
                    "worker_image": str(
                        parsed.get("pathways-worker-image")
                        or parsed.get("pathways-server-image")
                        or DEFAULT_SERVER_IMAGE
                    ),
                    "gcs": str(parsed.get("pathways-gcs-location")),
                    "head_np": str(parsed.get("pathways-head-np") or "cpu-np"),
                    "proxy_env": env_map("pathways-proxy-env"),
                    "server_env": env_map("pathways-server-env"),
                    "worker_env": env_map("pathways-worker-env"),
                }
                if pathways
                else None
            ),
        )
        from tpu_rl_sandbox.machines.maxtext_sim import (
            HOLD_FILE_ENV,
            STEP_SECONDS_ENV,
        )  # the simulation's knobs

        fields = {
            "uid": uid,
            "project": project,
            "location": location,
            "cluster": cluster["name"],
            "cluster_key": self._cluster_key(cluster),
            "status": "Suspended",
            "condition": None,
            "created": rfc3339(),
            "created_ts": now,
            "completed": None,
            "completed_ts": None,
            "ttl_seconds": ttl,
            "ttl_effective": ttl * scale,
            "restarts": int(parsed.get("restarts")),
            "attempt": 0,
            "command": str(parsed.get("command")),
            "env": env_map("env"),
            "pathways_env": {
                "proxy": env_map("pathways-proxy-env"),
                "server": env_map("pathways-server-env"),
                "worker": env_map("pathways-worker-env"),
            },
            "image": parsed.get("image") or parsed.get("base-image"),
            "compute_type": compute_type,
            "tpu": tpu,
            "cpu_request": 0 if tpu else max(1, cpu_limit(compute_type)) * nodes,
            "service_account": str(parsed.get("service-account") or ""),
            "topology": topology,
            # the pods' --node-constraint labels: the job worker places them on a pool carrying them
            "node_constraint": dict(parsed.get("node-constraint") or {}),
            "num_slices": int(parsed.get("num-slices")),
            "nodes_per_slice": nodes,
            "pathways": pathways,
            "pathways_gcs_location": parsed.get("pathways-gcs-location"),
            "workload_name": f"jobset-{name}-{uid[:5]}",
            "faults": self.env.get(FAULT_ENV, ""),
            "step_seconds": self.env.get(STEP_SECONDS_ENV, ""),
            "hold_file": self.env.get(HOLD_FILE_ENV, ""),
            "pod_hold_file": self.env.get(kube_api.POD_HOLD_ENV, ""),
            "pid": None,
        }
        try:
            job = kube_api.create_jobset(self.layout, cluster, kube_api.DEFAULT_NAMESPACE, manifest, fields)
        except kube_api.KubeError as error:
            raise JobError(f"failed to apply GKE manifest: Error from server: {error}") from None
        kube_api.start_worker(self.layout, job, {**os.environ, **self.env})
        return job

    def _print_links(self, project: str, location: str, cluster: str, name: str, pathways: bool) -> None:
        job_name = f"{name}-pathways-head-0" if pathways else f"{name}-main-job-0"
        self.console.info(
            f"Follow your workload details here: https://console.cloud.google.com/kubernetes/job/{location}/{cluster}/"
            f"default/{job_name}/details?project={project}"
        )
        log_filter = (
            f'resource.type="k8s_container"\nresource.labels.project_id="{project}"\nresource.labels.location="{location}"\n'
            f'resource.labels.cluster_name="{cluster}"\nresource.labels.namespace_name="default"\n'
            f'resource.labels.pod_name:"{job_name}-"\nseverity>=DEFAULT'
        )
        self.console.info(
            "View your workload logs in real-time here: https://console.cloud.google.com/logs/query;query="
            f"{urllib.parse.quote_plus(log_filter)};storageScope=project;duration=P1D?project={project} or use "
            "gcluster job logs [job-name] to view logs using kubectl"
        )

    def _await(self, job: dict[str, Any], timeout: str, project: str, location: str, cluster: str) -> int:
        name = job["name"]
        self.console.info(f"Waiting for job '{name}' to complete...")
        console_link = f"https://console.cloud.google.com/kubernetes/workload/gke/{location}/{cluster}/details/{name}?project={project}"
        self.console.info(f"Waiting for Kueue workload '{job['workload_name']}' to be Finished...")
        try:
            seconds = parse_duration(timeout)
        except GoDurationError as error:
            raise JobError(
                f'error waiting for job completion: error: invalid argument "{timeout}" for "--timeout" flag: {error}\n\n'
            ) from None
        deadline = time.monotonic() + (seconds if seconds >= 0 else 7 * 24 * 3600)
        while True:
            current = self.registry.store.read("jobs").get(job["key"])
            if current is None or current.get("uid") != job["uid"]:
                raise JobError(
                    "error waiting for job completion: Error from server (NotFound): workloads.kueue.x-k8s.io "
                    f'"{job["workload_name"]}" not found\n'
                )
            if current["status"] in FINAL:
                break
            if time.monotonic() >= deadline:
                self.console.error(
                    f"Timed out waiting for job '{name}' to finish. Check its status in the Cloud Console: {console_link}"
                )
                raise JobError("job timed out")
            time.sleep(0.05)
        self.console.info(f"Job '{name}' has finished. Checking final status...")
        condition = job_status_condition(current)
        if condition != "Completed":
            self.console.error(
                f"Job '{name}' finished with status '{condition}'. Check details in the Cloud Console: {console_link}"
            )
            raise JobError(f"job completed unsuccessfully with status: {condition}")
        self.console.info(
            f"Job '{name}' completed successfully. View details in the Cloud Console: {console_link}"
        )
        self.console.info("gcluster job submit workflow completed.")
        return 0


DEFAULT_PROXY_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:latest"
DEFAULT_SERVER_IMAGE = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:latest"
KUEUE_LOCAL_QUEUE = "default-queue"
# pkg/orchestrator/gke/gke_job_orchestrator.go machineFamilyToLabelMap (TPU part)
TPU_ACCELERATOR_LABELS = {
    "ct6e-standard": "tpu-v6e-slice",
    "ct5lp-hightpu": "tpu-v5-lite-podslice",
    "ct5p-hightpu": "tpu-v5p-slice",
    "ct4p-hightpu": "tpu-v4-podslice",
}


def _env_list(values: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"name": key, "value": value} for key, value in values.items()]


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def jobset_manifest(
    *,
    name: str,
    command: str,
    image: str,
    ttl: int,
    max_restarts: int,
    num_slices: int,
    nodes_per_slice: int,
    compute_type: str,
    topology: str,
    env: Mapping[str, str],
    grace_seconds: int,
    pathways: Mapping[str, Any] | None,
    node_constraint: Mapping[str, str] | None = None,
    service_account: str = "",
) -> dict[str, Any]:
    """The JobSet ``gcluster job submit`` applies (cluster-toolkit v1.95.0
    pkg/orchestrator/gke/templates/pathways_jobset.tmpl and jobset.tmpl, rendered).

    A CPU machine type (gke_job_orchestrator.go ``determineIfCPUMachine``) gets a ``cpu`` limit of
    95% of its vCPUs (resource_resolver.go ``calculateResourceLimits``), no accelerator label and
    no host network (``HostNetworkEnabled: isTPU || isGPU``); ``--node-constraint`` pairs join
    the nodeSelector (``buildNodeSelector``), ``--service-account`` is the pods'
    ``serviceAccountName``."""
    family = "-".join(compute_type.split("-")[:2])
    accelerator = TPU_ACCELERATOR_LABELS.get(family, "")
    node_selector = (
        {"cloud.google.com/gke-tpu-accelerator": accelerator, "cloud.google.com/gke-tpu-topology": topology}
        if accelerator
        else {}
    )
    node_selector = {**node_selector, **dict(node_constraint or {})}
    chips = _chips_per_vm(compute_type) if accelerator else 0
    if chips:
        resources: dict[str, Any] = {"resources": {"limits": {"google.com/tpu": str(chips)}}}
    else:
        cpus = cpu_limit(compute_type)
        resources = {"resources": {"limits": {"cpu": str(cpus)}}} if cpus else {}
    labels = {"gcluster.google.com/workload": name, kube_api.QUEUE_NAME_KEY: KUEUE_LOCAL_QUEUE}
    if pathways is None:
        container: dict[str, Any] = {
            "name": "workload-container",
            "image": image,
            "command": ["/bin/bash", "-c", command],
            **resources,
            "env": _env_list(env),
        }
        pod_spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": grace_seconds,
            "restartPolicy": "Never",
            "containers": [container],
        }
        if accelerator:
            pod_spec = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", **pod_spec}
        if node_selector:
            pod_spec["nodeSelector"] = node_selector
        if service_account:
            pod_spec["serviceAccountName"] = service_account
        return {
            "apiVersion": kube_api.JOBSET_API_VERSION,
            "kind": "JobSet",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {
                    "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
                },
            },
            "spec": {
                "ttlSecondsAfterFinished": ttl,
                "failurePolicy": {
                    "maxRestarts": max_restarts,
                    "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
                },
                "replicatedJobs": [
                    {
                        "name": "main-job",
                        "replicas": num_slices,
                        "template": {
                            "spec": {
                                "parallelism": nodes_per_slice,
                                "completions": nodes_per_slice,
                                "backoffLimit": 0,
                                "template": {
                                    "metadata": {"labels": {"gcluster.google.com/workload": name}},
                                    "spec": pod_spec,
                                },
                            }
                        },
                    }
                ],
            },
        }
    gcs = str(pathways["gcs"])
    instance_type = f"{compute_type.split('-')[0]}:{topology}"
    shared_tmp = {"name": "shared-tmp", "hostPath": {"path": "/tmp", "type": "DirectoryOrCreate"}}  # noqa: S108
    head_spec = {
        "nodeSelector": {"cloud.google.com/gke-nodepool": pathways["head_np"]},
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "restartPolicy": "Never",
        "initContainers": [
            {
                "name": "pathways-proxy",
                "image": pathways["proxy_image"],
                "ports": [{"containerPort": 29000}],
                "args": [
                    "--server_port=29000",
                    "--resource_manager_address=$(PATHWAYS_HEAD):29001",
                    f"--gcs_scratch_location={gcs}",
                ],
                "restartPolicy": "Always",
                "resources": {"limits": {"cpu": "16", "memory": "100Gi"}},
                **({"env": _env_list(pathways["proxy_env"])} if pathways["proxy_env"] else {}),
            },
            {
                "name": "pathways-rm",
                "image": pathways["server_image"],
                "ports": [{"containerPort": 29001}, {"containerPort": 29002}],
                "args": [
                    "--server_port=29001",
                    f"--gcs_scratch_location={gcs}",
                    "--node_type=resource_manager",
                    f"--instance_count={num_slices}",
                    f"--instance_type={instance_type}",
                ],
                "env": [
                    _field_env(
                        "REPLICATED_JOB_NAME", "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"
                    ),
                    _field_env("JOBSET_NAME", "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
                    _field_env("HOST_ADDRESS", "metadata.labels['jobset.sigs.k8s.io/coordinator']"),
                    {"name": "TPU_SKIP_MDS_QUERY", "value": "true"},
                    *_env_list(pathways["server_env"]),
                ],
                "restartPolicy": "Always",
                "resources": {"limits": {"cpu": "8", "memory": "32Gi"}},
                "volumeMounts": [{"mountPath": "/tmp", "name": "shared-tmp"}],  # noqa: S108
            },
        ],
        "containers": [
            {
                "name": "workload-container",
                "image": image,
                "command": ["/bin/bash", "-c", command + "\n"],
                **({"env": _env_list(env)} if env else {}),
            }
        ],
        "volumes": [shared_tmp],
    }
    worker_spec: dict[str, Any] = {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": grace_seconds,
        "containers": [
            {
                "name": "pathways-worker",
                "image": pathways["worker_image"],
                "ports": [
                    {"containerPort": 29005},
                    {"containerPort": 29006},
                    {"containerPort": 8471},
                    {"containerPort": 8080},
                ],
                "args": [
                    "--server_port=29005",
                    "--resource_manager_address=$(PATHWAYS_HEAD):29001",
                    f"--gcs_scratch_location={gcs}",
                ],
                "env": [
                    {"name": "XCLOUD_ENVIRONMENT", "value": "GCP"},
                    {"name": "MEGASCALE_GRPC_ENABLE_XOR_TRACER", "value": "false"},
                    _field_env(
                        "MEGASCALE_NUM_SLICES", "metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"
                    ),
                    _field_env("JOBSET_NAME", "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
                    _field_env(
                        "REPLICATED_JOB_NAME", "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"
                    ),
                    _field_env("MEGASCALE_SLICE_ID", "metadata.labels['jobset.sigs.k8s.io/job-index']"),
                    _field_env("PATHWAYS_HEAD", "metadata.labels['jobset.sigs.k8s.io/coordinator']"),
                    _field_env(
                        "MEGASCALE_COORDINATOR_ADDRESS", "metadata.labels['jobset.sigs.k8s.io/coordinator']"
                    ),
                    *_env_list(pathways["worker_env"]),
                ],
                **resources,
                "volumeMounts": [{"name": "shared-tmp", "mountPath": "/tmp"}],  # noqa: S108
            }
        ],
        "volumes": [shared_tmp],
        **({"nodeSelector": node_selector} if node_selector else {}),
    }
    return {
        "apiVersion": kube_api.JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "ttlSecondsAfterFinished": ttl,
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "coordinator": {"replicatedJob": "pathways-head"},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["pathways-head"]},
            "failurePolicy": {
                "maxRestarts": max_restarts,
                "restartStrategy": "Recreate",
                "rules": [{"action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
            },
            "replicatedJobs": [
                {
                    "name": "pathways-head",
                    "replicas": 1,
                    "template": {
                        "metadata": {
                            "annotations": {
                                "alpha.jobset.sigs.k8s.io/exclusive-topology": "kubernetes.io/hostname"
                            }
                        },
                        "spec": {
                            "completionMode": "Indexed",
                            "parallelism": 1,
                            "completions": 1,
                            "backoffLimit": 0,
                            "template": {"spec": head_spec},
                        },
                    },
                },
                {
                    "name": "worker",
                    "replicas": num_slices,
                    "template": {
                        "spec": {
                            "completionMode": "Indexed",
                            "parallelism": nodes_per_slice,
                            "completions": nodes_per_slice,
                            "backoffLimit": nodes_per_slice * 4,
                            "template": {
                                "metadata": {"labels": {"gcluster.google.com/workload": name}},
                                "spec": worker_spec,
                            },
                        }
                    },
                },
            ],
        },
    }


def go_q(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


def _chips_per_vm(machine_type: str) -> int:
    match = re.search(r"-(\d+)t$", machine_type)
    return int(match.group(1)) if match else 1


def _topology_chips(topology: str) -> int:
    total = 1
    for piece in topology.split("x"):
        if piece.isdigit():
            total *= int(piece)
    return total


def _chips(pool: dict[str, Any]) -> int:
    return _topology_chips(str(pool.get("topology") or "1")) * int(pool.get("num_slices") or 1)


def tabwriter(rows: Sequence[tuple[str, ...]], padding: int) -> str:
    """Go's ``text/tabwriter`` (minwidth 0, padchar ' ', flags 0): cells that end with a tab are padded."""
    widths: dict[int, int] = {}
    for row in rows:
        for index, cell in enumerate(row[:-1]):
            widths[index] = max(widths.get(index, 0), len(cell))
    lines = []
    for row in rows:
        cells = [cell + " " * (widths[index] + padding - len(cell)) for index, cell in enumerate(row[:-1])]
        lines.append("".join(cells) + row[-1] + "\n")
    return "".join(lines)


def kill_all_workers(layout: SandboxLayout) -> None:
    """Stop every job worker (``sandbox down``)."""
    for job in StateStore(layout).read("jobs").values():
        stop_worker(job)
