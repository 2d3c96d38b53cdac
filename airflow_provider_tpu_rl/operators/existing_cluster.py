"""A run's own node pools on a GKE cluster it does not own: created named and labelled after the
run, with a resource record written first; deleted only when both the pool's labels and the record
say they are the run's. The cluster itself is never created nor deleted here
([platform teams](../docs/platform-teams.md))."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind
from airflow_provider_tpu_rl.ledger.collect import CAPACITY_XCOM_KEY
from airflow_provider_tpu_rl.operators import billing
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, expiry_of_run, fail_fast
from airflow_provider_tpu_rl.operators.gke import (
    GclusterDeployOperator,
    GclusterDestroyOperator,
    delete_run_bucket,
    group_selection,
)
from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import existing_cluster as render
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.blueprint import TPU_GROUP
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import (
    CPU_COMPUTE_TYPE,
    SliceShape,
    capacity_order,
    check_capacity,
    default_capacity,
    require_reservation_name,
)
from airflow_provider_tpu_rl.spec.existing_cluster import (
    COMPUTE_CLASS_ROUTE,
    CPU_POOL_ROLE,
    CREATE,
    EXISTING,
    EXISTING_ONE_KIND,
    POOLS_ROUTE,
    TPU_POOL_ROLE,
    ExistingCluster,
    RunPools,
    capacity_route,
    compute_class_is_runs,
    compute_class_name,
    parse_existing_cluster,
    pool_is_runs,
    served_kind,
)
from airflow_provider_tpu_rl.spec.existing_cluster import (
    cluster_mode as parse_cluster_mode,
)
from airflow_provider_tpu_rl.spec.pipeline import run_suffix
from airflow_provider_tpu_rl.spec.preflight import parse_json_list
from airflow_provider_tpu_rl.timeouts import stage_command_timeout

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

log = logging.getLogger(__name__)

POOL_RECORD_KIND = "node_pool"
# The Kubernetes label GKE gives every node with its node pool's name (GKE's node labels reference).
GKE_NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"


@dataclass(frozen=True)
class PoolClock:
    """What ``billing.pool_billed`` reads of one run pool: its project and zone (the operations on
    its node VMs), and its resource record (``cluster_name``: the pool's record, named after it)."""

    project: str
    zone: str
    cluster_name: str
    bucket: str


ROLES = (TPU_POOL_ROLE, CPU_POOL_ROLE)
ALREADY_EXISTS = "code=409"


class _RunPoolsOperator(GclusterBaseOperator):
    """The arguments that name a cluster the run does not own and the pools it adds to it."""

    template_fields: Sequence[str] = (
        "existing_cluster",
        "zone",
        "bucket",
        "compute_type",
        "topology",
        "num_slices",
        "cpu_node_pool",
        "pools",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
    )
    # The task this operator does the work of (the pipeline's ClusterMode* tasks build one outside
    # any DAG, whose own dag_id is Airflow's ad hoc one): the pools are named after that task's run,
    # as the run's jobs are, never after the ad hoc DAG's.
    on_behalf_of: GclusterBaseOperator | None = None

    def __init__(
        self,
        *,
        existing_cluster: str,
        zone: str,
        bucket: str,
        compute_type: str = "ct6e-standard-4t",
        topology: str = "4x8",
        num_slices: int | str = 1,
        cpu_node_pool: str | None = None,
        pools: str = TPU_POOL_ROLE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.existing_cluster = existing_cluster
        self.zone = zone
        self.bucket = bucket
        self.compute_type = compute_type
        self.topology = topology
        self.num_slices = num_slices
        self.cpu_node_pool = cpu_node_pool
        self.pools = pools

    def run_ids(self, context: Context) -> tuple[str, str]:
        if self.on_behalf_of is not None:
            return self.on_behalf_of.run_ids(context)
        return super().run_ids(context)

    def run_pools(self, context: Context) -> RunPools:
        dag_id, run_id = self.run_ids(context)
        return RunPools(
            parse_existing_cluster(self.existing_cluster),
            run_suffix(dag_id, run_id),
            rules.zone("zone", self.zone, None),
            SliceShape(self.compute_type, self.topology),
            rules.integer("num_slices", self.num_slices, 1, 64),
            self.cpu_node_pool or "",
        )

    def role(self) -> str:
        return rules.one_of("pools", self.pools, ROLES)

    def names(self, pools: RunPools) -> tuple[str, ...]:
        """The pools of :meth:`role` this run creates (none: it uses the cluster's CPU pool)."""
        if self.role() == TPU_POOL_ROLE:
            return pools.tpu_pools
        return (pools.created_cpu_pool,) if pools.created_cpu_pool else ()

    def write_record(
        self, kind: str, name: str, pools: RunPools, bucket: str, run: tuple[str, str], expires_at: int
    ) -> None:
        """Write the resource record of the run's ``name`` (a pool or a ComputeClass) before it
        exists: what proves it the run's at its delete, and what the janitor sweeps."""
        dag_id, run_id = run
        cluster = {
            "project": pools.cluster.project,
            "location": pools.cluster.location,
            "name": pools.cluster.name,
        }
        record = {"kind": kind, "name": name, "dag_id": dag_id, "run_id": run_id, "cluster": cluster}
        write_resource_record(
            self.gcp_conn_id, bucket, name, {**record, "expires_at": expires_at}, self.chain
        )

    def listed(self, pools: RunPools) -> dict[str, dict[str, Any]]:
        """The cluster's node pools now, by name."""
        result = self.hook.run_checked(render.list_pools(pools.cluster), log_output=False)
        return {
            str(p.get("name")): p for p in parse_json_list(result.output_lines) or [] if isinstance(p, dict)
        }


class ExistingClusterPoolCreateOperator(_RunPoolsOperator):
    """Create the run's TPU node pool(s) (``pools="tpu"``) or its CPU pool (``pools="cpu"``, none
    when ``cpu_node_pool`` names the cluster's) in a cluster the run does not own.

    Each pool's resource record (``tpu-rl/resources/<pool>.json`` in ``bucket``) is written before
    the pool exists; a pool of the run's name that exists already is the run's own (a retry) only
    when its labels say so, otherwise the task fails in one line.

    :param existing_cluster: ``PROJECT/LOCATION/NAME`` of the cluster.
    :param zone: the zone of the pools (inside the cluster's region).
    :param bucket: the run's bucket (the pools' records).
    :param capacity: ``on-demand``, ``reservation``, ``spot`` or ``flex-start`` (TPU pools).
    :param reservation: the reservation of ``reservation`` capacity.
    :param cpu_machine_type: the machine type of the run's own CPU pool.
    :param max_cluster_hours: the pools' expiry label, from the run's start (the janitor's).
    :param node_service_account: the Google service account the pools' nodes run as (a TPU pod,
        on the host network, reads the bucket and the HF token as it); empty: Compute Engine's
        default service account. The caller needs ``iam.serviceAccounts.actAs`` on it.
    """

    ui_color = "#d4e8ff"
    template_fields: Sequence[str] = (
        *_RunPoolsOperator.template_fields,
        "capacity",
        "reservation",
        "cpu_machine_type",
        "max_cluster_hours",
        "node_service_account",
    )

    def __init__(
        self,
        *,
        capacity: str | None = None,
        reservation: str = "",
        cpu_machine_type: str = CPU_COMPUTE_TYPE,
        max_cluster_hours: int | str = 72,
        node_service_account: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.node_service_account = node_service_account
        self.capacity = capacity
        self.reservation = reservation
        self.cpu_machine_type = cpu_machine_type
        self.max_cluster_hours = max_cluster_hours

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        pools = self.run_pools(context)
        bucket = rules.bucket_name("bucket", self.bucket)
        reservation = self.reservation or ""
        kinds = capacity_order(check_capacity(self.capacity or default_capacity(reservation), reservation))
        if len(kinds) > 1:
            raise AirflowFailException(f"capacity: {EXISTING_ONE_KIND}")
        capacity = kinds[0]
        require_reservation_name(capacity, reservation)
        dag_id, run_id = self.run_ids(context)
        expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
        labels = gke.managed_labels(dag_id, pools.suffix, bucket, expires_at)
        account = self.node_service_account or ""
        if account:
            rules.match(
                "node_service_account", account, rules.SERVICE_ACCOUNT, "must be a service account e-mail"
            )
        created: list[str] = []
        started = datetime.now(UTC)
        for index, name in enumerate(self.names(pools)):
            self.write_record(POOL_RECORD_KIND, name, pools, bucket, (dag_id, run_id), expires_at)
            if self.role() == TPU_POOL_ROLE:
                command = render.create_tpu_pool(
                    pools,
                    index,
                    capacity=capacity,
                    reservation=reservation,
                    labels=labels,
                    service_account=account,
                )
            else:
                command = render.create_cpu_pool(pools, self.cpu_machine_type, labels, account)
            result = self.hook.run(command, timeout=stage_command_timeout("deploy"))
            if not result.ok and not result.timed_out and ALREADY_EXISTS in result.output:
                if not pool_is_runs(self.listed(pools).get(name, {}), pools.suffix, bucket):
                    raise AirflowFailException(
                        f"cluster {pools.cluster.where} has a node pool {name} that is not this run's "
                        "(its labels do not name it): delete or rename it; the run creates no other"
                    )
                self.log.info("node pool %s exists already and is this run's (a retry): kept", name)
            else:
                self.hook.check_result(command, result)
            created.append(name)
            if self.role() == TPU_POOL_ROLE:  # the pool's node VMs' clocks, for the ledger
                billing.note_nodes(
                    self, pools.cluster.project, pools.zone, pools.cluster.name, [name], bucket, name, started
                )
        return {"existing_cluster": pools.cluster.where, "pools": created, "run": pools.suffix}


class ExistingClusterPoolDeleteOperator(_RunPoolsOperator):
    """Delete the run's TPU pool(s) (``pools="tpu"``) or its own CPU pool (``pools="cpu"``) from a
    cluster the run does not own: only a pool whose labels name the run (``pool_is_runs``) and
    whose resource record names this DAG run. Another team's pool, another run's, and the cluster
    itself are never touched; a pool already gone is success.

    Takes the arguments of :class:`ExistingClusterPoolCreateOperator` that name the pools.
    """

    ui_color = "#ffd9d4"

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        pools = self.run_pools(context)
        bucket = rules.bucket_name("bucket", self.bucket)
        dag_id, run_id = self.run_ids(context)
        names = self.names(pools)
        listed = self.listed(pools) if names else {}
        deleted: list[str] = []
        left: list[str] = []
        spans: list[dict[str, Any] | None] = []
        for name in names:
            pool = listed.get(name)
            if pool is None:
                self.log.info(
                    "node pool %s is not in cluster %s: nothing to delete", name, pools.cluster.where
                )
                continue
            record = read_resource_record(self.gcp_conn_id, bucket, name, self.chain) or {}
            recorded = (record.get("kind"), record.get("dag_id"), record.get("run_id")) == (
                POOL_RECORD_KIND,
                dag_id,
                run_id,
            )
            if not (pool_is_runs(pool, pools.suffix, bucket) and recorded):
                self.log.warning(
                    "node pool %s of cluster %s is not provably this run's (labels: %s, record: %s): left alone",
                    name,
                    pools.cluster.where,
                    "the run's" if pool_is_runs(pool, pools.suffix, bucket) else "not the run's",
                    f"{record.get('dag_id')}/{record.get('run_id')}" if record else "none",
                )
                left.append(name)
                continue
            billed = self.role() == TPU_POOL_ROLE  # the pool's node VMs' clocks, for the ledger
            if billed:
                where = pools.cluster
                billing.note_nodes(self, where.project, pools.zone, where.name, [name], bucket, name)
            self.hook.run_checked(
                render.delete_pool(pools.cluster, name), timeout=stage_command_timeout("teardown")
            )
            deleted.append(name)
            if billed:
                spans.append(billing.pool_billed(self, PoolClock(where.project, pools.zone, name, bucket)))
        result: dict[str, Any] = {
            "existing_cluster": pools.cluster.where,
            "deleted": deleted,
            "left_alone": left,
        }
        if spans:
            known = [s for s in spans if s is not None]
            # every deleted pool's spans; unknown when one pool's could not be read
            result[billing.XCOM_KEY] = (
                {"spans": [x for s in known for x in s["spans"]], "read_at": known[-1]["read_at"]}
                if len(known) == len(spans)
                else None
            )
        return result


COMPUTE_CLASS_RECORD_KIND = "compute_class"
# How often the ComputeClass probe reads its placeholder pod: the cluster autoscaler's scan
# interval (kubernetes/autoscaler cluster-autoscaler/FAQ.md: scan-interval 10 s), as the flex-start
# probe (operators/gke.py CAPACITY_PROBE_POLL_SECONDS).
COMPUTE_CLASS_POLL_SECONDS = 10.0


def _kube_client(gcp_conn_id: str, chain: str | Sequence[str] | None, cluster: ExistingCluster) -> Any:
    """A Kubernetes API client of ``cluster`` (the job operators' own)."""
    from airflow_provider_tpu_rl.hooks.kubernetes import GkeClusterHook, JobSetClient

    access = GkeClusterHook(gcp_conn_id, cluster.location, chain).cluster_access(
        cluster.name, cluster.project
    )
    return JobSetClient(access, gcp_conn_id, chain)


class ExistingClusterComputeClassOperator(_RunPoolsOperator):
    """The ``compute-class`` route: create the run's ComputeClass (its ordered capacity kinds as
    priorities, :func:`render.compute_class`) in a cluster the run does not own, then ask it for a
    node with a placeholder pod: the node GKE brings up says which kind served (its labels,
    :func:`served_kind`), pushed as the ``capacity`` XCom the ledger reads. No kind within
    ``[tpu_rl] flex_start_probe_timeout_minutes``: the class is deleted and the task fails in one
    line (a capacity failure: its retries may try again). A class of the run's name that exists
    already is kept only when its labels say it is the run's (a retry); otherwise one line.

    Takes :class:`ExistingClusterPoolCreateOperator`'s ``capacity``, ``reservation`` and
    ``max_cluster_hours``.
    """

    ui_color = "#d4e8ff"
    template_fields: Sequence[str] = (
        *_RunPoolsOperator.template_fields,
        "capacity",
        "reservation",
        "max_cluster_hours",
    )

    def __init__(
        self,
        *,
        capacity: str | list[str] | None = None,
        reservation: str = "",
        max_cluster_hours: int | str = 72,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.capacity = capacity
        self.reservation = reservation
        self.max_cluster_hours = max_cluster_hours

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        import asyncio

        from airflow_provider_tpu_rl.hooks.kubernetes import pod_scheduled
        from airflow_provider_tpu_rl.timeouts import flex_start_probe_timeout

        pools = self.run_pools(context)
        bucket = rules.bucket_name("bucket", self.bucket)
        reservation = self.reservation or ""
        kinds = capacity_order(check_capacity(self.capacity or default_capacity(reservation), reservation))
        for kind in kinds:
            require_reservation_name(kind, reservation)
        dag_id, run_id = self.run_ids(context)
        expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
        labels = gke.managed_labels(dag_id, pools.suffix, bucket, expires_at)
        manifest = render.compute_class(pools, kinds, reservation, labels)
        name = compute_class_name(pools.suffix)
        self.write_record(COMPUTE_CLASS_RECORD_KIND, name, pools, bucket, (dag_id, run_id), expires_at)
        started = datetime.now(UTC)  # the auto-created pool's nodes bill from after this
        probe = render.compute_class_probe_pod(pools)
        probe_name = probe["metadata"]["name"]
        namespace = probe["metadata"]["namespace"]
        bound = flex_start_probe_timeout()
        client = _kube_client(self.gcp_conn_id, self.chain, pools.cluster)

        async def apply_and_probe() -> tuple[str | None, list[str], str]:
            try:
                async with client.connection() as api:
                    if not await client.create_compute_class(api, manifest):
                        found = await client.get_compute_class(api, name)
                        if not compute_class_is_runs(found, pools.suffix, bucket):
                            raise AirflowFailException(
                                f"cluster {pools.cluster.where} has a ComputeClass {name} that is not "
                                "this run's (its labels do not name it): delete or rename it; the run "
                                "creates no other"
                            )
                        self.log.info(
                            "ComputeClass %s exists already and is this run's (a retry): kept", name
                        )
                    await client.delete_pod(api, namespace, probe_name)  # an earlier try's
                    await client.create_pod(api, namespace, probe)
                    said: list[str] = []
                    try:
                        deadline = time.monotonic() + bound
                        while True:
                            pod = await client.read_pod(api, namespace, probe_name)
                            uid = ((pod or {}).get("metadata") or {}).get("uid")
                            events = await client.pod_events(api, namespace, probe_name)
                            said = [  # this pod's, not an earlier try's of the same name
                                f"FailedScaleUp: {' '.join(str(e.get('message') or '').split())}"
                                for e in events
                                if e.get("reason") == "FailedScaleUp"
                                and (e.get("involvedObject") or {}).get("uid") == uid
                            ]
                            if pod is not None and pod_scheduled(pod):
                                node_name = str((pod.get("spec") or {}).get("nodeName") or "")
                                node = await client.read_node(api, node_name) if node_name else None
                                node_labels = ((node or {}).get("metadata") or {}).get("labels") or {}
                                pool = str(node_labels.get(GKE_NODE_POOL_LABEL) or "")
                                return served_kind(node_labels), said, pool
                            if time.monotonic() >= deadline:
                                return None, said, ""
                            await asyncio.sleep(
                                min(COMPUTE_CLASS_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
                            )
                    finally:
                        await client.delete_pod(api, namespace, probe_name)
            finally:
                await client.close()

        served, said, pool = asyncio.run(apply_and_probe())
        if served is None:
            self.delete_class(pools, bucket, dag_id, run_id)
            last = f"; the autoscaler said: {said[-1]}" if said else ""
            raise CommandError(
                f"ComputeClass {name} of cluster {pools.cluster.where}: GKE got no node for any of "
                f"{', '.join(kinds)} in {pools.zone} within {bound / 60:g} min ([tpu_rl] "
                f"flex_start_probe_timeout_minutes){last}; the class is deleted",
                FailureKind.CAPACITY,
            )
        passed = kinds[: kinds.index(served)] if served in kinds else kinds
        # the autoscaler's FailedScaleUp events, in the order GKE tried the priorities
        attempts = [
            {
                "capacity": kind,
                "error": said[i] if i < len(said) else "not given: GKE went on to a later priority",
            }
            for i, kind in enumerate(passed)
        ]
        self.log.info(
            "Capacity %s: GKE's ComputeClass %s brought up a node after %d kind(s) ahead of it",
            served,
            name,
            len(attempts),
        )
        context["ti"].xcom_push(key=CAPACITY_XCOM_KEY, value={"served": served, "attempts": attempts})
        if pool:  # the auto-created pool's node VMs' clocks, in the class's record, for the ledger
            where = pools.cluster
            billing.note_nodes(self, where.project, pools.zone, where.name, [pool], bucket, name, started)
        return {
            "existing_cluster": pools.cluster.where,
            "compute_class": name,
            "run": pools.suffix,
            "node_pool": pool,
        }

    def delete_class(self, pools: RunPools, bucket: str, dag_id: str, run_id: str) -> bool:
        """Delete the run's ComputeClass when its labels and its record say it is the run's."""
        return delete_run_compute_class(
            self.gcp_conn_id, self.chain, pools.cluster, pools.suffix, bucket, dag_id, run_id
        )


def delete_run_compute_class(
    gcp_conn_id: str,
    chain: str | Sequence[str] | None,
    cluster: ExistingCluster,
    suffix: str,
    bucket: str,
    dag_id: str,
    run_id: str,
    *,
    dry_run: bool = False,
) -> bool:
    """Delete run ``suffix``'s ComputeClass when both its labels (:func:`compute_class_is_runs`)
    and its resource record name this DAG run; True when deleted (with ``dry_run``: when it would
    be). Another run's or team's class is left alone (one log line). The node pools GKE
    auto-created for it are GKE's: once the run's jobs are gone their nodes are empty, the cluster
    autoscaler removes them (``scale-down-unneeded-time``, 10 min by default: kubernetes/autoscaler
    cluster-autoscaler/FAQ.md) and GKE deletes an auto-created pool left empty ("About node pool
    auto-creation": GKE deletes "the entire node pool when it's no longer needed")."""
    import asyncio

    name = compute_class_name(suffix)
    record = read_resource_record(gcp_conn_id, bucket, name, chain) or {}
    recorded = (record.get("kind"), record.get("dag_id"), record.get("run_id")) == (
        COMPUTE_CLASS_RECORD_KIND,
        dag_id,
        run_id,
    )
    client = _kube_client(gcp_conn_id, chain, cluster)

    async def delete() -> bool:
        try:
            async with client.connection() as api:
                found = await client.get_compute_class(api, name)
                if found is None:
                    log.info("ComputeClass %s is not in cluster %s: nothing to delete", name, cluster.where)
                    return False
                if not (compute_class_is_runs(found, suffix, bucket) and recorded):
                    log.warning(
                        "ComputeClass %s of cluster %s is not provably this run's (labels: %s, record: %s): "
                        "left alone",
                        name,
                        cluster.where,
                        "the run's" if compute_class_is_runs(found, suffix, bucket) else "not the run's",
                        f"{record.get('dag_id')}/{record.get('run_id')}" if record else "none",
                    )
                    return False
                if dry_run:
                    log.warning("dry run: would delete ComputeClass %s of %s", name, cluster.where)
                    return True
                return bool(await client.delete_compute_class(api, name))
        finally:
            await client.close()

    return asyncio.run(delete())


class ExistingClusterComputeClassDeleteOperator(_RunPoolsOperator):
    """The ``compute-class`` route's teardown: delete the run's ComputeClass when its labels and
    its record say it is this run's (:func:`delete_run_compute_class`); never another's."""

    ui_color = "#ffd9d4"

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        pools = self.run_pools(context)
        bucket = rules.bucket_name("bucket", self.bucket)
        dag_id, run_id = self.run_ids(context)
        name = compute_class_name(pools.suffix)
        deleted = delete_run_compute_class(
            self.gcp_conn_id, self.chain, pools.cluster, pools.suffix, bucket, dag_id, run_id
        )
        result: dict[str, Any] = {
            "existing_cluster": pools.cluster.where,
            "deleted": [name] if deleted else [],
            "left_alone": [],
        }
        if deleted:
            # the nodes GKE brought up for the class, noted at its deploy: their spans to now. Their
            # scale-down after the jobs end (up to the autoscaler's 10 unneeded minutes) bills the
            # project but is not in the run's figure (docs/platform-teams.md, the ComputeClass route)
            clock = PoolClock(pools.cluster.project, pools.zone, name, bucket)
            result[billing.XCOM_KEY] = billing.pool_billed(self, clock)
        return result


# DAG-run states after which a run's pools are no longer needed (the janitor's rule 4).
ENDED_RUN_STATES = frozenset({"success", "failed"})


def condemned_pools(
    records: Mapping[str, Mapping[str, Any]],
    now: float,
    run_state: Callable[[str, str], str | None],
    kind: str = POOL_RECORD_KIND,
) -> list[Mapping[str, Any]]:
    """The records of ``kind`` (node pools; ``compute_class``: the runs' ComputeClasses) whose
    resource is no longer needed: past their ``expires_at``, or their DAG run has ended. Other
    records are never in it."""
    found = []
    for record in records.values():
        if record.get("kind") != kind or not isinstance(record.get("cluster"), Mapping):
            continue
        expires = record.get("expires_at")
        expired = isinstance(expires, int | float) and now >= expires
        ended = run_state(str(record.get("dag_id")), str(record.get("run_id"))) in ENDED_RUN_STATES
        if expired or ended:
            found.append(record)
    return found


def sweep_run_pools(
    hook: GclusterHook,
    gcp_conn_id: str,
    buckets: Sequence[str],
    now: float,
    run_state: Callable[[str, str], str | None],
    *,
    dry_run: bool = False,
) -> dict[str, list[str]]:
    """The janitor's pass over runs' pools on clusters they do not own: each pool a record in one
    of ``buckets`` condemns (:func:`condemned_pools`) is deleted when its labels say it is that
    run's (:func:`pool_is_runs`); a pool already gone, or not provably the run's, is left alone;
    so is each run's ComputeClass (:func:`delete_run_compute_class`). A cluster is never deleted:
    the janitor finds clusters to destroy by the provider's label, which a cluster made outside it
    does not carry."""
    from airflow_provider_tpu_rl.records.janitor_sources import read_bucket_records

    report: dict[str, list[str]] = {"deleted": [], "left_alone": [], "failed": []}
    for bucket in buckets:
        try:
            records = read_bucket_records(gcp_conn_id, bucket)
        except Exception as error:
            log.warning("janitor: cannot read the resource records of gs://%s (%s); skipped", bucket, error)
            continue
        for record in condemned_pools(records, now, run_state):
            place = record["cluster"]
            name = str(record.get("name"))
            try:
                cluster = ExistingCluster(str(place["project"]), str(place["location"]), str(place["name"]))
                listed = hook.run_checked(render.list_pools(cluster), log_output=False)
                pools = {
                    str(p.get("name")): p
                    for p in parse_json_list(listed.output_lines) or []
                    if isinstance(p, dict)
                }
                pool = pools.get(name)
                suffix = run_suffix(str(record.get("dag_id")), str(record.get("run_id")))
                if pool is None or not pool_is_runs(pool, suffix, bucket):
                    report["left_alone"].append(f"{cluster.where}/{name}")
                    continue
                if dry_run:
                    log.warning("dry run: would delete node pool %s of %s", name, cluster.where)
                else:
                    hook.run_checked(
                        render.delete_pool(cluster, name), timeout=stage_command_timeout("teardown")
                    )
                report["deleted"].append(f"{cluster.where}/{name}")
            except Exception:
                log.exception("janitor: could not delete node pool %s of %s", name, place)
                report["failed"].append(f"{place}/{name}")
        # the runs' ComputeClasses (capacity_route compute-class) whose run ended or expired
        for record in condemned_pools(records, now, run_state, COMPUTE_CLASS_RECORD_KIND):
            place = record["cluster"]
            name = str(record.get("name"))
            try:
                cluster = ExistingCluster(str(place["project"]), str(place["location"]), str(place["name"]))
                dag_id, run_id = str(record.get("dag_id")), str(record.get("run_id"))
                deleted = delete_run_compute_class(
                    gcp_conn_id,
                    None,
                    cluster,
                    run_suffix(dag_id, run_id),
                    bucket,
                    dag_id,
                    run_id,
                    dry_run=dry_run,
                )
                report["deleted" if deleted else "left_alone"].append(f"{cluster.where}/{name}")
            except Exception:
                log.exception("janitor: could not delete ComputeClass %s of %s", name, place)
                report["failed"].append(f"{place}/{name}")
    return report


# ---------------------------------------------------------------------------------------------
# The GKE pipeline's cluster tasks, by cluster_mode: *create* runs the Cluster Toolkit operator as
# before; *existing* runs the pool operators above under the same task id (the task order, the
# ledger's steps and the plans are the same in both modes).
class _ClusterModeMixin:
    """``cluster_mode`` and the existing-cluster arguments beside a cluster operator's own."""

    cluster_mode: str
    existing_cluster: str
    cpu_node_pool: str
    capacity_route: str

    def pool_operator(self, kind: type[_RunPoolsOperator], role: str, **extra: Any) -> _RunPoolsOperator:
        """The pool operator doing this task's work in *existing* mode, from this task's values."""
        this: Any = self
        operator = kind(
            task_id=this.task_id,
            existing_cluster=self.existing_cluster,
            zone=this.zone,
            bucket=this.bucket,
            compute_type=this.compute_type,
            topology=this.topology,
            num_slices=this.num_slices,
            cpu_node_pool=self.cpu_node_pool or None,
            pools=role,
            gcluster_conn_id=this.gcluster_conn_id,
            gcp_conn_id=this.gcp_conn_id,
            impersonation_chain=this.impersonation_chain,
            **extra,
        )
        # built outside the DAG: its names, labels and records are this task's run's
        operator.on_behalf_of = this
        return operator

    def existing(self) -> bool:
        return parse_cluster_mode(self.cluster_mode or CREATE) == EXISTING

    def compute_class(self) -> bool:
        """The run's TPU nodes come from its ComputeClass (``capacity_route`` compute-class)."""
        return capacity_route(self.capacity_route or POOLS_ROUTE) == COMPUTE_CLASS_ROUTE


MODE_FIELDS = ("cluster_mode", "existing_cluster", "cpu_node_pool", "capacity_route")


class ClusterModeDeployOperator(_ClusterModeMixin, GclusterDeployOperator):
    """``deploy_cluster`` / ``deploy_tpu_pool``: in *create* mode :class:`GclusterDeployOperator`;
    in *existing* mode the run's own CPU pool (``skip_groups=["tpu"]``: the cluster's stage) or
    its TPU pool(s) (``only_groups=["tpu"]``), and no cluster lease.

    :param cluster_mode: ``create`` or ``existing``.
    :param existing_cluster: with ``existing``: ``PROJECT/LOCATION/NAME``.
    :param cpu_node_pool: with ``existing``: the cluster's CPU pool (empty: the run creates its own).
    :param capacity_route: with ``existing``: ``pools`` (the run's own TPU pool, one kind) or
        ``compute-class`` (its ComputeClass, GKE choosing among the ordered kinds:
        :class:`ExistingClusterComputeClassOperator`).
    """

    template_fields: Sequence[str] = (*GclusterDeployOperator.template_fields, *MODE_FIELDS)

    def __init__(
        self,
        *,
        cluster_mode: str = CREATE,
        existing_cluster: str = "",
        cpu_node_pool: str = "",
        capacity_route: str = POOLS_ROUTE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster_mode = cluster_mode
        self.existing_cluster = existing_cluster
        self.cpu_node_pool = cpu_node_pool
        self.capacity_route = capacity_route

    def execute(self, context: Context) -> Any:
        if not self.existing():
            return super().execute(context)
        role = TPU_POOL_ROLE if TPU_GROUP in group_selection(self.only_groups, None)[0] else CPU_POOL_ROLE
        kind: type[_RunPoolsOperator] = ExistingClusterPoolCreateOperator
        if role == TPU_POOL_ROLE and self.compute_class():
            kind = ExistingClusterComputeClassOperator
        operator = self.pool_operator(
            kind,
            role,
            capacity=self.capacity,
            reservation=self.reservation,
            max_cluster_hours=self.max_cluster_hours,
        )
        return operator.execute(context)


class ClusterModeDestroyOperator(_ClusterModeMixin, GclusterDestroyOperator):
    """``destroy_tpu_pool`` / ``destroy_cluster``: in *create* mode :class:`GclusterDestroyOperator`;
    in *existing* mode the run's TPU pool(s) (``only_groups=["tpu"]``) or its own CPU pool and,
    with ``delete_bucket``, the bucket — never the cluster.

    Takes :class:`ClusterModeDeployOperator`'s mode arguments.
    """

    template_fields: Sequence[str] = (*GclusterDestroyOperator.template_fields, *MODE_FIELDS)

    def __init__(
        self,
        *,
        cluster_mode: str = CREATE,
        existing_cluster: str = "",
        cpu_node_pool: str = "",
        capacity_route: str = POOLS_ROUTE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cluster_mode = cluster_mode
        self.existing_cluster = existing_cluster
        self.cpu_node_pool = cpu_node_pool
        self.capacity_route = capacity_route

    def execute(self, context: Context) -> Any:
        if not self.existing():
            return super().execute(context)
        only, _ = group_selection(self.only_groups, None)
        role = TPU_POOL_ROLE if TPU_GROUP in only else CPU_POOL_ROLE
        kind: type[_RunPoolsOperator] = ExistingClusterPoolDeleteOperator
        if role == TPU_POOL_ROLE and self.compute_class():
            kind = ExistingClusterComputeClassDeleteOperator
        result = self.pool_operator(kind, role).execute(context)
        if role == CPU_POOL_ROLE and rules.boolean("delete_bucket", self.delete_bucket):
            result.update(delete_run_bucket(self, context, rules.bucket_name("bucket", self.bucket)))
        return result
