"""The ordered list of commands a DAG run executes, for ``tpu-rl plan`` and the DAG docs."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_tpu_rl.render import boot_image, gke, image_stream, preflight, tpu_vm
from airflow_provider_tpu_rl.render import existing_cluster as pools_render
from airflow_provider_tpu_rl.render.blueprint import STREAMING_ROLE, capacity_settings
from airflow_provider_tpu_rl.render.command import ApiCall, Command
from airflow_provider_tpu_rl.spec.cluster import (
    CPU_COMPUTE_TYPE,
    RESERVATION,
    ClusterSpec,
    TpuVmSpec,
    capacity_value,
)
from airflow_provider_tpu_rl.spec.existing_cluster import RunPools
from airflow_provider_tpu_rl.spec.pipeline import (
    GKE_TASK_ORDER,
    TPU_VM_TASK_ORDER,
    GkePipelineSpec,
    TpuVmPipelineSpec,
)
from airflow_provider_tpu_rl.spec.preflight import (
    EXISTING_CLUSTER_RUN_PERMISSIONS,
    REQUIRED_PERMISSIONS,
    STREAMING_PERMISSIONS,
    VM_NETWORK,
    cpu_vm_quota_needs,
    quota_needs,
)
from airflow_provider_tpu_rl.spec.presets import Runner


@dataclass(frozen=True)
class PlanStep:
    task_id: str
    command: Command

    def to_dict(self) -> dict[str, Any]:
        out = {"task_id": self.task_id, **self.command.to_plan_dict()}
        if self.command.description:
            out["description"] = self.command.description
        return out


def _in_task_order(order: tuple[str, ...], commands: Mapping[str, Sequence[Command]]) -> list[PlanStep]:
    """The commands of each task, tasks in the DAG's order (the one place that order is written)."""
    unknown = set(commands) - set(order)
    if unknown:
        raise ValueError(f"tasks not in the DAG's task order: {sorted(unknown)}")
    return [PlanStep(task_id, c) for task_id in order for c in commands.get(task_id, [])]


# What the plan shows for values only known at run time.
PLAN_SSH_KEY_FILE = "<cache_dir>/ssh/gcluster_default/google_compute_engine"
PLAN_DEFAULT_SERVICE_ACCOUNT = "PROJECT_NUMBER-compute@developer.gserviceaccount.com"


# Where the GKE preflight runs gcluster's dependency check: an empty group folder in a temporary
# folder of the worker (GclusterHook.gcluster_dependency_problem).
PLAN_DEPENDENCY_CHECK_GROUP = "<tmp>/deployment/primary"
# Where it expands the edited blueprint (TpuRlPreflightOperator.check_kueue_file).
PLAN_BLUEPRINT_CHECK_FOLDER = "<tmp>"


def preflight_commands(
    runner: Runner,
    project: str,
    zone: str,
    reservation: str,
    capacity: str | Sequence[str],
    cpu_machine_types: Sequence[str] = (),
    *,
    num_slices: int = 1,
    topology: str = "",
) -> list[Command]:
    """Every command of the ``preflight`` task, in the order it runs them (operators/preflight.py
    ``execute``): on GKE gcluster's own dependency check; gcloud's active account; on GKE the
    edited blueprint expanded by ``gcluster create`` (its Kueue file checked); on a TPU VM the
    project's metadata (OS Login); the enabled APIs; on a TPU VM its network, the firewall rules
    and, for flex-start, gcloud's components; the region's quotas, and the project's for the CPU VMs'
    vCPUs; the reservation. Its API call (the permission test,
    beside the gcloud reads) is :func:`api_calls`'. ``capacity``: one kind or the ordered kinds
    (each kind's components and quotas)."""
    kinds = [capacity] if isinstance(capacity, str) else list(capacity)
    steps: list[Command] = []
    if runner is Runner.GKE:
        steps.append(preflight.gcluster_dependency_check(PLAN_DEPENDENCY_CHECK_GROUP))
    steps.append(preflight.active_account())
    if runner is Runner.GKE:
        steps.append(
            preflight.expand_blueprint(
                PLAN_BLUEPRINT_CHECK_FOLDER,
                project,
                zone,
                num_slices=num_slices,
                topology=topology,
                reservation=reservation,
            )
        )
    if runner is Runner.TPU_VM:
        steps.append(preflight.describe_project_info(project))
    steps.append(preflight.enabled_services(project))
    if runner is Runner.TPU_VM:
        steps += [preflight.describe_network(project, VM_NETWORK), preflight.list_firewall_rules(project)]
        if any(tpu_vm.gcloud_components_needed(kind) for kind in kinds):
            steps.append(preflight.gcloud_version())
    if any(quota_needs(runner, kind, 1, cpu_machine_types) for kind in kinds):
        steps.append(preflight.describe_region(project, zone.rsplit("-", 1)[0]))
    if cpu_vm_quota_needs(cpu_machine_types)[1]:
        # the project's quotas (CPUS_ALL_REGIONS) for the CPU VMs' vCPUs
        steps.append(preflight.describe_project_info(project, "quotas (all regions)"))
    if reservation:
        steps.append(preflight.describe_reservation(project, zone, reservation))
    return steps


