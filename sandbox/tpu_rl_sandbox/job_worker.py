"""Detached process that plays one submitted job: Kueue admission, the pods, the program.

Started by ``gcluster job submit`` as
``python -m tpu_rl_sandbox.job_worker ROOT JOB_KEY UID`` in its own session.
Status goes Suspended (until Kueue admits it: the cluster's TPU slices are free) -> Running ->
Succeeded/Failed; a failed attempt is retried ``--restarts`` times like a JobSet restart
(each attempt gets a fresh pod file system and a fresh log, as ``kubectl logs`` would show).
The container's command runs as ``/bin/bash -c COMMAND`` on a :class:`~hosts.PodHost` (real bash
in private namespaces, see :mod:`tpu_rl_sandbox.machine`); a cancelled job's pod is killed.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from tpu_rl_sandbox import cloud
from tpu_rl_sandbox.emulator import api_for
from tpu_rl_sandbox.fsview import GcsStore
from tpu_rl_sandbox.hosts import MachineServices, PodHost
from tpu_rl_sandbox.layout import SandboxLayout, rfc3339
from tpu_rl_sandbox.maxtext_sim import DEFAULT_STEP_SECONDS
from tpu_rl_sandbox.state import FaultGate, StateStore, parse_faults


class JobGone(Exception):
    """The JobSet was deleted (cancelled, cluster destroyed, garbage-collected)."""


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
        """Kueue: a TPU job waits until the cluster has enough free slices (FIFO)."""
        time.sleep(max(step * 2, 0.02))
        while True:
            with self.store.txn() as txn:
                jobs = txn.doc("jobs")
                me = jobs.get(self.key)
                if me is None or me.get("uid") != self.uid:
                    raise JobGone()
                if not me.get("tpu"):
                    return
                cluster = txn.doc("clusters").get(me["cluster_key"], {})
                quota = int(cluster.get("num_slices") or 0)
                same_cluster = [
                    j for j in jobs.values() if j.get("cluster_key") == me["cluster_key"] and j.get("tpu")
                ]
                running = sum(
                    int(j.get("num_slices", 1)) for j in same_cluster if j.get("status") == "Running"
                )
                earlier_waiting = [
                    j
                    for j in same_cluster
                    if j.get("status") == "Suspended"
                    and j["created_ts"] < me["created_ts"]
                    and j["uid"] != self.uid
                ]
                if not earlier_waiting and running + int(me.get("num_slices", 1)) <= quota:
                    return
            time.sleep(0.05)

    def run(self) -> int:
        job = self.job()
        try:
            step = float(job.get("step_seconds") or DEFAULT_STEP_SECONDS)
        except ValueError:
            step = DEFAULT_STEP_SECONDS
        self.wait_for_admission(job, step)
        attempts = int(job.get("restarts", 1)) + 1
        faults = FaultGate(self.store, parse_faults(job.get("faults")))
        cluster = self.store.read("clusters").get(job["cluster_key"], {})
        node_sa = cluster.get("service_accounts", {}).get("node_pool", "")
        for attempt in range(1, attempts + 1):
            job = self.update(status="Running", attempt=attempt, started=rfc3339())
            status = self.run_attempt(job, attempt, step, faults, cluster, node_sa)
            if status == 0:
                self.update(
                    status="Succeeded", condition="Completed", completed=rfc3339(), completed_ts=time.time()
                )
                return 0
        self.update(status="Failed", condition="Failed", completed=rfc3339(), completed_ts=time.time())
        return 0

    def run_attempt(
        self,
        job: dict[str, Any],
        attempt: int,
        step: float,
        faults: FaultGate,
        cluster: dict[str, Any],
        node_sa: str,
    ) -> int:
        log_path = self.layout.jobs_dir / self.uid / f"attempt-{attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        store = self.store
        services = MachineServices(
            gcs=GcsStore(
                api_for(self.layout),
                identity=node_sa,
                can_write=lambda bucket: cloud.node_pool_can_write(store, cluster),
            ),
            secret_access=lambda p, s, v: cloud.secret_value(store, p, s, v),
            fault=faults.fire,
            seed=f"{job['key']}",
            step_seconds=step,
            hold_file=job.get("hold_file") or None,
            cancelled=self.cancelled,
            default_project=str(job["project"]),
        )
        pod_root = self.layout.jobs_dir / self.uid / f"pod-{attempt}"
        host = PodHost(Path(pod_root), services, str(job["name"]))
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
        with log_path.open("ab") as handle:
            # The container runs COMMAND with bash -c (as xpk-style job specs do).
            status = host.run(
                ["/bin/bash", "-c", str(job["command"])],
                None,
                handle.fileno(),
                handle.fileno(),
                env,
                host.workdir,
            )
        if self.cancelled():
            raise JobGone()
        return status


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
