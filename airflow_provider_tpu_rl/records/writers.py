"""Is the job a run directory's claim names still running? Read where it runs; stop it if asked.

A claim (:class:`~airflow_provider_tpu_rl.records.run_dirs.WriterClaim`) names its job and where it
runs. Once the claim expired or its run ended it no longer vouches for the job, yet a crashed
worker (a killed task, an Airflow outage) leaves the job itself running: before another run takes
the directory over, the job's state is read there, through the paths the provider already uses:

* **GKE** (``project/location/cluster``, the JobSet named ``job``): the cluster's endpoint from the
  GKE API (:class:`~airflow_provider_tpu_rl.hooks.kubernetes.GkeClusterHook`), then the JobSet and
  every pod carrying its ``jobset.sigs.k8s.io/jobset-name`` label through the Kubernetes API. The
  job is *gone* when the cluster no longer exists, or when its JobSet is absent or ended and no pod
  of it is left un-ended (a pod being deleted still runs until its grace period ends); *live*
  otherwise. Stopping it deletes the JobSet (foreground: its Jobs and pods first) and waits,
  bounded, until no pod of it is left.
* **VM** (``project/zone/vm``, the stage ``<vm>/<stage>``): the VM's status (``gcloud compute
  instances describe``; gone or stopped: the job is gone), then over SSH (the stage's own path) the
  processes writing the directory: the stages' containers (``docker inspect``: their command lines;
  with runtime ``container`` the conversions run in one too) and any MaxText process (``pgrep -a``).
  Stopping them: ``docker rm --force`` and ``kill -KILL``, then the same probe until none is left.

What cannot be read (permission denied, a network error, an API down) is *unreachable*: the caller
then goes by the directory's own writes (:class:`DirectoryActivity`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from airflow_provider_tpu_rl.exceptions import (
    ClusterNotFoundError,
    CommandError,
    ConfigurationError,
    KubernetesApiError,
    TpuRlError,
)
from airflow_provider_tpu_rl.maxtext.layout import run_dir
from airflow_provider_tpu_rl.records.run_dirs import VM, WriterClaim
from airflow_provider_tpu_rl.render.tpu_vm import STAGE_CONTAINERS
from airflow_provider_tpu_rl.toolchain.job_output import JobState

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
    from airflow_provider_tpu_rl.hooks.kubernetes import JobSetClient

GONE: Final = "gone"
LIVE: Final = "live"
UNREACHABLE: Final = "unreachable"
STOP_POLL_SECONDS = 5.0
LOG_TAIL_LINES = 400  # the trainer's last lines: where it had got to when it was stopped
ENDED_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class WriterState:
    """What was read where a claim's job runs: ``state`` (:data:`GONE`, :data:`LIVE`,
    :data:`UNREACHABLE`), ``detail`` (one line: what was seen there), and for the attempt the job
    made, when known: when its work began (epoch seconds) and the last step its log told."""

    state: str
    detail: str
    started_at: float | None = None
    reached_step: int | None = None

    @property
    def gone(self) -> bool:
        return self.state == GONE

    @property
    def live(self) -> bool:
        return self.state == LIVE


def _first(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


def stop_command(claim: WriterClaim) -> str:
    """How to stop the claim's job by hand, one command: ``gcluster job cancel`` of its JobSet;
    on a VM, the stages' containers removed and MaxText's processes killed over SSH."""
    project, location, place = claim.place or ("PROJECT", "LOCATION", "PLACE")
    if claim.platform == VM:
        containers = " ".join(_CONTAINERS)
        return shlex.join(
            ["gcloud", "compute", "ssh", place, f"--zone={location}", f"--project={project}",
             f"--command=sudo docker rm --force {containers}; sudo pkill -KILL -f '{_PROGRAMS}'"]
        )  # fmt: skip
    from airflow_provider_tpu_rl.render import gke

    return shlex.join(gke.job_cancel(project, place, location, claim.job).argv)


# -------------------------------------------------------------------------------------------- GKE


class JobSetWriter:
    """The JobSet a GKE claim names, read (and deleted) through the GKE and Kubernetes APIs.

    :param claim: the claim (``platform`` ``gke``).
    :param gcp_conn_id: the GCP connection.
    :param impersonation_chain: service account(s) to impersonate.
    :param pathways: the job is a Pathways training (its log is the head pod's ``workload-container``).
    """

    def __init__(
        self,
        claim: WriterClaim,
        gcp_conn_id: str,
        impersonation_chain: str | Sequence[str] | None = None,
        *,
        pathways: bool = True,
    ) -> None:
        if claim.place is None:
            raise ConfigurationError(f"the claim of job {claim.job} names no cluster ({claim.where!r})")
        self.claim = claim
        self.project, self.location, self.cluster = claim.place
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.pathways = pathways

    def state(self) -> WriterState:
        """Gone, live or unreachable, as the cluster says now."""
        return asyncio.run(self._run(stop=False, timeout=0.0, poll=STOP_POLL_SECONDS))

    def stop(self, timeout: float, poll: float = STOP_POLL_SECONDS) -> WriterState:
        """Delete the JobSet and wait until no pod of it is left (at most ``timeout`` seconds):
        gone, or still live (or unreachable) when it could not be seen to end in time."""
        return asyncio.run(self._run(stop=True, timeout=timeout, poll=poll))

    async def _run(self, *, stop: bool, timeout: float, poll: float) -> WriterState:
        from airflow_provider_tpu_rl.hooks.kubernetes import GkeClusterHook, JobSetClient

        hook = GkeClusterHook(self.gcp_conn_id, self.location, self.impersonation_chain)
        try:
            access = await asyncio.to_thread(hook.cluster_access, self.cluster, self.project)
        except ClusterNotFoundError:
            return WriterState(
                GONE, f"cluster {self.cluster} no longer exists in {self.project}/{self.location}"
            )
        except (ConfigurationError, KubernetesApiError) as err:
            return WriterState(UNREACHABLE, f"cluster {self.cluster} cannot be read: {_first(err)}")
        client = JobSetClient(access, self.gcp_conn_id, self.impersonation_chain)
        try:
            seen = await self._look(client)
            if not stop or seen.state != LIVE:
                return seen
            return await self._stop(client, seen, timeout, poll)
        except (ConfigurationError, KubernetesApiError) as err:
            return WriterState(UNREACHABLE, f"the Kubernetes API of cluster {self.cluster}: {_first(err)}")
        finally:
            await client.close()

    async def _look(self, client: JobSetClient, reached: int | None = None) -> WriterState:
        from airflow_provider_tpu_rl.hooks.kubernetes import accelerator_start, jobset_state, rfc3339_seconds

        name = self.claim.job
        async with client.connection() as api:
            found = await client.find(api, name)
            pods = await client.pods_anywhere(api, name)
            if reached is None and found is not None:
                reached = await self._reached_step(client, api, found, pods)
        started = accelerator_start(pods)
        started_at = rfc3339_seconds(started) if started else None
        running = [pod for pod in pods if (pod.get("status") or {}).get("phase") not in ENDED_POD_PHASES]
        state = jobset_state(found)[0] if found is not None else None
        where = f"cluster {self.cluster} ({self.project}/{self.location})"
        if (found is None or state in (JobState.SUCCEEDED, JobState.FAILED)) and not running:
            what = "no longer exists" if found is None else f"has ended ({state.value if state else ''})"
            return WriterState(
                GONE, f"JobSet {name} {what} on {where} and no pod of it is left", started_at, reached
            )
        namespace = str(((found or {}).get("metadata") or {}).get("namespace") or "default")
        shown = f"JobSet {namespace}/{name} is {state.value if state else 'deleted'}"
        return WriterState(
            LIVE, f"{shown} on {where} with {len(running)} pod(s) not ended", started_at, reached
        )

    async def _reached_step(
        self, client: JobSetClient, api: Any, found: Mapping[str, Any], pods: list[dict[str, Any]]
    ) -> int | None:
        """The last step the job's log reports (its last :data:`LOG_TAIL_LINES` lines); None when
        it cannot be read (never fails the look)."""
        from airflow_provider_tpu_rl.hooks.kubernetes import (
            MAIN_JOB,
            PATHWAYS_HEAD_JOB,
            head_pod,
            split_timestamp,
            workload_container,
        )
        from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker

        pod = head_pod(pods, PATHWAYS_HEAD_JOB if self.pathways else MAIN_JOB)
        container = workload_container(pod, self.pathways) if pod is not None else None
        if pod is None or container is None:
            return None
        tracker = TrainingLogTracker()
        metadata = pod.get("metadata") or {}
        try:
            async for line in client.log_lines(
                api,
                str(metadata.get("namespace") or "default"),
                str(metadata.get("name")),
                container,
                since_time=None,
                follow=False,
                tail_lines=LOG_TAIL_LINES,
            ):
                parsed = split_timestamp(line)
                tracker.feed(parsed[1] if parsed else line)
        except TpuRlError:
            return None
        return tracker.last_step

    async def _stop(
        self, client: JobSetClient, seen: WriterState, timeout: float, poll: float
    ) -> WriterState:
        name = self.claim.job
        async with client.connection() as api:
            found = await client.find(api, name)
            if found is not None:
                namespace = str((found.get("metadata") or {}).get("namespace") or "default")
                await client.delete(api, namespace, name)
        began = time.monotonic()
        while True:
            now = await self._look(client, reached=seen.reached_step)
            if now.state != LIVE:
                waited = time.monotonic() - began
                detail = (
                    f"stopped: JobSet {name} deleted and its pods gone after {waited:.0f} s ({now.detail})"
                )
                return WriterState(now.state, detail, seen.started_at, seen.reached_step)
            if time.monotonic() - began >= timeout:
                return WriterState(
                    LIVE,
                    f"JobSet {name} was deleted but did not end within {timeout:.0f} s: {now.detail}",
                    seen.started_at,
                    seen.reached_step,
                )
            await asyncio.sleep(poll)


# --------------------------------------------------------------------------------------------- VM
# MaxText's programs as the VM stages start them (python3 -m ...): the trainer and the converters.
_PROGRAMS: Final = r"maxtext[.](trainers[.]post_train[.]rl[.]train_rl|checkpoint_conversion[.]to_)"
# The stages' containers (train; convert and export with runtime container), in a fixed order.
_CONTAINERS: Final = tuple(dict.fromkeys(STAGE_CONTAINERS[stage] for stage in ("train", "convert", "export")))
# What the probe prints: each stage container (its name, running state and command) and every
# MaxText process (pid and command line). `sudo -n`: never a password prompt; a VM without docker
# skips them.
VM_PROBE_SCRIPT: Final = "\n".join(
    [
        "set -u",
        "if command -v docker >/dev/null 2>&1; then",
        f"  for name in {' '.join(_CONTAINERS)}; do",
        "    if found=$(sudo -n docker inspect --format '{{.State.Running}} {{json .Config.Cmd}}' "
        '"${name}" 2>/dev/null); then',
        '      echo "container ${name} ${found}"',
        "    fi",
        "  done",
        "fi",
        f"pgrep -a -f '{_PROGRAMS}' | sed 's/^/process /' || true",
        "echo probe-done",
        "",
    ]
)
_CONTAINER_LINE = re.compile(r"^container ([a-z0-9-]+) (true|false) (\[.*\])$")
_PROCESS_LINE = re.compile(r"^process ([0-9]+) (.*)$")


@dataclass(frozen=True)
class VmWriters:
    """What a VM's probe found writing a directory: the stages' containers, the processes."""

    containers: tuple[str, ...]
    pids: tuple[int, ...]

    @property
    def any(self) -> bool:
        return bool(self.containers) or bool(self.pids)

    def describe(self) -> str:
        parts = [f"container {name}" for name in self.containers] + [f"process {pid}" for pid in self.pids]
        return ", ".join(parts)


def parse_vm_probe(output: Sequence[str], directory: str) -> VmWriters | None:
    """The probe's lines: what writes ``directory``; None when the probe did not run to its end."""
    from airflow_provider_tpu_rl.hooks.kubernetes import command_run_dir

    wanted = run_dir(directory)
    lines = [line.strip() for line in output]
    if "probe-done" not in lines:
        return None
    containers, pids = [], []
    for line in lines:
        if match := _CONTAINER_LINE.match(line):
            try:
                argv = [str(word) for word in json.loads(match[3])]
            except (ValueError, TypeError):
                continue
            if match[2] == "true" and match[1] in _CONTAINERS and command_run_dir(shlex.join(argv)) == wanted:
                containers.append(match[1])
        elif (match := _PROCESS_LINE.match(line)) and command_run_dir(match[2]) == wanted:
            pids.append(int(match[1]))
    return VmWriters(tuple(containers), tuple(pids))


def vm_stop_script(found: VmWriters) -> str:
    """Stop what the probe found: the containers removed (docker kills their processes), the
    processes killed; then the probe again."""
    lines = ["set -u"]
    if found.containers:
        lines.append(f"sudo -n docker rm --force {' '.join(found.containers)} >/dev/null 2>&1 || true")
    if found.pids:
        lines.append(f"sudo -n kill -KILL {' '.join(str(pid) for pid in found.pids)} 2>/dev/null || true")
    return "\n".join(lines) + "\n" + VM_PROBE_SCRIPT


class VmWriter:
    """The stage a VM claim names, read (and stopped) through gcloud and the VM's SSH.

    :param claim: the claim (``platform`` ``vm``).
    :param hook: the gcluster hook that runs gcloud (its SSH key kept across calls).
    :param directory: the run directory the claim is on.
    """

    def __init__(self, claim: WriterClaim, hook: GclusterHook, directory: str) -> None:
        if claim.place is None:
            raise ConfigurationError(f"the claim of stage {claim.job} names no VM ({claim.where!r})")
        self.claim = claim
        self.project, self.zone, self.vm = claim.place
        self.hook = hook
        self.directory = directory

    def _status(self) -> tuple[str | None, str]:
        """``(status, detail)``: the VM's status, ``DELETED`` when it is gone, None when unread."""
        from airflow_provider_tpu_rl.render import tpu_vm

        command = tpu_vm.describe_vm_status_named(self.project, self.zone, self.vm)
        try:
            described = self.hook.run(command, log_output=False)
        except TpuRlError as err:
            return None, _first(err)
        if not described.ok:
            if any(marker in described.output for marker in tpu_vm.VM_GONE):
                return "DELETED", "gone"
            return None, (described.output_lines[-1:] or ["gcloud failed"])[0]
        status = (described.output.strip().splitlines()[-1:] or [""])[0]
        return status, status

    def _ssh(self, script: str) -> VmWriters | None:
        from airflow_provider_tpu_rl.render import tpu_vm

        command = tpu_vm.ssh_named(
            self.project, self.zone, self.vm, script, "look for the job writing a run directory",
            ssh_key_file=str(self.hook.ssh_key_file()),
        )  # fmt: skip
        try:
            # a refused probe is not waited for: it answers unknown, so nothing is taken over
            result = self.hook.run(command, log_output=False, timeout=600, wait_for_sshd=False)
        except (CommandError, ConfigurationError):
            return None
        return parse_vm_probe(result.output_lines, self.directory) if result.ok else None

    def state(self) -> WriterState:
        where = f"VM {self.vm} ({self.project}/{self.zone})"
        status, detail = self._status()
        if status in ("DELETED", "TERMINATED", "SUSPENDED"):
            return WriterState(GONE, f"{where} is {'gone' if status == 'DELETED' else status}")
        if status != "RUNNING":
            return WriterState(UNREACHABLE, f"{where} cannot be read ({detail})")
        found = self._ssh(VM_PROBE_SCRIPT)
        if found is None:
            return WriterState(UNREACHABLE, f"{where} is RUNNING but its SSH probe did not answer")
        if not found.any:
            return WriterState(GONE, f"nothing writes {self.directory} on {where}")
        return WriterState(LIVE, f"{found.describe()} on {where} writes {self.directory}")

    def stop(self, timeout: float, poll: float = STOP_POLL_SECONDS) -> WriterState:
        """Stop what writes the directory on the VM and probe until nothing does (at most
        ``timeout`` seconds): gone, or still live (or unreachable)."""
        seen = self.state()
        if not seen.live:
            return seen
        where = f"VM {self.vm} ({self.project}/{self.zone})"
        began = time.monotonic()
        found = self._ssh(VM_PROBE_SCRIPT)
        while True:
            if found is None:
                return WriterState(UNREACHABLE, f"{where}: its SSH probe did not answer")
            if not found.any:
                waited = time.monotonic() - began
                return WriterState(
                    GONE, f"stopped: nothing writes {self.directory} on {where} after {waited:.0f} s"
                )
            if time.monotonic() - began >= timeout:
                return WriterState(LIVE, f"{found.describe()} on {where} did not end within {timeout:.0f} s")
            found = self._ssh(vm_stop_script(found))  # stops them, then probes again
            if found is not None and found.any:
                time.sleep(poll)


# -------------------------------------------------------------------------------- the directory
_STEP_DIR = re.compile(r"/checkpoints/actor/([0-9]+)/")


@dataclass(frozen=True)
class DirectoryActivity:
    """When a run directory was last written, and how long apart its newest checkpoints landed."""

    newest: float | None  # epoch seconds of the newest object's last write; None: empty
    period: float | None  # the largest gap between two consecutive committed steps; None: < 2 steps
    objects: int

    def quiet_for(self, now: float | None = None) -> float | None:
        """Seconds since the last write (None when nothing was ever written)."""
        return None if self.newest is None else max(0.0, (time.time() if now is None else now) - self.newest)


def directory_activity(writes: Sequence[tuple[str, float]]) -> DirectoryActivity:
    """From ``(object name, last write in epoch seconds)`` of every object under a run directory."""
    if not writes:
        return DirectoryActivity(None, None, 0)
    steps: dict[int, float] = {}
    for name, when in writes:
        match = _STEP_DIR.search("/" + name)
        if match:
            step = int(match[1])
            steps[step] = max(steps.get(step, when), when)
    times = [steps[step] for step in sorted(steps)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    return DirectoryActivity(max(when for _, when in writes), max(gaps) if gaps else None, len(writes))


def read_directory_activity(
    gcp_conn_id: str, directory: str, impersonation_chain: str | Sequence[str] | None = None
) -> DirectoryActivity:
    """List every object under ``directory`` (its last write times) through the google provider."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
    from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

    bucket, prefix = parse_gs_uri(run_dir(directory))
    client = gcs_hook(gcp_conn_id, impersonation_chain).get_conn()
    writes = []
    for blob in client.bucket(bucket).list_blobs(prefix=prefix, timeout=60):
        updated = blob.updated
        if isinstance(updated, datetime):
            writes.append((str(blob.name), updated.timestamp()))
    return directory_activity(writes)