@dataclass(frozen=True)
class PlanApiCall:
    """An API request a task makes through a client library (no command): shown apart from the
    steps, which are all commands."""

    task_id: str
    call: ApiCall

    def to_dict(self) -> dict[str, Any]:
        out = {"task_id": self.task_id, **self.call.to_plan_dict()}
        if self.call.description:
            out["description"] = self.call.description
        return out


def api_calls(
    runner: Runner,
    project: str,
    bucket: str = "",
    run_dirs: Mapping[str, str] | None = None,
    *,
    streams_image: bool = False,
    existing_cluster: bool = False,
) -> list[PlanApiCall]:
    """The run's API calls that no command makes: the preflight's permission test (a TPU VM
    under OS Login also tests compute.instances.osAdminLogin; a GKE run that streams its image,
    the copy's permissions too; a run on an existing cluster tests a run's permissions on it) and
    its reads of who writes the run's directories (``run_dirs``, in ``bucket``)."""
    base = EXISTING_CLUSTER_RUN_PERMISSIONS if existing_cluster else REQUIRED_PERMISSIONS[runner]
    permissions = [*base, *(STREAMING_PERMISSIONS if streams_image else ())]
    calls = [PlanApiCall("preflight", preflight.test_permissions(project, permissions))]
    for stage, directory in (run_dirs or {}).items():
        calls.append(PlanApiCall("preflight", preflight.read_run_dir_claim(bucket, stage, directory)))
    return calls


def gke_plan(pipeline: GkePipelineSpec, *, now: float | None = None) -> list[PlanStep]:
    """Every command of ``tpu_rl_gke_pipeline`` in execution order (skips are decided at run time)."""
    if pipeline.run_pools is not None:
        return _existing_cluster_plan(pipeline, pipeline.run_pools, now)
    cluster = pipeline.cluster
    workdir = gke.plan_workdir(cluster.cluster_name)
    target, token = pipeline.job_target, pipeline.token_resource
    auth = gke.docker_auth(cluster.region)
    # a fresh deployment folder on the worker, and the primary group's outputs (the tpu group's inputs)
    folder = [
        gke.recreate_deployment_folder(cluster, workdir),
        gke.export_outputs(cluster, workdir, gke.PRIMARY_GROUP),
    ]
    tpu = (gke.TPU_GROUP,)
    teardown: list[Command] = []
    if not pipeline.keep_cluster:
        # only when this run holds the cluster's lease (or created it and nobody holds one)
        teardown += [*folder, gke.destroy(cluster, workdir)]
        # only the grants the cluster holds last (its record; sync_hf_token added them); here, as
        # on a first run
        teardown += [
            gke.revoke_secret_accessor(cluster.project, pipeline.hf_token.secret_id, account)
            for account in (cluster.workload_service_account, cluster.node_pool_service_account)
        ]
    if pipeline.delete_bucket:
        teardown.append(gke.delete_bucket(cluster.bucket))
    # The training image copied into the run's repository (beside the cluster), and trained from
    # there by digest: the TPU node pool streams it.
    copy: list[Command] = []
    train_target = target
    if pipeline.streams_image:
        repo, image = pipeline.image_repository, pipeline.image
        digest = boot_image.pinned_digest(image)
        if digest is None:
            copy.append(boot_image.resolve_digest(image, image_stream.DIGEST_PURPOSE))
            digest = image_stream.PLAN_DIGEST
        copy += [
            image_stream.create_repository(cluster.project, cluster.region, repo),
            image_stream.copy_image(image, digest, cluster.project, cluster.region, repo),
        ]
        # a digest resolved at run time: the job's spec shows the stand-in (the copy's argv, <digest>)
        shown = image_stream.PLAN_DIGEST_STANDIN if digest == image_stream.PLAN_DIGEST else digest
        streamed = image_stream.streamed_image(cluster.project, cluster.region, repo, image, shown)
        train_target = replace(target, image=streamed)
    commands = {
        "preflight": preflight_commands(
            Runner.GKE,
            cluster.project,
            cluster.zone,
            cluster.reservation,
            cluster.capacity,
            num_slices=cluster.num_slices,
            topology=cluster.topology,
        ),
        "ensure_bucket": [gke.create_bucket(cluster.project, cluster.region, cluster.bucket)],
        "copy_workload_image": copy,
        # the cluster, cpu-np and Kueue: no TPU node pool while the conversion runs
        "deploy_cluster": [gke.deploy(cluster, workdir, skip_groups=tpu)],
        # the TPU capacity exists from here (the converted checkpoint is committed) ...
        "deploy_tpu_pool": [*folder, gke.deploy_groups(cluster, workdir, tpu)],
        "sync_hf_token": gke.hf_token_secret(
            cluster.project,
            pipeline.hf_token.secret_id,
            (cluster.workload_service_account, cluster.node_pool_service_account),
            sync=pipeline.hf_token.sync_from_connection,
        ),
        "convert_to_maxtext": [
            *auth,
            gke.conversion_job(pipeline.cpu_job_target, pipeline.convert_job, pipeline.conversion, token),
        ],
        "train": [
            *auth,
            gke.training_job(
                train_target,
                pipeline.train_job,
                pipeline.preset,
                pipeline.training,
                token,
                pipeline.pathways_gcs_location,
            ),
        ],
        # ... to here (the actor checkpoint is committed); the export runs on cpu-np (also with
        # keep_cluster, the TPU pool goes)
        "destroy_tpu_pool": [*folder, gke.destroy(cluster, workdir, only_groups=tpu)],
        "export_to_huggingface": [
            *auth,
            gke.export_job(pipeline.cpu_job_target, pipeline.export_job, pipeline.export, token),
        ],
        "destroy_cluster": teardown,
    }
    return _in_task_order(GKE_TASK_ORDER, commands)


