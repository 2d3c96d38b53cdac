"""Detached process that plays one submitted job: Kueue admission, the pods, the program.

Started by ``gcluster job submit`` (or a ``POST`` of a JobSet to the fake Kubernetes API) as
``python -m tpu_rl_sandbox.machines.job_worker ROOT JOB_KEY UID`` in its own session. It stands for Kueue,
the JobSet and Job controllers and the kubelet: the JobSet stays suspended until Kueue admits it
(the cluster's TPU slices are free), then its pods are created (:func:`~tpu_rl_sandbox.apis.kube_api.plan_pods`), their
containers go waiting -> running -> terminated (Pathways: the ``pathways-proxy`` and
``pathways-rm`` sidecars and the workers first, then ``workload-container``), and the JobSet ends
Completed or Failed. A failed attempt is retried ``maxRestarts`` times like a JobSet restart: new
pods (``jobset.sigs.k8s.io/restart-attempt`` + 1), a fresh pod file system and fresh logs.

The program (the workload container's command) runs as ``/bin/bash -c COMMAND`` on a
:class:`~hosts.PodHost` (real bash in private namespaces, see :mod:`tpu_rl_sandbox.machines.machine`); its
output becomes the container's CRI log (one timestamp per line, as the API serves it with
``timestamps=true``) and, as before, ``jobs/<uid>/attempt-N.log``. The sidecars and workers print
a few plausible lines. A cancelled job's pods are killed.
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis import kube_api
from tpu_rl_sandbox.apis.gcs_emulator import api_for
from tpu_rl_sandbox.machines.fsview import GcsStore
from tpu_rl_sandbox.machines.hosts import MachineServices, PodHost, tpu_chips_of
from tpu_rl_sandbox.machines.maxtext_sim import DEFAULT_STEP_SECONDS
from tpu_rl_sandbox.world import compute_classes, iam, secret_values
from tpu_rl_sandbox.world.faults import FaultGate, claim_preemption, parse_faults
from tpu_rl_sandbox.world.gke_nodes import matching_tpu_pool as matching_tpu_pool
from tpu_rl_sandbox.world.gke_nodes import pool_node_labels as pool_node_labels
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.registry import Copies, ar_repository, digest_of
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import PULL, STREAM_PULL, stage_real_minutes
from tpu_rl_sandbox.world.timestamps import rfc3339


class JobGone(Exception):
    """The JobSet was deleted (cancelled, cluster destroyed, garbage-collected)."""


# The role image streaming needs for a node pool's custom service account, in the project that hosts
# the image (GKE's image-streaming page, "Requirements"; states); the blueprint's service-account
# module lists roles without "roles/".
STREAMING_ROLE = "serviceusage.serviceUsageConsumer"
STREAMING_API = "containerfilesystem.googleapis.com"


def pull_kind(
    pool: dict[str, Any],
    cluster: dict[str, Any],
    image: str,
    copies: Copies,
    disabled_services: tuple[str, ...] = (),
) -> tuple[bool, str]:
    """``(streamed, why)``: does the TPU pool stream ``image``? GKE's image-streaming page,
    "Requirements" (states): the Container File System API enabled, the image in an Artifact
    Registry repository, and a custom node account (the blueprint's ``gke-np-sa``) with Service
    Usage Consumer in the project hosting the image; the pool's nodes on COS with containerd (the
    toolkit's gke-node-pool ``image_type``, default ``COS_CONTAINERD``: variables.tf l.119-122 at v1.95.0).
    The account holds its roles in the cluster's own project only (the service-account module's
    ``project_roles``), so only an image in that project's Artifact Registry can be streamed.
    Otherwise the image is pulled whole: the page's "Limitations" say of images it cannot stream
    (those with duplicate layers) that GKE "downloads these images" without streaming; the
    sandbox takes that as what GKE does with any image it cannot stream (an inference)."""
    if not pool.get("enable_gcfs"):
        return False, "the TPU node pool has no image streaming (enable_gcfs off)"
    project = str(cluster.get("project") or "")
    if pool.get("image_type", "COS_CONTAINERD") != "COS_CONTAINERD":
        return False, f"the TPU node pool's nodes are {pool.get('image_type')}, not COS_CONTAINERD"
    if STREAMING_API in disabled_services:
        return False, f"the Container File System API is disabled in {project}"
    where = ar_repository(image)
    if where is None or where[0] != project:
        return False, f"{image} is not in an Artifact Registry repository of {project}"
    roles = {str(role).removeprefix("roles/") for role in cluster.get("node_pool_roles") or []}
    if STREAMING_ROLE not in roles:
        return False, f"the node pool's service account lacks roles/{STREAMING_ROLE} in {project}"
    if digest_of(image, copies) is None:
        return False, f"{image} is not in its repository"
    return True, f"streamed from {where[2]} in {project}"


class Worker:
    """Runs one job."""

    def __init__(self, layout: SandboxLayout, key: str, uid: str) -> None:
        self.layout = layout
        self.store = StateStore(layout)
        self.key = key
        self.uid = uid
        self._last_check = 0.0
        self._gone = False

    def job(self) -> dict[str, Any]:
        job = self.store.read("jobs").get(self.key)
        if job is None or job.get("uid") != self.uid:
            raise JobGone()
        return job

    def update(self, **changes: Any) -> dict[str, Any]:
        with self.store.txn() as txn:
            jobs = txn.doc("jobs")
            job = jobs.get(self.key)
            if job is None or job.get("uid") != self.uid:
                raise JobGone()
            job.update(changes)
            txn.save("jobs")
            return dict(job)

    def cancelled(self) -> bool:
        now = time.monotonic()
        if self._gone:
            return True
        if now - self._last_check < 0.2:
            return False
        self._last_check = now
        try:
            self.job()
        except JobGone:
            self._gone = True
        return self._gone

    # -- phases ---------------------------------------------------------------------------
    def wait_for_admission(self, job: dict[str, Any], step: float) -> None:
        """Kueue: a TPU job waits until the cluster has enough free slices (FIFO), and for ever
        when the installed Kueue's queue covers no ``google.com/tpu``; a CPU job until
        the ClusterQueue's cpu quota has room, and for ever when the queue covers no ``cpu`` (Kueue
        admits a workload only when every resource it requests is covered: "resource cpu
        unavailable in ClusterQueue"). With the settings' ``kueue_admits`` off, nothing is admitted;
        a JobSet created suspended without a queue label never is (Kueue ignores it)."""
        time.sleep(max(step * 2, 0.02))
        while job.get("held_by_user"):
            time.sleep(0.5)
            job = self.job()  # raises JobGone once the JobSet is deleted
        while True:
            if not load_settings(self.layout).kueue_admits:
                self.job()  # raises JobGone once the JobSet is deleted
                time.sleep(0.05)
                continue
            with self.store.txn() as txn:
                jobs = txn.doc("jobs")
                me = jobs.get(self.key)
                if me is None or me.get("uid") != self.uid:
                    raise JobGone()
                cluster = txn.doc("clusters").get(me["cluster_key"], {})
                if not me.get("tpu"):
                    if self._cpu_fits(me, jobs, cluster) and has_matching_nodes(cluster, me):
                        return
                    time.sleep(0.05)
                    continue
                queue = cluster.get("kueue") or {}
                if queue.get("installed") and "google.com/tpu" not in (queue.get("covered") or []):
                    time.sleep(0.05)  # no ClusterQueue quota for TPUs: never admitted
                    continue
                if cluster.get("made_outside"):
                    scale_up_for_compute_class(txn, me, cluster, load_settings(self.layout))
                    if existing_cluster_tpu_fits(me, jobs, cluster):
                        return
                    time.sleep(0.05)
                    continue
                quota = int(cluster.get("num_slices") or 0)
                same_cluster = [
                    j for j in jobs.values() if j.get("cluster_key") == me["cluster_key"] and j.get("tpu")
                ]
                running = sum(
                    int(j.get("num_slices", 1)) for j in same_cluster if j.get("status") == "Running"
                )
                earlier_waiting = [j for j in same_cluster if self._queued_before(j, me)]
                if not earlier_waiting and running + int(me.get("num_slices", 1)) <= quota:
                    return
            time.sleep(0.05)

    def _queued_before(self, other: dict[str, Any], me: dict[str, Any]) -> bool:
        """``other`` waits in Kueue's queue ahead of this job (FIFO): suspended, created earlier,
        and a Kueue workload (a JobSet held by its creator, with no queue label, is in no queue)."""
        return (
            other.get("status") == "Suspended"
            and not other.get("held_by_user")
            and other["created_ts"] < me["created_ts"]
            and other["uid"] != self.uid
        )

    def _cpu_fits(self, me: dict[str, Any], jobs: dict[str, Any], cluster: dict[str, Any]) -> bool:
        wanted = int(me.get("cpu_request") or 0)
        if not wanted:
            return True
        queue = cluster.get("kueue") or {}
        if "cpu" not in (queue.get("covered") or []):
            return False
        try:
            quota = float(str((queue.get("quota") or {}).get("cpu")))
        except ValueError:
            return False
        same_cluster = [
            j for j in jobs.values() if j.get("cluster_key") == me["cluster_key"] and not j.get("tpu")
        ]
        used = sum(int(j.get("cpu_request") or 0) for j in same_cluster if j.get("status") == "Running")
        earlier = [j for j in same_cluster if self._queued_before(j, me)]
        return not earlier and used + wanted <= quota

    def update_pods(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply ``change`` to each current pod record (one transaction)."""
        with self.store.txn() as txn:
            jobs = txn.doc("jobs")
            job = jobs.get(self.key)
            if job is None or job.get("uid") != self.uid:
                raise JobGone()
            for pod in job.get("pods") or []:
                change(pod)
            txn.save("jobs")
            return dict(job)

    def run(self) -> int:
        job = self.job()
        try:
            step = float(job.get("step_seconds") or DEFAULT_STEP_SECONDS)
        except ValueError:
            step = DEFAULT_STEP_SECONDS
        self.wait_for_admission(job, step)
        # Kueue admits the workload: spec.suspend becomes false
        job = self.update(suspended=False, admitted=rfc3339())
        attempts = int(job.get("restarts", 1)) + 1
        faults = FaultGate(self.store, parse_faults(job.get("faults")))
        cluster = self.store.read("clusters").get(job["cluster_key"], {})
        identity, account = iam.pod_identity(cluster, job, matching_tpu_pool(cluster, job))
        for attempt in range(1, attempts + 1):
            # a (re)start: the JobSet controller recreates every Job, the Job controller their pods
            job = self.update(
                status="Running",
                attempt=attempt,
                started=rfc3339(),
                pods=kube_api.plan_pods(job, attempt - 1),
            )
            status = self.run_attempt(job, attempt, step, faults, cluster, identity, account)
            if status == 0:
                self.update(
                    status="Succeeded", condition="Completed", completed=rfc3339(), completed_ts=time.time()
                )
                return 0
        self.update(status="Failed", condition="Failed", completed=rfc3339(), completed_ts=time.time())
        return 0

    def _main_pod(self, job: dict[str, Any]) -> dict[str, Any]:
        head = str((job.get("workload") or {}).get("replicatedJob") or "")
        pods = job.get("pods") or []
        return next(
            (p for p in pods if p["replicatedJob"] == head and p["jobIndex"] == 0 and p["podIndex"] == 0),
            pods[0],
        )

    def _log(self, pod: dict[str, Any], container: str) -> kube_api.CriLog:
        return kube_api.CriLog(
            kube_api.container_log_path(self.layout, self.uid, str(pod["name"]), container)
        )

    def _print(self, pod: dict[str, Any], container: str, lines: list[str]) -> None:
        log = self._log(pod, container)
        for line in lines:
            log.line(line, stream="stderr")
        log.close()

    def start_pods(self, job: dict[str, Any], main: dict[str, Any], step: float) -> None:
        """Everything but the workload container starts: sidecars (in order), workers, other pods."""
        hold = job.get("pod_hold_file")
        while hold and _held(Path(str(hold)), job):  # nodes / images not ready yet: containers wait
            if self.cancelled():
                raise JobGone()
            time.sleep(0.05)
        self.pull_image(job)
        coordinator = f"{job['name']}-pathways-head-0-0.{job['name']}"
        workload = _workload_name(job)
        instance = f"{str(job.get('compute_type') or 'tpu').split('-')[0]}:{job.get('topology') or ''}"
        workers = sum(1 for p in job.get("pods") or [] if p["replicatedJob"] == "worker")
        started = rfc3339()
        for pod in job.get("pods") or []:
            for container in pod.get("init") or []:
                if container["name"] == "pathways-proxy":
                    self._print(
                        pod,
                        container["name"],
                        [
                            glog("proxy_server_main.cc", 112, "Starting Pathways proxy server on port 29000"),
                            glog(
                                "proxy_server.cc",
                                431,
                                f"Connecting to resource manager at {coordinator}:29001",
                            ),
                        ],
                    )
                elif container["name"] == "pathways-rm":
                    self._print(
                        pod,
                        container["name"],
                        [
                            glog("server_main.cc", 98, "Starting Pathways resource manager on port 29001"),
                            glog(
                                "resource_manager.cc",
                                254,
                                f"Waiting for {workers} workers (instance_type={instance}, "
                                f"instance_count={job.get('num_slices', 1)})",
                            ),
                        ],
                    )
            for container in pod.get("containers") or []:
                if pod["name"] == main["name"] and container["name"] == workload:
                    continue
                if container["name"] == "pathways-worker":
                    self._print(
                        pod,
                        container["name"],
                        [
                            glog("server_main.cc", 98, "Starting Pathways worker on port 29005"),
                            glog(
                                "worker.cc",
                                187,
                                f"Registered with resource manager {coordinator}:29001 "
                                f"(slice {pod['jobIndex']}, task {pod['podIndex']})",
                            ),
                        ],
                    )
                else:
                    self._log(pod, container["name"]).close()

        def begin(pod: dict[str, Any]) -> None:
            pod["startTime"] = started
            pod["phase"] = "Running"
            for container in pod.get("init") or []:
                container.update(state="running", startedAt=started, reason=None)
            for container in pod.get("containers") or []:
                if pod["name"] == main["name"] and container["name"] == workload:
                    continue
                container.update(state="running", startedAt=started, reason=None)

        self.update_pods(begin)
        time.sleep(max(step, 0.01))

    def pull_image(self, job: dict[str, Any]) -> None:
        """The kubelet pulls the workload image on the TPU pool's nodes before their containers
        start (they stay ContainerCreating meanwhile), once per pool (a tag other than ``latest``
        defaults to ``imagePullPolicy: IfNotPresent``: a later pod on the same nodes finds it
        there; a pool deployed again has new nodes): the whole image
        (:data:`~tpu_rl_sandbox.world.timescale.PULL_MINUTES` on the time scale), or, where the pool
        streams it (:func:`pull_kind`), the streamed estimate
        (:data:`~tpu_rl_sandbox.world.timescale.STREAMED_PULL_MINUTES`). Each pull is noted in the
        state document ``image_pulls`` (what the bench reports)."""
        image = str(job.get("image") or "")
        if not job.get("tpu") or not image:
            return
        pool = self._tpu_pool(job) or {}
        if image in pool.get("pulled_images", []):
            return
        cluster = self.store.read("clusters").get(job["cluster_key"]) or {}
        settings = load_settings(self.layout)
        copies = self.store.read("registry").get("images") or {}
        streamed, reason = pull_kind(pool, cluster, image, copies, settings.disabled_services)
        stage = STREAM_PULL if streamed else PULL
        minutes = stage_real_minutes(stage, overrides=settings.stage_minutes) or 0.0
        deadline = time.monotonic() + minutes * settings.minute_seconds
        while time.monotonic() < deadline:
            if self.cancelled():
                raise JobGone()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        with self.store.txn() as txn:
            record = txn.doc("clusters").get(job["cluster_key"]) or {}
            pulled = matching_tpu_pool(record, job)
            if pulled is not None and image not in pulled.setdefault("pulled_images", []):
                pulled["pulled_images"].append(image)
                txn.save("clusters")
            txn.doc("image_pulls").setdefault("pulls", []).append(
                {
                    "job": job.get("name"),
                    "uid": self.uid,
                    "cluster_key": job["cluster_key"],
                    "pool": pool.get("name"),
                    "enable_gcfs": bool(pool.get("enable_gcfs")),
                    "image": image,
                    "streamed": streamed,
                    "reason": reason,
                    "stage": stage,
                    "real_minutes": minutes,
                    "ts": time.time(),
                }
            )
            txn.save("image_pulls")

    def _tpu_pool(self, job: dict[str, Any]) -> dict[str, Any] | None:
        cluster = self.store.read("clusters").get(job["cluster_key"]) or {}
        return matching_tpu_pool(cluster, job)

    def finish_pods(self, job: dict[str, Any], main: dict[str, Any], status: int) -> None:
        """The workload container ended: the sidecars stop, the workers end with the JobSet."""
        finished = rfc3339()
        for pod in job.get("pods") or []:
            for container in pod.get("init") or []:
                self._print(
                    pod, container["name"], [glog("server_main.cc", 140, "Received SIGTERM, shutting down")]
                )
            if pod["name"] != main["name"]:
                for container in pod.get("containers") or []:
                    if container["name"] == "pathways-worker":
                        self._print(
                            pod,
                            container["name"],
                            [glog("worker.cc", 402, "Resource manager closed; exiting")],
                        )
        ok = status == 0

        def end(pod: dict[str, Any]) -> None:
            for container in pod.get("init") or []:
                container.update(state="terminated", exitCode=0, reason="Completed", finishedAt=finished)
            for container in pod.get("containers") or []:
                code = status if pod["name"] == main["name"] else (0 if ok else 143)
                container.update(
                    state="terminated",
                    exitCode=code,
                    reason="Completed" if code == 0 else "Error",
                    startedAt=container.get("startedAt") or finished,
                    finishedAt=finished,
                )
            failed = any(c.get("exitCode") for c in pod.get("containers") or [])
            pod["phase"] = "Failed" if failed else "Succeeded"

        self.update_pods(end)

    def run_attempt(
        self,
        job: dict[str, Any],
        attempt: int,
        step: float,
        faults: FaultGate,
        cluster: dict[str, Any],
        identity: str,
        account: str | None,
    ) -> int:
        log_path = self.layout.jobs_dir / self.uid / f"attempt-{attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        main = self._main_pod(job)
        self.start_pods(job, main, step)
        store = self.store
        services = MachineServices(
            gcs=GcsStore(
                api_for(self.layout),
                identity=identity,
                can_write=lambda bucket: iam.identity_can_write(store, cluster, account, identity, bucket),
            ),
            # the pod reads as its own identity: it needs the grant, in effect
            secret_access=lambda p, s, v: secret_values.pod_secret_value(store, identity, p, s, v),
            fault=faults.fire,
            seed=f"{job['key']}",
            step_seconds=step,
            minute_seconds=load_settings(self.layout).minute_seconds,
            stage_minutes=dict(load_settings(self.layout).stage_minutes),
            hold_seconds=load_settings(self.layout).hold_seconds,
            hold_file=job.get("hold_file") or None,
            cancelled=self.cancelled,
            default_project=str(job["project"]),
            preempt=self.preempt,
            workload_identity_effective=lambda: load_settings(self.layout).workload_identity_effective,
        )
        pod_root = self.layout.jobs_dir / self.uid / f"pod-{attempt}"
        host = PodHost(Path(pod_root), services, str(job["name"]), tpu_chips=_pod_tpu_chips(job))
        env = host.base_env()
        env.update(
            {
                "JOB_COMPLETION_INDEX": "0",
                "JOBSET_NAME": str(job["name"]),
                "REPLICATED_JOB_NAME": "pathways-head" if job.get("pathways") else "main-job",
                "TPU_STDERR_LOG_LEVEL": "0",
                "TPU_MIN_LOG_LEVEL": "0",
                "TF_CPP_MIN_LOG_LEVEL": "0",
            }
        )
        env.update(job.get("env") or {})
        output = kube_api.CriLog(
            kube_api.container_log_path(self.layout, self.uid, str(main["name"]), _workload_name(job)),
            log_path,
        )
        started = rfc3339()

        def run_main(pod: dict[str, Any]) -> None:
            if pod["name"] == main["name"]:
                for container in pod.get("containers") or []:
                    if container["name"] == _workload_name(job):
                        container.update(state="running", startedAt=started, reason=None)

        self.update_pods(run_main)
        try:
            # The container runs COMMAND with bash -c (pathways_jobset.tmpl / jobset.tmpl).
            status = host.run(
                ["/bin/bash", "-c", str(job["command"])], None, output.write, output.write, env, host.workdir
            )
        finally:
            output.close()
        if self.cancelled():
            raise JobGone()
        if host.preempted:
            self.lose_nodes()
            return 137
        self.finish_pods(self.job(), main, status)
        return status

    def preempt(self, run_dir: str, committed: int, past: int) -> bool:
        """Whether the nodes go now (:func:`~tpu_rl_sandbox.world.faults.claim_preemption`)."""
        wanted = load_settings(self.layout).preemption
        return claim_preemption(self.store, wanted, run_dir, committed, past, self.key, rfc3339())

    def lose_nodes(self) -> None:
        """The job's nodes shut down (preemption, maintenance): the kubelet's node-shutdown manager
        fails every pod with reason ``Terminated``, its message and a ``DisruptionTarget``
        condition of reason ``TerminationByKubelet`` (kubernetes pkg/kubelet/nodeshutdown)."""
        at = rfc3339()

        def lost(pod: dict[str, Any]) -> None:
            for container in [*(pod.get("init") or []), *(pod.get("containers") or [])]:
                container.update(
                    state="terminated",
                    exitCode=137,
                    reason="Error",
                    startedAt=container.get("startedAt") or at,
                    finishedAt=at,
                )
            pod.update(phase="Failed", disrupted=at)

        self.update_pods(lost)


