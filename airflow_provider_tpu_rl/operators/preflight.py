"""``TpuRlPreflightOperator``: check everything a run needs before it creates anything.

The local toolchain, gcloud's active account and (GKE) the Application Default Credentials
``gcluster job submit`` needs, the project's enabled APIs, the caller's IAM permissions and the
reservation's free capacity; for a TPU VM also its network, the firewall rule SSH needs and OS
Login. It only reads; every problem found is one line naming what to enable, grant or
create, and all of them fail the task together (``AirflowFailException``: a retry would not help).
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException, conf
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, fail_fast
from airflow_provider_tpu_rl.render import existing_cluster as existing_commands
from airflow_provider_tpu_rl.render import preflight as commands
from airflow_provider_tpu_rl.spec import preflight as checks
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import (
    FLEX_START,
    capacity_order,
    check_capacity,
    default_capacity,
    require_reservation_name,
)
from airflow_provider_tpu_rl.spec.existing_cluster import (
    COMPUTE_CLASS_ROUTE,
    EXISTING_ONE_KIND,
    KUEUE_GROUP_VERSION,
    POOLS_ROUTE,
    QUEUE_NAMESPACE,
    ClusterNeeds,
    ExistingCluster,
    capacity_route,
    cluster_problems,
    kubernetes_problems,
    parse_existing_cluster,
    served_group_versions,
)
from airflow_provider_tpu_rl.spec.pipeline import default_shape, image_repository
from airflow_provider_tpu_rl.spec.preflight import error_line
from airflow_provider_tpu_rl.spec.presets import Runner

# A short quota's line (spec/preflight.py quota_problems): "quota <METRIC> in region ...".
_QUOTA_LINE = re.compile(r"^quota (\S+) ")

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.vm_access import VmAccessReader
    from airflow_provider_tpu_rl.render.command import Command

COMMAND_TIMEOUT = 180.0
# Each request of the ADC check (a token from the key's token_uri, or the metadata server).
ADC_TIMEOUT = 20.0
# While another run holds the cluster's lease, preflight re-reads it this often (deferred).
LEASE_POLL_SECONDS = 60.0
TOOLCHAIN_PURPOSE: Mapping[Runner, str] = {Runner.GKE: "deploy", Runner.TPU_VM: "tpu_vm"}


def default_resource_manager_endpoint() -> str | None:
    """``[tpu_rl] resource_manager_endpoint`` in the Airflow config; ``None`` = the real API."""
    return conf.get("tpu_rl", "resource_manager_endpoint", fallback=None) or None


def lease_wait_seconds() -> float:
    """``[tpu_rl] lease_wait_minutes``: how long preflight waits for another run's cluster lease
    (deferred, re-checked every minute); 0 (the default) fails at once."""
    return max(conf.getfloat("tpu_rl", "lease_wait_minutes", fallback=0.0), 0.0) * 60.0


def read_cluster_controllers(
    gcp_conn_id: str, impersonation_chain: str | Sequence[str] | None, cluster: ExistingCluster
) -> tuple[set[str], list[str] | None, str | None]:
    """What the cluster's Kubernetes API serves and the LocalQueues of ``default`` (None: Kueue is
    not served), through the API the provider's jobs use; or a line saying why it cannot be read."""
    import asyncio

    from airflow_provider_tpu_rl.exceptions import KubernetesApiError
    from airflow_provider_tpu_rl.hooks.kubernetes import GkeClusterHook, JobSetClient

    async def read() -> tuple[set[str], list[str] | None]:
        access = await asyncio.to_thread(
            GkeClusterHook(gcp_conn_id, cluster.location, impersonation_chain).cluster_access,
            cluster.name,
            cluster.project,
        )
        client = JobSetClient(access, gcp_conn_id, impersonation_chain)
        try:
            async with client.connection() as api:
                served = served_group_versions(await client.api_groups(api))
                queues = (
                    await client.local_queues(api, QUEUE_NAMESPACE) if KUEUE_GROUP_VERSION in served else None
                )
                return served, queues
        finally:
            await client.close()

    try:
        served, queues = asyncio.run(read())
    except (ConfigurationError, KubernetesApiError) as err:
        return (
            set(),
            None,
            (
                f"could not read cluster {cluster.where}'s Kubernetes API ({error_line(str(err))}): the caller "
                "needs container.clusters.getCredentials and the API must be reachable from the Airflow workers"
            ),
        )
    return served, queues, None


def load_permission_client() -> None:
    """Import the permission check's hook and its Resource Manager client (about 0.6 s of imports);
    an import error shows again, with its message, when the check itself imports them."""
    from airflow_provider_tpu_rl.hooks.resource_manager import ProjectPermissionsHook

    ProjectPermissionsHook.load_client_library()