def _existing_cluster_plan(pipeline: GkePipelineSpec, pools: RunPools, now: float | None) -> list[PlanStep]:
    """``cluster_mode`` existing: the same tasks, the cluster read instead of deployed (preflight)
    and only the run's own node pools created and deleted (``ClusterMode*Operator``)."""
    cluster = pipeline.cluster
    expires = int((now if now is not None else time.time()) + pipeline.max_cluster_hours * 3600)
    labels = gke.managed_labels(pipeline.dag_id, pools.suffix, cluster.bucket, expires)
    checks = preflight_commands(
        Runner.GKE, cluster.project, cluster.zone, cluster.reservation, cluster.capacity
    )
    # the cluster is read where the create mode expands its blueprint (check_existing_cluster);
    # then its Kubernetes API (discovery, LocalQueues) through the client library
    checks = [
        pools_render.describe_cluster(pools.cluster) if step.argv[:2] == ("gcluster", "create") else step
        for step in checks
    ]
    cpu = [pools.created_cpu_pool] if pools.created_cpu_pool else []
    listing = pools_render.list_pools(pools.cluster)
    deletes = [pools_render.delete_pool(pools.cluster, name) for name in pools.tpu_pools]
    teardown: list[Command] = (
        [listing, *(pools_render.delete_pool(pools.cluster, n) for n in cpu)] if cpu else []
    )
    if pipeline.delete_bucket:
        teardown.append(gke.delete_bucket(cluster.bucket))
    auth = gke.docker_auth(cluster.region)
    target, token = pipeline.job_target, pipeline.token_resource
    commands = {
        "preflight": checks,
        "ensure_bucket": [gke.create_bucket(cluster.project, cluster.region, cluster.bucket)],
        "deploy_cluster": [pools_render.create_cpu_pool(pools, CPU_COMPUTE_TYPE, labels)] if cpu else [],
        # no grant: the pools' node account is the platform team's to grant (docs/platform-teams.md)
        "sync_hf_token": gke.hf_token_secret(
            cluster.project, pipeline.hf_token.secret_id, (), sync=pipeline.hf_token.sync_from_connection
        ),
        # the compute-class route: no pool of the run's; its ComputeClass (compute_class_calls)
        "deploy_tpu_pool": []
        if pipeline.compute_class
        else [
            pools_render.create_tpu_pool(
                pools, index, capacity=cluster.capacity, reservation=cluster.reservation, labels=labels
            )
            for index in range(len(pools.tpu_pools))
        ],
        "convert_to_maxtext": [
            *auth,
            gke.conversion_job(pipeline.cpu_job_target, pipeline.convert_job, pipeline.conversion, token),
        ],
        "train": [
            *auth,
            gke.training_job(
                target,
                pipeline.train_job,
                pipeline.preset,
                pipeline.training,
                token,
                pipeline.pathways_gcs_location,
            ),
        ],
        "destroy_tpu_pool": [] if pipeline.compute_class else [listing, *deletes],
        "export_to_huggingface": [
            *auth,
            gke.export_job(pipeline.cpu_job_target, pipeline.export_job, pipeline.export, token),
        ],
        "destroy_cluster": teardown,
    }
    return _in_task_order(GKE_TASK_ORDER, commands)