def has_matching_nodes(cluster: dict[str, Any], job: dict[str, Any]) -> bool:
    """Whether a CPU job's pods can be placed on a cluster made outside the provider: some pool's
    nodes carry every label of its nodeSelector (``--node-constraint``, e.g. the pool's
    ``cloud.google.com/gke-nodepool``); none: they stay Pending, as the kube-scheduler leaves a pod
    no node matches (Kubernetes, "Assigning Pods to Nodes", nodeSelector; direct). A toolkit
    cluster's jobs are placed as before."""
    if not cluster.get("made_outside"):
        return True
    wanted = dict(job.get("node_constraint") or {})
    return any(
        all(pool_node_labels(pool).get(key) == value for key, value in wanted.items())
        for pool in cluster.get("node_pools", [])
        if not pool.get("failed")
    )


def scale_up_for_compute_class(
    txn: Any, me: dict[str, Any], cluster: dict[str, Any], settings: Any
) -> dict[str, Any] | None:
    """A TPU job selecting a ComputeClass (``cloud.google.com/compute-class``) no pool of which it
    matches: GKE's choice among the class's priorities (world/compute_classes.py ``scale_up``), as
    for any pending pod; the pool made, or None."""
    wanted = (me.get("node_constraint") or {}).get(compute_classes.CLASS_LABEL)
    klass = txn.doc(compute_classes.DOC).get(f"{me['cluster_key']}/{wanted}") if wanted else None
    if klass is None or matching_tpu_pool(cluster, me) is not None:
        return None
    pool, _ = compute_classes.scale_up(txn, me["cluster_key"], cluster, klass, settings, time.time())
    return pool