class TpuRlPreflightOperator(GclusterBaseOperator):
    """Check the toolchain, APIs, permissions and reservation a run needs; create nothing.

    :param runner: ``gke`` (Cluster Toolkit GKE cluster) or ``tpu_vm`` (one TPU VM).
    :param project_id: project the run creates its resources in; empty: the GCP connection's.
    :param zone: zone of the TPUs (and of the reservation).
    :param reservation: reservation the run consumes (``reservation`` capacity), checked for room.
    :param capacity: how the TPUs are provisioned (``on-demand``, ``reservation``, ``spot`` or
        ``flex-start``), or on a TPU VM an ordered list of them (each kind's gcloud components are
        checked; a short quota or reservation only some kinds take is a warning: their create
        falls through); empty: ``reservation`` when one is named, else ``on-demand``. Only
        ``reservation`` capacity consumes a reservation: it must name one, the others none.
    :param compute_type: TPU machine type (default the runner's: ct6e-standard-4t / -8t).
    :param topology: slice topology (default the runner's: 4x8 / 2x4).
    :param num_slices: slices taken from the reservation (default 1).
    :param required_services: APIs to require instead of the runner's defaults.
    :param required_permissions: permissions to require instead of the runner's defaults: a
        mapping permission -> role that grants it, or a list of permissions.
    :param impersonation_chain: service account(s) the GCP connection impersonates.
    :param resource_manager_endpoint: another Resource Manager endpoint (an emulator); default
        ``[tpu_rl] resource_manager_endpoint``, else the real API.
    :param cluster_name: the GKE cluster the run uses: another run's live lease on it is a problem
        ("cluster X is in use by run Y until ..."), or, with ``[tpu_rl] lease_wait_minutes`` > 0,
        waited for (deferred, bounded).
    :param bucket: the bucket holding the cluster's lease (with ``cluster_name``).
    :param ssh_source_ranges: (``tpu_vm``) the CIDR ranges the Airflow workers' SSH sessions come
        from (their egress addresses): a firewall rule must let tcp:22 in from all of them. Default:
        a rule allowing tcp:22 from any source range counts.
    :param cpu_machine_types: (``tpu_vm``) the machine types of the CPU VMs the run creates at once
        (the pipeline: the bake VM, when it bakes, and the conversion's CPU VM): their vCPUs are
        checked against the region's quota of each series (``N2_CPUS``, …) and the project's
        ``CPUS_ALL_REGIONS``, before anything is created.
    :param run_dirs: the run's own directories in ``bucket``, by the stage that writes them
        (``{"train": "gs://…/RUN_NAME/", "export": "gs://…/"}``, ``validate``'s ``run_dirs``): a
        claim of another run that still vouches for its job is a problem ("… is being written by
        job J of run R"), before any TPU exists; a claim that no longer vouches is proven dead
        here as ``train`` would (its job read where it runs), a live one is a problem.
    :param cancel_previous_writer: with ``run_dirs``: stop a job whose claim no longer vouches
        for it (as ``train`` would) instead of refusing the run.
    :param image_repository: GKE: the Artifact Registry repository the training image is copied
        into for image streaming; named, the Container File System API and the copy's Artifact
        Registry permissions are checked too.
    :param existing_cluster: (``gke``) ``PROJECT/LOCATION/NAME`` of a GKE cluster the run does not
        own ([platform teams](../docs/platform-teams.md)): it is read instead of a blueprint checked
        (RUNNING, a GKE that runs v6e and flex-start when chosen, Workload Identity, JobSet, Kueue
        and a LocalQueue, the CPU pool) and the permissions are a run's on it; no cluster lease.
    :param kueue_queue: (with ``existing_cluster``) the LocalQueue of namespace ``default`` the
        run's jobs go to; empty: the only one there.
    :param cpu_node_pool: (with ``existing_cluster``) the cluster's CPU node pool the conversions
        run on; empty: the run creates its own.
    :param capacity_route: (with ``existing_cluster``) ``compute-class``: the ordered ``capacity``
        is accepted and the cluster is checked for what the run's ComputeClass needs (a GKE whose
        ComputeClasses create node pools, no auto-provisioning limits without TPU v6e).
    """

    ui_color = "#e8f5e9"
    template_fields: Sequence[str] = (
        "runner",
        "project_id",
        "zone",
        "reservation",
        "capacity",
        "compute_type",
        "topology",
        "num_slices",
        "required_services",
        "required_permissions",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
        "resource_manager_endpoint",
        "cluster_name",
        "bucket",
        "ssh_source_ranges",
        "cpu_machine_types",
        "run_dirs",
        "cancel_previous_writer",
        "image_repository",
        "existing_cluster",
        "kueue_queue",
        "cpu_node_pool",
        "capacity_route",
    )

    def __init__(
        self,
        *,
        runner: str,
        zone: str,
        project_id: str | None = None,
        reservation: str | None = "",
        capacity: str | list[str] | None = None,
        compute_type: str | None = None,
        topology: str | None = None,
        num_slices: int | str | None = 1,
        required_services: Sequence[str] | None = None,
        required_permissions: Mapping[str, str] | Sequence[str] | None = None,
        impersonation_chain: str | Sequence[str] | None = None,
        resource_manager_endpoint: str | None = None,
        cluster_name: str | None = None,
        bucket: str | None = None,
        ssh_source_ranges: Sequence[str] | None = None,
        cpu_machine_types: Sequence[str] | None = None,
        run_dirs: Mapping[str, str] | None = None,
        cancel_previous_writer: bool | str = False,
        image_repository: str | None = None,
        existing_cluster: str | None = None,
        kueue_queue: str | None = None,
        cpu_node_pool: str | None = None,
        capacity_route: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image_repository = image_repository
        self.runner = runner
        self.project_id = project_id
        self.zone = zone
        self.reservation = reservation
        self.capacity = capacity
        self.compute_type = compute_type
        self.topology = topology
        self.num_slices = num_slices
        self.required_services = required_services
        self.required_permissions = required_permissions
        self.impersonation_chain = impersonation_chain
        self.resource_manager_endpoint = resource_manager_endpoint
        self.cluster_name = cluster_name
        self.bucket = bucket
        self.ssh_source_ranges = ssh_source_ranges
        self.cpu_machine_types = cpu_machine_types
        self.run_dirs = run_dirs
        self.cancel_previous_writer = cancel_previous_writer
        self.existing_cluster = existing_cluster
        self.kueue_queue = kueue_queue
        self.cpu_node_pool = cpu_node_pool
        self.capacity_route = capacity_route

    # ------------------------------------------------------------------ arguments
    def _streams(self, run: Runner) -> bool:
        """A GKE run whose TPU node pool streams its image (``image_repository`` named)."""
        return run is Runner.GKE and bool(image_repository(self.image_repository))

    def _services(self, run: Runner) -> tuple[str, ...]:
        if self.required_services is None:
            streaming = checks.STREAMING_SERVICES if self._streams(run) else ()
            return (*checks.REQUIRED_SERVICES[run], *streaming)
        if isinstance(self.required_services, str):
            raise ConfigurationError("required_services must be a list of API names, not a string")
        return tuple(checks.service_name(s) for s in self.required_services)

    def _permissions(self, run: Runner) -> dict[str, str]:
        value = self.required_permissions
        if value is None and self._existing() is not None:
            return dict(checks.EXISTING_CLUSTER_RUN_PERMISSIONS)
        if value is None:
            streaming = checks.STREAMING_PERMISSIONS if self._streams(run) else {}
            return {**checks.REQUIRED_PERMISSIONS[run], **streaming}
        if isinstance(value, str):
            raise ConfigurationError("required_permissions must be a mapping or a list, not a string")
        if isinstance(value, Mapping):
            return {checks.permission_name(p): str(role or "") for p, role in value.items()}
        return {checks.permission_name(p): "" for p in value}

    def _slices(self) -> int:
        return 1 if self.num_slices in (None, "") else rules.integer("num_slices", self.num_slices, 1, 64)

    def _need(self, run: Runner) -> checks.ReservationNeed:
        compute_type, topology = default_shape(run)
        return checks.ReservationNeed.for_slices(
            self.compute_type or compute_type, self.topology or topology, self._slices()
        )

    def _existing(self) -> ExistingCluster | None:
        """The cluster the run does not own (``existing_cluster``), or None: the run creates one."""
        if not self.existing_cluster:
            return None
        return parse_existing_cluster(self.existing_cluster)

    # ------------------------------------------------------------------ checks
    _tool_missing = False
    _account_missing = False

    def _tool_problem(self, err: ConfigurationError) -> list[str]:
        """A tool that cannot run: one line, unless the toolchain check already named it."""
        if self._tool_missing:
            self.log.warning("skipped (toolchain incomplete): %s", err)
            return []
        return [str(err)]

    def _skipped_without_account(self, what: str, err: object) -> bool:
        """A gcloud read that failed because gcloud has no account (already one line): skipped."""
        if self._account_missing:
            self.log.warning("skipped %s (gcloud has no active account): %s", what, error_line(str(err)))
        return self._account_missing

    def check_blueprint(
        self, capacity: str, reservation: str, need: checks.ReservationNeed, project: str, zone: str
    ) -> list[str]:
        """The bundle's blueprint takes the run's edits (render/blueprint.py, both of its shapes):
        a shape they do not know is one line here, before the deploy makes anything; so is a
        ``version_prefix`` older than GKE's first with TPU v6e, and a Kueue file the edited
        blueprint relies on that gcluster's modules lack (:meth:`check_kueue_file`)."""
        import yaml

        from airflow_provider_tpu_rl.render.blueprint import (
            BLUEPRINT_RELPATH,
            BlueprintError,
            customize_blueprint,
        )
        from airflow_provider_tpu_rl.spec.presets import BlueprintEdits

        try:
            source = self.hook.bundle_dir() / BLUEPRINT_RELPATH
            text = source.read_text()
        except (ConfigurationError, OSError) as err:
            return [f"the Cluster Toolkit blueprint cannot be read: {error_line(str(err))}"]
        edits = BlueprintEdits(system_node_pool_machine_type="n2-standard-8", pin_system_node_pool_zone=True)
        try:
            edited = customize_blueprint(
                text,
                edits,
                reservation=bool(reservation),
                capacity=capacity,
                slice_vms=need.vms,
                tpu_quota=need.chips,
            )
        except (BlueprintError, ValueError) as err:
            return [
                f"the Cluster Toolkit blueprint {source} does not take the run's edits: {error_line(str(err))}"
            ]
        document = yaml.safe_load(text)
        version = (document.get("vars") or {}).get("version_prefix") if isinstance(document, dict) else None
        line = checks.gke_version_problem(version)
        return ([line] if line else []) + self.check_kueue_file(source, edited, project, zone, reservation)

    def check_kueue_file(
        self, source: Path, edited: str, project: str, zone: str, reservation: str
    ) -> list[str]:
        """The Kueue default the edited blueprint relies on (no ``config_path``: kubectl-apply's
        ``kueue-configuration-pathways.yaml.tftpl``, release v1.92.0 on) is in the kubectl-apply
        module gcluster writes: without it no ClusterQueue with the TPU quota is applied and no
        job is admitted. The blueprint is expanded with ``gcluster create`` into a temporary
        folder, as the deploy expands it; a ``ghpc_stage`` file it lacks fails there too."""
        from airflow_provider_tpu_rl.render.blueprint import (
            BLUEPRINT_FILENAME,
            KUEUE_DEFAULT_RELEASE,
            kueue_default_template,
        )

        template = kueue_default_template(edited)
        with tempfile.TemporaryDirectory(prefix="tpu-rl-blueprint-check-") as folder:
            shutil.copytree(source.parent, folder, dirs_exist_ok=True)
            (Path(folder) / BLUEPRINT_FILENAME).write_text(edited)
            try:
                self.hook.run_checked(
                    commands.expand_blueprint(
                        folder,
                        project,
                        zone,
                        num_slices=self._slices(),
                        topology=self.topology or default_shape(Runner.GKE)[1],
                        reservation=reservation,
                    ),
                    cwd=folder,
                    log_output=False,
                    timeout=COMMAND_TIMEOUT,
                )
            except ConfigurationError as err:
                return self._tool_problem(err)
            except CommandError as err:
                return [f"gcluster cannot expand the edited blueprint {source}: {error_line(str(err))}"]
            if template is None:
                return []
            found = any(
                (Path(module) / template).is_file() for module in commands.kubectl_apply_folders(folder)
            )
        if found:
            return []
        return [
            f"the gcluster in use has no {template} in its kubectl-apply module, the Kueue default the "
            f"bundle's blueprint {source} relies on (it names no kueue config_path): no ClusterQueue "
            f"would admit the run's jobs; use a Cluster Toolkit release {KUEUE_DEFAULT_RELEASE} or newer "
            "for both gcluster and the bundle's examples"
        ]

    def _read_document(
        self,
        command: Command,
        what: str,
        unreadable: str,
        no_json: str,
        not_found: tuple[Sequence[str], str] | None = None,
    ) -> tuple[dict[str, Any] | None, list[str]]:
        """A ``--format=json`` read: ``(its document, [])``, or ``(None, its problem lines)``
        (none when it was skipped for lack of a gcloud account). ``unreadable`` is the line of a
        failed read, its ``{error}`` gcloud's error line; ``not_found`` the messages that mean the
        resource does not exist and the line to say instead. A retryable failure is raised."""
        try:
            result = self.hook.run(command, log_output=False, timeout=COMMAND_TIMEOUT)
        except ConfigurationError as err:
            return None, self._tool_problem(err)
        if not result.ok and self._skipped_without_account(what, result.output):
            return None, []
        if not result.ok and not_found is not None and any(m in result.output for m in not_found[0]):
            return None, [not_found[1]]
        try:
            self.hook.check_result(command, result)
        except CommandError as err:
            if err.retryable:
                raise
            return None, [unreadable.format(error=error_line(str(err)))]
        document = checks.parse_json_document(result.output_lines)
        return (document, []) if document is not None else (None, [no_json])

    def check_quotas(
        self,
        project: str,
        zone: str,
        run: Runner,
        capacity: str | Sequence[str],
        need: checks.ReservationNeed,
    ) -> list[str]:
        """The region's free quota for what the run takes (:func:`checks.quota_needs`), and the
        project's vCPUs in all regions for its CPU VMs: one line per short quota; a flex-start zone
        the docs do not list is a warning. With an ordered list of kinds, a short quota only some
        kinds take is a warning (their create is refused and falls through to the next kind)."""
        kinds = [capacity] if isinstance(capacity, str) else list(capacity)
        if FLEX_START in kinds:
            note = checks.flex_start_zone_note(run, zone)
            if note:
                self.log.warning("preflight: %s", note)
        cpu_types = self._cpu_machine_types()
        _, cpu_total, cpu_notes = checks.cpu_vm_quota_needs(cpu_types)
        for note in cpu_notes:
            self.log.warning("preflight: %s", note)
        what = checks.cpu_vms_taking(cpu_types)
        per_kind = [checks.quota_needs(run, kind, need.chips, cpu_types) for kind in kinds]
        needs: dict[str, int] = {}
        for kind_needs in per_kind:
            for metric, amount in kind_needs.items():
                needs[metric] = max(needs.get(metric, 0), amount)
        problems = self._check_region_quotas(project, zone, needs, what) if needs else []
        if len(kinds) > 1:
            problems = self._every_kinds(problems, kinds, per_kind)
        if cpu_total:
            problems += self._check_project_quotas(project, {checks.CPUS_ALL_REGIONS_QUOTA: cpu_total}, what)
        return problems

    def _every_kinds(
        self, problems: list[str], kinds: Sequence[str], per_kind: Sequence[Mapping[str, int]]
    ) -> list[str]:
        """The quota problems every kind of the list meets; one of a quota only some kinds take is
        logged as a warning naming them."""
        kept = []
        for problem in problems:
            found = _QUOTA_LINE.match(problem)
            takers = [k for k, n in zip(kinds, per_kind, strict=True) if found is None or found[1] in n]
            if len(takers) == len(kinds):
                kept.append(problem)
            else:
                self.log.warning("preflight: with %s capacity: %s", " or ".join(takers), problem)
        return kept

    def _cpu_machine_types(self) -> list[str]:
        value = self.cpu_machine_types
        if not value:
            return []
        if isinstance(value, str):
            raise ConfigurationError("cpu_machine_types must be a list of machine types, not a string")
        return [rules.gce_name("cpu_machine_types", str(item), "machine type") for item in value]

    def _check_project_quotas(
        self, project: str, needs: Mapping[str, int], what: Mapping[str, str]
    ) -> list[str]:
        """The project's own quotas (``compute project-info describe``: all regions)."""
        return self._quota_lines(
            commands.describe_project_info(project, "quotas (all regions)"),
            project,
            None,
            needs,
            what,
            "the project quota check",
            f"could not read the quotas of project {project} ({{error}}): the caller needs compute.projects.get",
            f"gcloud printed no project JSON for {project}",
        )

    def _check_region_quotas(
        self, project: str, zone: str, needs: Mapping[str, int], what: Mapping[str, str]
    ) -> list[str]:
        region = zone.rsplit("-", 1)[0]
        return self._quota_lines(
            commands.describe_region(project, region),
            project,
            region,
            needs,
            what,
            "the quota check",
            f"could not read the quotas of region {region} ({{error}}): the caller needs compute.regions.get",
            f"gcloud printed no region JSON for {region}",
        )

    def _quota_lines(
        self,
        command: Command,
        project: str,
        region: str | None,
        needs: Mapping[str, int],
        what: Mapping[str, str],
        check: str,
        unreadable: str,
        no_json: str,
    ) -> list[str]:
        """Read ``command``'s quotas document; one line per short quota, a warning per note."""
        document, problems = self._read_document(command, check, unreadable, no_json)
        if document is None:
            return problems
        problems, notes = checks.quota_problems(project, region, needs, document, what)
        for note in notes:
            self.log.warning("preflight: %s", note)
        return problems

    def check_gcloud_components(self, capacity: str) -> list[str]:
        """The gcloud components the TPU VM's commands need beyond core (``alpha`` for flex-start):
        one line per missing one, before anything is created."""
        from airflow_provider_tpu_rl.render.tpu_vm import gcloud_components_needed

        needed = gcloud_components_needed(capacity)
        if not needed:
            return []
        try:
            installed = self.hook.gcloud_components(timeout=COMMAND_TIMEOUT)
        except ConfigurationError as err:
            return self._tool_problem(err)
        if installed is None:
            self.log.warning("gcloud did not list its components: %s not checked", ", ".join(needed))
            return []
        return [checks.missing_component_problem(c, capacity) for c in needed if c not in installed]

    def check_gcloud_account(self, run: Runner) -> list[str]:
        """gcloud's active account (cmd/job/prereq.go ``ensureGCloudAuthenticated``): exit 0 and
        an account on stdout; every gcloud command of the run needs one."""
        try:
            account = self.hook.active_gcloud_account(timeout=COMMAND_TIMEOUT)
        except ConfigurationError as err:
            return self._tool_problem(err)
        if account is None:
            self._account_missing = True
            return [checks.no_account_problem(run)]
        self.log.info("gcloud's active account: %s", account)
        return []

    def check_adc(self) -> list[str]:
        """Application Default Credentials where gcluster runs (cmd/job/prereq.go
        ``getADCSetupCommand``): ``job submit`` refuses without them, after the cluster exists."""
        from airflow_provider_tpu_rl.toolchain.adc import worker_adc_file

        status = self.hook.adc_status(timeout=ADC_TIMEOUT)
        if status.ok:
            self.log.info("gcluster finds Application Default Credentials in %s", status.source)
            return []
        return [checks.no_adc_problem(status.problem or "", worker_adc_file())]

    def check_toolchain(self, run: Runner) -> list[str]:
        try:
            chain = self.hook.require_toolchain(TOOLCHAIN_PURPOSE[run])
            if run is Runner.GKE:
                # gcluster's own check, which would otherwise stop the deploy at a [y/N] prompt
                line = self.hook.gcluster_dependency_problem(chain)
                return [line] if line else []
        except ConfigurationError as err:
            return [str(err)]
        return []

    def check_services(self, project: str, services: Sequence[str]) -> list[str]:
        try:
            result = self.hook.run_checked(
                commands.enabled_services(project), log_output=False, timeout=COMMAND_TIMEOUT
            )
        except ConfigurationError as err:
            return self._tool_problem(err)
        except CommandError as err:
            if self._skipped_without_account("the API check", err):
                return []
            if err.retryable:
                raise
            return [
                f"could not list the APIs enabled in project {project} ({error_line(str(err))}): "
                "the caller needs serviceusage.services.list (roles/serviceusage.serviceUsageConsumer) "
                "and serviceusage.googleapis.com enabled"
            ]
        enabled = checks.parse_enabled_services(result.output_lines)
        self.log.info("%d APIs enabled in %s", len(enabled), project)
        return [checks.service_problem(project, s) for s in checks.missing_services(services, enabled)]

    def check_permissions(
        self, project: str, permissions: Mapping[str, str], reasons: Mapping[str, str] | None = None
    ) -> list[str]:
        from airflow_provider_tpu_rl.hooks.resource_manager import ProjectPermissionsHook

        endpoint = self.resource_manager_endpoint or default_resource_manager_endpoint()
        try:
            hook = ProjectPermissionsHook(
                gcp_conn_id=self.gcp_conn_id,
                impersonation_chain=self.impersonation_chain or None,
                api_endpoint=endpoint,
            )
            granted = hook.test_permissions(project, list(permissions))
        except ConfigurationError as err:
            return [f"could not test the caller's permissions on project {project}: {err}"]
        except CommandError:  # transient (network, 5xx): the task's retries apply
            raise
        except AirflowException as err:  # the GCP connection is not defined
            return [f"could not test the caller's permissions on project {project}: {err}"]
        self.log.info("caller holds %d of %d required permissions", len(granted), len(permissions))
        missing = checks.missing_permissions(permissions, granted)
        return checks.permission_problems(
            project, missing, permissions, hook.caller_member() if missing else None, reasons
        )

    def check_reservation(
        self, project: str, zone: str, reservation: str, need: checks.ReservationNeed
    ) -> list[str]:
        command = commands.describe_reservation(project, zone, reservation)
        document, problems = self._read_document(
            command,
            "the reservation check",
            f"could not read reservation {reservation} in zone {zone} ({{error}}): "
            "the Compute Engine API must be enabled and the caller hold compute.reservations.get",
            f"gcloud printed no reservation JSON for {reservation} in zone {zone}",
            not_found=(
                commands.RESERVATION_NOT_FOUND,
                checks.reservation_not_found_problem(project, zone, reservation),
            ),
        )
        if document is None:
            return problems
        note = checks.reservation_in_use_note(need, document)
        if note is not None:
            self.log.warning("%s", note)
        return checks.reservation_problems(need, document)

    def _vm_access(self) -> VmAccessReader:
        from airflow_provider_tpu_rl.hooks.vm_access import VmAccessReader

        return VmAccessReader(self.hook, timeout=COMMAND_TIMEOUT)

    def check_os_login(self, project: str) -> tuple[bool, list[str]]:
        """Whether the project's metadata enforces OS Login (``enable-oslogin``)."""
        if self._skipped_without_account("the OS Login check", "no account"):
            return False, []
        try:
            return self._vm_access().os_login(project)
        except ConfigurationError as err:
            return False, self._tool_problem(err)

    def check_vm_network(self, project: str, sources: Sequence[str]) -> list[str]:
        """The TPU VM's network exists and a firewall rule lets the SSH sessions in."""
        if self._skipped_without_account("the network check", "no account"):
            return []
        try:
            return self._vm_access().network_problems(project, sources)
        except ConfigurationError as err:
            return self._tool_problem(err)

    def check_existing_cluster(
        self, project: str, capacity: str, capacities: tuple[str, ...] = ()
    ) -> list[str]:
        """The cluster the run does not own, read before anything is spent: the container API's
        ``Cluster`` (``gcloud container clusters describe``), then, when it is there and RUNNING,
        its Kubernetes API (discovery, the LocalQueues of ``default``); one line per prerequisite
        it lacks (``spec/existing_cluster.py``)."""
        cluster = self._existing()
        if cluster is None:
            return []
        if cluster.project != project:
            return [
                f"existing_cluster {cluster.where} is in project {cluster.project}, not the run's {project}: "
                "its TPU node pool, quota and reservation are the cluster's project's; set project to it"
            ]
        needs = ClusterNeeds(
            cluster,
            capacity,
            cpu_pool=self.cpu_node_pool or "",
            queue=self.kueue_queue or "",
            capacities=capacities,
        )
        document, problems = self._read_document(
            existing_commands.describe_cluster(cluster),
            "the cluster check",
            f"could not read cluster {cluster.where} ({{error}}): the caller needs container.clusters.get",
            f"gcloud printed no cluster JSON for {cluster.where}",
            not_found=(existing_commands.POOL_GONE, cluster_problems(needs, None)[0]),
        )
        if document is None:
            return problems
        problems = cluster_problems(needs, document)
        if document.get("status") != "RUNNING":
            return problems  # its Kubernetes API may not answer: read again once it is RUNNING
        served, queues, unreadable = read_cluster_controllers(
            self.gcp_conn_id, self.impersonation_chain, cluster
        )
        if unreadable is not None:
            return [*problems, unreadable]
        kube_problems, queue = kubernetes_problems(needs, served, queues)
        if queue is not None:
            self.log.info("preflight: the run's jobs go to LocalQueue %s of cluster %s", queue, cluster.where)
        return problems + kube_problems

    def lease_holder_line(self, context: Context) -> str | None:
        """Another run's live lease on the cluster, as one line; ``None`` when this run may use it
        (free, expired, kept for a later run, or already this run's). A cluster the run does not
        own has no lease: runs share it."""
        if self.runner != Runner.GKE.value or not self.cluster_name or not self.bucket:
            return None
        if self._existing() is not None:
            return None
        from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, held_message

        cluster = rules.gke_cluster_name("cluster_name", self.cluster_name)
        bucket = rules.bucket_name("bucket", self.bucket)
        lease = ClusterLeaseHook(
            gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain
        ).read(bucket, cluster)
        dag_id, run_id = self.run_ids(context)
        if lease is None or lease.kept or lease.expired() or lease.holder == f"{dag_id}/{run_id}":
            return None
        return held_message(lease)

    def run_dir_claim_lines(self, context: Context) -> list[str]:
        """Each of the run's directories (``run_dirs``) another run's job writes, as one line:
        a claim that vouches for its job, or one that does not whose job is not proven dead
        where it runs (``takeover.prove_dead``: stopped first with ``cancel_previous_writer``).
        The same reads ``train`` and ``export`` make before they write, made before the TPU
        exists."""
        if not self.run_dirs or not self.bucket:
            return []
        from google.api_core.exceptions import GoogleAPIError

        from airflow_provider_tpu_rl.operators.gke_jobs import claim_seconds
        from airflow_provider_tpu_rl.operators.takeover import prove_dead
        from airflow_provider_tpu_rl.records.janitor_sources import run_finished, run_probe
        from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords, busy_message, vouches

        bucket = rules.bucket_name("bucket", self.bucket)
        cancel = rules.boolean("cancel_previous_writer", self.cancel_previous_writer)
        run = "/".join(self.run_ids(context))
        records = RunDirRecords(self.gcp_conn_id, self.chain)
        probe = run_probe(context)
        lines = []
        for stage, directory in self.run_dirs.items():
            try:
                held = records.read(bucket, directory).writer
            except GoogleAPIError as err:  # ensure_bucket says why; train reads the claim again
                self.log.warning("preflight: the claim of %s cannot be read: %s", directory, err)
                continue
            if held is None or held.run == run:
                continue
            finished = run_finished(probe, held.run)
            if vouches(held, finished):
                lines.append(busy_message(directory, held))
                continue
            try:
                prove_dead(
                    self,
                    held,
                    directory,
                    finished=finished,
                    stage=stage,
                    cancel=cancel,
                    pathways=self.runner == Runner.GKE.value and stage == "train",
                    claim_seconds=claim_seconds(),
                )
            except AirflowFailException as refused:
                lines.append(str(refused))
        return lines

    def wait_for_lease(self, context: Context, deadline: float, line: str) -> None:
        """Defer until the lease may be free (bounded by ``deadline``), or fail with ``line``."""
        if time.time() >= deadline:
            self.log.error("preflight: %s", line)
            raise AirflowFailException(line)
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        self.log.warning("preflight: %s; waiting for it (until %s)", line, time.ctime(deadline))
        wait = min(LEASE_POLL_SECONDS, max(deadline - time.time(), 1.0))
        self.defer(
            trigger=TimeDeltaTrigger(timedelta(seconds=wait)),
            method_name="execute_lease_wait",
            kwargs={"deadline": deadline},
        )

    @fail_fast
    def execute_lease_wait(
        self, context: Context, event: Any = None, deadline: float = 0.0
    ) -> dict[str, Any]:
        """Back from a lease wait: check the lease again (the other checks passed already)."""
        line = self.lease_holder_line(context)
        if line is not None:
            self.wait_for_lease(context, deadline, line)
        self.log.info("preflight: cluster %s is free for this run", self.cluster_name)
        return {"runner": self.runner, "project": self.resolve_project_id(), "cluster_lease": "free"}

    # ------------------------------------------------------------------ execute
    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        run = checks.runner(self.runner)
        project = rules.project_id("project_id", self.resolve_project_id())
        zone = rules.zone("zone", self.zone, None)
        reservation = self.reservation or ""
        if reservation:
            rules.gce_name("reservation", reservation, "reservation name")
        capacity = check_capacity(self.capacity or default_capacity(reservation), reservation)
        require_reservation_name(capacity, reservation)
        kinds = capacity_order(capacity)
        route = capacity_route(self.capacity_route or POOLS_ROUTE)
        if len(kinds) > 1 and self._existing() is not None and route == POOLS_ROUTE:
            raise AirflowFailException(f"capacity: {EXISTING_ONE_KIND}")
        services = self._services(run)
        permissions = self._permissions(run)
        need = self._need(run)
        sources = checks.ssh_source_ranges(self.ssh_source_ranges)

        # The permission check (an API call) runs beside the gcloud reads: independent, read-only.
        # Its client is a heavy import, loaded in the same thread while the first gcloud reads run.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="preflight") as pool:
            pool.submit(load_permission_client)
            problems = self.check_toolchain(run)
            # A tool the toolchain check reported missing makes the gcloud reads fail the same way.
            self._tool_missing = bool(problems)
            # gcloud without an account fails every read below the same way: one line, the others skip.
            problems += self.check_gcloud_account(run)
            if run is Runner.GKE:
                problems += self.check_adc()
                if self._existing() is None:
                    problems += self.check_blueprint(kinds[0], reservation, need, project, zone)
                else:
                    problems += self.check_existing_cluster(
                        project, kinds[0], tuple(kinds) if route == COMPUTE_CLASS_ROUTE else ()
                    )
            reasons: dict[str, str] = {}
            if run is Runner.TPU_VM:
                # Under OS Login, sudo on the VM needs admin login: tested with the other permissions.
                os_login, os_login_problems = self.check_os_login(project)
                problems += os_login_problems
                if os_login:
                    permissions.setdefault(checks.OS_ADMIN_LOGIN, checks.OS_ADMIN_LOGIN_ROLE)
                    reasons[permissions[checks.OS_ADMIN_LOGIN]] = checks.os_login_reason(project)
            permission_problems = pool.submit(self.check_permissions, project, permissions, reasons)
            problems += self.check_services(project, services)
            if run is Runner.TPU_VM:
                problems += self.check_vm_network(project, sources)
                for kind in kinds:
                    problems += self.check_gcloud_components(kind)
            problems += self.check_quotas(project, zone, run, kinds, need)
            if reservation:
                reservation_problems = self.check_reservation(project, zone, reservation, need)
                if reservation_problems and len(kinds) > 1:
                    # a full or missing reservation is a refusal the create falls through
                    for problem in reservation_problems:
                        self.log.warning("preflight: with %s capacity: %s", kinds[0], problem)
                    reservation_problems = []
            else:
                reservation_problems = []
                self.log.info("%s capacity consumes no reservation: none is checked", capacity)
            problems += permission_problems.result() + reservation_problems
        problems += self.run_dir_claim_lines(context)
        lease_line = self.lease_holder_line(context)
        waiting = lease_wait_seconds()
        if lease_line is not None and (problems or not waiting):
            problems.append(lease_line)
        problems = list(dict.fromkeys(problems))
        if problems:
            for problem in problems:
                self.log.error("preflight: %s", problem)
            raise AirflowFailException(checks.failure_message(problems))
        if lease_line is not None:
            self.wait_for_lease(context, time.time() + waiting, lease_line)
        self.log.info("preflight: all checks passed for %s in %s", run.value, project)
        return {
            "runner": run.value,
            "project": project,
            "services_checked": len(services),
            "permissions_checked": len(permissions),
            "reservation": reservation or None,
            "capacity": capacity,
            "reservation_vms": need.vms if reservation else None,
            **({"existing_cluster": self.existing_cluster} if self._existing() is not None else {}),
        }