def run_compute_class(pipeline: GkePipelineSpec, now: float | None = None) -> dict[str, Any] | None:
    """The run's ComputeClass manifest (the ``compute-class`` route), or None (its own pools)."""
    pools = pipeline.run_pools
    if pools is None or not pipeline.compute_class:
        return None
    cluster = pipeline.cluster
    expires = int((now if now is not None else time.time()) + pipeline.max_cluster_hours * 3600)
    labels = gke.managed_labels(pipeline.dag_id, pools.suffix, cluster.bucket, expires)
    return pools_render.compute_class(pools, cluster.capacities, cluster.reservation, labels)


def compute_class_calls(pipeline: GkePipelineSpec, now: float | None = None) -> list[PlanApiCall]:
    """The Kubernetes API requests of the ``compute-class`` route: ``deploy_tpu_pool`` creates the
    run's ComputeClass, ``destroy_tpu_pool`` deletes it (none on the ``pools`` route)."""
    manifest = run_compute_class(pipeline, now)
    pools = pipeline.run_pools
    if manifest is None or pools is None:
        return []
    return [
        PlanApiCall("deploy_tpu_pool", pools_render.apply_compute_class(manifest)),
        PlanApiCall("destroy_tpu_pool", pools_render.delete_compute_class(pools)),
    ]


def tpu_vm_plan(pipeline: TpuVmPipelineSpec, *, now: float | None = None) -> list[PlanStep]:
    """Every command of ``tpu_rl_tpu_vm_pipeline`` in execution order."""
    vm, cpu_vm = pipeline.vm, pipeline.cpu_vm
    expires = int((now if now is not None else time.time()) + pipeline.max_vm_hours * 3600)
    labels = tpu_vm.vm_labels(pipeline, expires)
    labelled = type(vm)(**{**vm.__dict__, "labels": labels})
    cpu_labelled = type(cpu_vm)(**{**cpu_vm.__dict__, "labels": labels})
    account = pipeline.service_account or PLAN_DEFAULT_SERVICE_ACCOUNT
    grants = tpu_vm.service_account_grants(vm.project, vm.bucket, pipeline.hf_token.secret_id, account)
    teardown: list[Command] = [] if pipeline.keep_vm else [tpu_vm.delete_vm(vm)]
    cpu_teardown: list[Command] = [] if pipeline.keep_vm else [tpu_vm.delete_vm(cpu_vm)]
    if not pipeline.keep_vm:
        # the CPU VM holds the grants last; here, as on a first run (none of them pre-existing)
        cpu_teardown += tpu_vm.service_account_revokes(
            vm.project, vm.bucket, pipeline.hf_token.secret_id, account
        )
    if pipeline.delete_bucket:
        cpu_teardown.append(gke.delete_bucket(vm.bucket))
    # The baked boot image: found in its family, or baked on a CPU VM of its own (skipped at run
    # time when the family has an image); the TPU VM then boots from the family.
    bake: list[Command] = []
    family = None
    if pipeline.bakes:
        family, digest = boot_image.plan_family(pipeline.workload_image)
        if boot_image.pinned_digest(pipeline.workload_image) is None:
            bake.append(boot_image.resolve_digest(pipeline.workload_image))
        bake.append(boot_image.find_image(vm.project, family))
        bake += boot_image.bake_commands(pipeline, family, digest, labels, ssh_key_file=PLAN_SSH_KEY_FILE)
    commands = {
        "preflight": preflight_commands(
            Runner.TPU_VM, vm.project, vm.zone, vm.reservation, vm.capacities, pipeline.cpu_machine_types
        ),
        "ensure_bucket": [gke.create_bucket(vm.project, pipeline.region, vm.bucket)],
        "sync_hf_token": gke.hf_token_secret(
            vm.project, pipeline.hf_token.secret_id, (), sync=pipeline.hf_token.sync_from_connection
        ),
        "create_cpu_vm": [
            tpu_vm.create_cpu_vm(cpu_labelled, pipeline.service_account),
            tpu_vm.vm_service_account(cpu_vm),
            # the first holder of the grants reads each policy before it adds the binding
            *[
                command
                for pair in zip(
                    tpu_vm.service_account_policy_reads(vm.project, vm.bucket, pipeline.hf_token.secret_id),
                    grants,
                    strict=True,
                )
                for command in pair
            ],
        ],
        "bake_image": bake,
        "delete_bake_vm": [boot_image.delete_bake_vm(pipeline.bake_vm)] if pipeline.bakes else [],
        "create_vm": [
            tpu_vm.create_vm(labelled, pipeline.service_account, boot_family=family),
            tpu_vm.vm_service_account(vm),
            *grants,
        ],
        **{
            task_id: [
                tpu_vm.stage_command(
                    pipeline, stage, machine=machine, ssh_key_file=PLAN_SSH_KEY_FILE, boot_family=family
                )
            ]
            for task_id, stage, machine in (
                ("install_cpu_vm", "install", "cpu"),
                ("convert_to_maxtext", "convert", None),
                ("install_maxtext", "install", "tpu"),
                ("train", "train", None),
                ("export_to_huggingface", "export", None),
            )
        },
        "delete_vm": teardown,
        "delete_cpu_vm": cpu_teardown,
    }
    return _in_task_order(TPU_VM_TASK_ORDER, commands)