def existing_cluster_tpu_fits(me: dict[str, Any], jobs: dict[str, Any], cluster: dict[str, Any]) -> bool:
    """A TPU job on a cluster made outside the provider runs once a pool its nodeSelector names
    is free: pools are per run there, so the check is per pool, not the cluster's slice count.
    A pool runs one JobSet at a time (its TPU workers' ``alpha.jobset.sigs.k8s.io/exclusive-topology:
    cloud.google.com/gke-nodepool``: one job per node pool, cluster-toolkit v1.95.0
    gke_job_orchestrator.go ``exclusiveTopology``); earlier jobs waiting for the same pool go first
    (FIFO)."""
    pool = matching_tpu_pool(cluster, me)
    if pool is None:
        return False  # no node matches: the pods stay Pending
    same_pool = [
        j
        for j in jobs.values()
        if j.get("cluster_key") == me["cluster_key"]
        and j.get("tpu")
        and j["uid"] != me["uid"]
        and (matching_tpu_pool(cluster, j) or {}).get("name") == pool.get("name")
    ]
    busy = any(j.get("status") == "Running" for j in same_pool)
    earlier = any(j.get("status") == "Suspended" and j["created_ts"] < me["created_ts"] for j in same_pool)
    return not busy and not earlier


def _held(hold: Path, job: dict[str, Any]) -> bool:
    """Whether ``job``'s pods wait on the hold file (:data:`~tpu_rl_sandbox.apis.kube_api.POD_HOLD_ENV`)."""
    try:
        scope = hold.read_text().strip()
    except OSError:  # no file: nothing is held
        return False
    return scope != kube_api.POD_HOLD_TPU_ONLY or bool(job.get("tpu"))


def _pod_tpu_chips(job: dict[str, Any]) -> int | None:
    """The TPU chips the main container sees: none on a CPU node pool, the node's own on a TPU
    slice; not modelled for a Pathways head (its JAX reaches the slice through the proxy)."""
    if job.get("pathways"):
        return None
    return tpu_chips_of(str(job.get("compute_type") or "")) if job.get("tpu") else 0


def _workload_name(job: dict[str, Any]) -> str:
    return str((job.get("workload") or {}).get("container") or "workload-container")


def glog(source: str, line: int, message: str) -> str:
    """A line in glog's format (``I1201 13:22:10.123456       1 file.cc:12] message``)."""
    now = dt.datetime.now(dt.UTC)
    return f"I{now:%m%d %H:%M:%S}.{now.microsecond:06d}       1 {source}:{line}] {message}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        sys.stderr.write("usage: job_worker ROOT JOB_KEY UID\n")
        return 2
    layout = SandboxLayout(Path(args[0]))
    worker = Worker(layout, args[1], args[2])
    # SystemExit unwinds through Machine.run, which kills the pod's processes.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        return worker.run()
    except JobGone:
        return 0


if __name__ == "__main__":
    sys.exit(main())