def plan_document(dag_id: str, steps: list[PlanStep], calls: Sequence[PlanApiCall] = ()) -> dict[str, Any]:
    return {
        "dag_id": dag_id,
        "steps": [s.to_dict() for s in steps],
        "api_calls": [c.to_dict() for c in calls],
    }


def gke_capacity(pipeline: GkePipelineSpec) -> dict[str, Any]:
    """The run's capacity and what it renders: the TPU node pool's blueprint settings (the
    ``deploy_tpu_pool`` argv does not show them); for an ordered list, each kind's in the order
    ``deploy_tpu_pool`` tries them."""
    cluster = pipeline.cluster
    if pipeline.compute_class:  # GKE chooses among the kinds: the ComputeClass's priorities
        return {
            "value": capacity_value(cluster.capacities),
            "reservation": cluster.reservation or None,
            "route": pipeline.capacity_route,
            "compute_class": run_compute_class(pipeline),
        }
    if cluster.fallback:
        return {
            "value": list(cluster.capacities),
            "reservation": cluster.reservation or None,
            "attempts": [
                {"kind": kind, "tpu_pool_settings": _pool_settings(cluster.attempt(kind))}
                for kind in cluster.capacities
            ],
        }
    return {
        "value": cluster.capacity,
        "reservation": cluster.reservation or None,
        "tpu_pool_settings": _pool_settings(cluster),
    }


def _pool_settings(cluster: ClusterSpec) -> dict[str, Any]:
    if cluster.capacity == RESERVATION:  # the spec refuses it without a reservation named
        return {
            "reservation_affinity": {
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "specific_reservations": [{"name": cluster.reservation}],
            }
        }
    return capacity_settings(cluster.capacity, cluster.shape.vms)


def gke_image_streaming(pipeline: GkePipelineSpec) -> dict[str, Any]:
    """Whether the TPU node pool streams its image, from which repository, and what the blueprint
    sets for it (the ``deploy_*`` argv do not show the blueprint)."""
    if not pipeline.streams_image:
        return {"streamed": False, "repository": None, "tpu_pool_settings": {}, "node_account_roles": []}
    c = pipeline.cluster
    return {
        "streamed": True,
        "repository": f"{image_stream.registry_host(c.region)}/{c.project}/{pipeline.image_repository}",
        "tpu_pool_settings": {"enable_gcfs": True},
        "node_account_roles": [STREAMING_ROLE],
    }


def tpu_vm_capacity(pipeline: TpuVmPipelineSpec) -> dict[str, Any]:
    """The run's capacity and the TPU VM create's release track and scheduling flags; for an
    ordered list, each kind's in the order ``create_vm`` tries them (the steps show the first)."""
    vm = pipeline.vm
    if vm.fallback:
        return {
            "value": list(vm.capacities),
            "reservation": vm.reservation or None,
            "attempts": [{"kind": kind, **_create_flags(vm.attempt(kind))} for kind in vm.capacities],
        }
    return {"value": vm.capacity, "reservation": vm.reservation or None, **_create_flags(vm)}


def _create_flags(vm: TpuVmSpec) -> dict[str, Any]:
    track, flags = tpu_vm.capacity_flags(vm)
    return {"release_track": track[0] if track else "ga", "create_vm_flags": flags}
