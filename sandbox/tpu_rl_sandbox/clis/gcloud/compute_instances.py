"""``gcloud [alpha] compute instances create|delete|start|stop|describe|list``: the fake VMs (their
records in the sandbox state, their folders: a VM booted from a custom image gets its files), their
lifecycle states with the zone operations that change them (``world/instances.py``), and their
preemption."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import Mapping
from typing import Any

from tpu_rl_sandbox.clis.gcloud.compute_images import ImagesCommands
from tpu_rl_sandbox.clis.gcloud.compute_networks import NetworksCommands
from tpu_rl_sandbox.clis.gcloud.compute_reservations import ReservationsCommands
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.clis.gcloud.values import parse_labels
from tpu_rl_sandbox.world import capacity, instances, inventory, vpc
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.timescale import capacity_seconds

DEFAULT_SCOPES = [
    "devstorage.read_only",
    "logging.write",
    "monitoring.write",
    "service.management.readonly",
    "servicecontrol",
    "trace.append",
]
SCOPE_ALIASES = {
    "https://www.googleapis.com/auth/cloud-platform": "cloud-platform",
    "https://www.googleapis.com/auth/devstorage.read_write": "storage-rw",
    "https://www.googleapis.com/auth/devstorage.full_control": "storage-full",
    "https://www.googleapis.com/auth/devstorage.read_only": "storage-ro",
}


# The boot disk types each machine series takes, where the sources say (what a create with another
# --boot-disk-type is refused); a series not listed takes any. Written from Compute Engine's and
# Cloud TPU's pages, independently of the provider's choice (spec/cluster.py):
# - ct6e: Hyperdisk Balanced only. Cloud TPU "Storage options for TPU data"
#   (docs.cloud.google.com/tpu/docs/storage-options): v6e takes Hyperdisk Balanced and Hyperdisk ML
#   and no Persistent Disk; Compute Engine "About Hyperdisk Balanced": Hyperdisk Balanced (and its
#   High Availability variant) are the only Hyperdisk boot disk types, TPU VMs included. Direct.
# - n4, c4: Hyperdisk Balanced. Indirect: Red Hat OpenShift's GCP PD CSI page ("regular persistent
#   disks are not available on N4/C3 VMs"), nextflow-io/nextflow#6841 (C4 and N4 families take no
#   pd-balanced), DataBiosphere/dsub#301 (n4 refused with pd-standard).
# - c3: no pd-standard (GoogleCloudPlatform/cluster-toolkit#1601's precondition); Red Hat's page says
#   no Persistent Disk at all: the sources differ, so the sandbox refuses only what both say.
# - n1, n2, n2d, e2: Persistent Disk, no Hyperdisk Balanced (Compute Engine "About Hyperdisk": "If a
#   machine series doesn't support Hyperdisk, use Persistent Disk"; nextflow#6841 reads its table so).
PERSISTENT_DISK_TYPES = ("pd-standard", "pd-balanced", "pd-ssd", "pd-extreme")
BOOT_DISK_TYPES_TAKEN: dict[str, tuple[str, ...]] = {
    "ct6e": ("hyperdisk-balanced", "hyperdisk-balanced-high-availability"),
    "n4": ("hyperdisk-balanced", "hyperdisk-balanced-high-availability"),
    "c4": ("hyperdisk-balanced", "hyperdisk-balanced-high-availability"),
    "c3": (
        "pd-balanced",
        "pd-ssd",
        "pd-extreme",
        "hyperdisk-balanced",
        "hyperdisk-balanced-high-availability",
    ),
    "n1": PERSISTENT_DISK_TYPES,
    "n2": PERSISTENT_DISK_TYPES,
    "n2d": PERSISTENT_DISK_TYPES,
    "e2": PERSISTENT_DISK_TYPES,
}
# Without --boot-disk-type gcloud sends no diskType and the API documents pd-standard (compute v1
# AttachedDiskInitializeParams.diskType, gcloud 528's generated compute_v1_messages.py). Published
# tutorials create a ct6e VM without the flag, so for a series that takes no pd-standard the sandbox
# does not refuse the create: it records the series' first type (what the API does then is not
# documented; the provider always renders the flag).
DEFAULT_BOOT_DISK_TYPE = "pd-standard"


def boot_disk_type(machine_type: str, given: str | None) -> str:
    """The boot disk type a create gets; one the machine series does not take is refused as the API
    refuses incompatible features, in the form third-party reports quote (terraform-provider-google
    #8148 "Error 400: [e2-medium, local-ssd] features are not compatible for creating instance.",
    dsub#301 "[pd-standard, n4-standard-2] ..." with the disk type first, as here). No source read
    quotes instances.insert's own text for a boot disk type, so the wording is the sandbox's guess;
    the provider reads none of it (an unrecognised failure is a configuration error: toolchain/failures.py)."""
    taken = BOOT_DISK_TYPES_TAKEN.get(machine_type.split("-", 1)[0])
    if given is None:
        return DEFAULT_BOOT_DISK_TYPE if taken is None or DEFAULT_BOOT_DISK_TYPE in taken else taken[0]
    if taken is not None and given not in taken:
        raise GcloudError(
            f"Could not fetch resource:\n - [{given}, {machine_type}] features are not compatible for "
            "creating instance."
        )
    return given


def check_instance_scheduling(parsed: GcloudParse) -> None:
    """gcloud's own check of the scheduling flags before any API call
    (command_lib/compute/instances/flags.py ValidateInstanceScheduling, with max run duration)."""
    if parsed.get("instance-termination-action") and not any(
        parsed.get(flag) for flag in ("provisioning-model", "max-run-duration", "termination-time")
    ):
        raise GcloudError(
            "One of [--provisioning-model, --max-run-duration, --termination-time] must be supplied: "
            "required with argument `--instance-termination-action`."
        )
    if parsed.get("termination-time") and parsed.get("max-run-duration"):
        raise GcloudError(
            "Must specify exactly one of --max-run-duration or --termination-time as these fields are "
            "mutually exclusive."
        )


class InstancesCommands(ReservationsCommands, NetworksCommands, ImagesCommands):
    """``gcloud compute instances``."""

    def _instance_url(self, project: str, zone: str, name: str) -> str:
        return f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/{name}"

    def _scopes(self, raw: str | None) -> list[str]:
        if not raw:
            return list(DEFAULT_SCOPES)
        scopes: list[str] = []
        for item in raw.split(","):
            item = item.strip()
            if item == "default":
                scopes += DEFAULT_SCOPES
            else:
                scopes.append(
                    SCOPE_ALIASES.get(item, item.rsplit("/", 1)[-1] if item.startswith("https://") else item)
                )
        return scopes

    def cmd_alpha_compute_instances_create(self, parsed: GcloudParse) -> int:
        """The alpha track's create: the GA one plus ``--provisioning-model=FLEX_START``."""
        return self.cmd_compute_instances_create(parsed)

    def cmd_compute_instances_create(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        names = list(parsed.positionals["INSTANCE_NAMES"])
        zone = self.zone(parsed, names[0])
        check_instance_scheduling(parsed)
        affinity = parsed.get("reservation-affinity")
        if affinity == "specific" and not parsed.get("reservation"):
            raise GcloudError(
                "Missing required argument [--reservation]: The name of the reservation is required when "
                "--reservation-affinity=specific."
            )
        size = str(parsed.get("boot-disk-size") or "10GB")
        if not re.fullmatch(r"\d+(GB|TB|G|T)?", size):
            raise GcloudError(f"argument --boot-disk-size: Failed to parse '{size}' as disk size.", code=2)
        labels = parse_labels(parsed.get("labels"))
        for name in names:
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
                raise GcloudError(
                    f"Could not fetch resource:\n - Invalid value for field 'resource.name': '{name}'. Must be a match of "
                    "regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'"
                )
        fault = self.faults().fire("deploy")
        if fault is not None:
            if fault.transient:
                raise GcloudError(
                    f"Could not fetch resource:\n - The zone 'projects/{project}/zones/{zone}' does not have enough "
                    "resources available to fulfill the request.  Try a different zone, or try again later. "
                    "(ZONE_RESOURCE_POOL_EXHAUSTED)"
                )
            raise GcloudError(
                f"Could not fetch resource:\n - Invalid value for field 'resource.reservationAffinity': Reservation "
                f"'projects/{project}/zones/{zone}/reservations/{parsed.get('reservation') or 'unknown'}' does not exist "
                "or is not usable by this instance."
            )
        self._require_permission(
            "compute.instances.create", project, f"projects/{project}/zones/{zone}/instances/{names[0]}"
        )
        # Without --network the interface goes on the project's `default` network
        # (api_lib/compute/instances/utils.py CreateNetworkInterfaceMessage: "By default interface is
        # attached to default network");
        # the insert fails with the API's 404 when that network does not exist.
        network = str(parsed.get("network") or vpc.DEFAULT_NETWORK)
        if network not in vpc.read_vpc(self.store, project)["networks"]:
            raise self._network_missing(project, network)
        machine_type = str(parsed.get("machine-type") or "n1-standard-1")
        disk_type = boot_disk_type(machine_type, parsed.get("boot-disk-type"))
        # a custom image of the sandbox (--image/--image-family of --image-project) gives the boot
        # disk its files; Google's images a bare one
        image_project = str(parsed.get("image-project") or project)
        source_image = self.boot_source(image_project, parsed.get("image"), parsed.get("image-family"))
        tpu_vfio = self.binds_tpu_vfio(image_project, parsed.get("image-family"), source_image)
        settings = load_settings(self.layout)
        provisioning_model = parsed.get("provisioning-model") or "STANDARD"
        if machine_type.startswith("ct"):
            # the TPU capacity of this kind the zone cannot give now (setting tpu_capacity_out)
            kind = capacity.requested_kind(str(provisioning_model), affinity)
            refused = capacity.refusal(settings.tpu_capacity_out, project, zone, kind, settings.region_quotas)
            if refused is not None:
                raise GcloudError(f"Could not fetch resource:\n - {refused}")
        phases = instances.start_phases(
            settings.minute_seconds,
            settings.capacity_minutes,
            machine_type=machine_type,
            provisioning_model=provisioning_model,
            created=True,
        )
        phases, after_hold = instances.until_held(phases, settings.held_vm_states)
        created: list[dict[str, Any]] = []
        requested = time.time()
        running_at = requested
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            docs = {"vms": vms, "clusters": txn.doc("clusters")}
            for name in names:
                key = f"{project}/{zone}/{name}"
                if key in vms:
                    raise GcloudError(
                        f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
                    )
                if affinity == "specific":
                    problem = self._reservation_problem(
                        docs, project, zone, str(parsed.get("reservation")), machine_type, 1
                    )
                    if problem is not None:
                        raise GcloudError(f"Could not fetch resource:\n - {problem}")
                record = {
                    "name": name,
                    "id": instances.new_id(),
                    "project": project,
                    "zone": zone,
                    "status": phases[0][0],
                    "machineType": machine_type,
                    "network": network,
                    "labels": labels,
                    "scopes": self._scopes(parsed.get("scopes")),
                    "serviceAccount": parsed.get("service-account")
                    or f"{inventory.project_number(project)}-compute@developer.gserviceaccount.com",
                    "image": {
                        "project": parsed.get("image-project"),
                        "family": parsed.get("image-family"),
                        "image": parsed.get("image"),
                        "tpuVfio": tpu_vfio,
                    },
                    "bootDiskSize": size,
                    "bootDiskType": disk_type,
                    "scheduling": {
                        "provisioningModel": provisioning_model,
                        "instanceTerminationAction": parsed.get("instance-termination-action"),
                        "onHostMaintenance": parsed.get("maintenance-policy") or "MIGRATE",
                        "maxRunDuration": parsed.get("max-run-duration"),
                    },
                    "reservationAffinity": {
                        "type": affinity or "any",
                        "reservation": parsed.get("reservation"),
                    },
                    "created": instances.api_time(requested),
                }
                running_at = instances.schedule(record, phases, requested)
                vms[key] = record
                created.append(record)
                record["operation"] = instances.add_operation(
                    txn, project, zone, "insert", name, record["id"], started=requested, user=self.account()
                )["name"]
                history = txn.doc("vm_history")
                history.setdefault(key, []).append(
                    {"machineType": machine_type, "created": time.time(), "deleted": None, "programs": []}
                )
                vm_dir = self.layout.vm_dir(name)
                vm_dir.mkdir(parents=True, exist_ok=True)
                if source_image is not None:
                    record["image"]["source"] = source_image["name"]
                    self.copy_boot_disk(source_image, vm_dir)
            txn.save("vms")
            txn.save("vm_history")
        # gcloud waits for the insert operation: the VM goes PENDING (a TPU), PROVISIONING, STAGING,
        # unbilled, and the operation is done once it is RUNNING
        running_at = self._through_held_states(
            project, zone, [record["name"] for record in created], phases[-1][0], after_hold, running_at
        )
        time.sleep(max(0.0, running_at - time.time()))
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for record in created:
                stored = vms.get(f"{project}/{zone}/{record['name']}")
                if stored is not None:
                    op_name = stored.pop("operation", "")
                    instances.settle(stored, running_at)
                    record.update(stored)
                    instances.finish_operation(txn, project, zone, op_name, running_at)
            txn.save("vms")
        for record in created:
            self.err(f"Created [{self._instance_url(project, zone, record['name'])}].\n")
        if parsed.get("format"):
            self.out(formatted([self._instance_resource(r) for r in created], parsed.get("format")))
        else:
            rows = [["NAME", "ZONE", "MACHINE_TYPE", "PREEMPTIBLE", "INTERNAL_IP", "EXTERNAL_IP", "STATUS"]]
            rows += [
                [
                    r["name"],
                    zone,
                    r["machineType"],
                    "",
                    "10.128.0.5",
                    inventory.external_ip(r["name"]),
                    instances.settled(r)["status"],
                ]
                for r in created
            ]
            self.out(table(rows))
        return 0

    def _instance_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        project, zone, name = record["project"], record["zone"], record["name"]
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        affinity = record.get("reservationAffinity", {})
        record = instances.settled(record)
        running = record["status"] == "RUNNING"
        resource = {
            # a record of an older sandbox has no id: a stable one from its name
            "id": record.get("id")
            or str(int(hashlib.sha256(f"{project}/{zone}/{name}".encode()).hexdigest()[:15], 16)),
            "kind": "compute#instance",
            "name": name,
            "status": record["status"],
            "zone": base,
            "machineType": f"{base}/machineTypes/{record['machineType']}",
            "labels": record.get("labels", {}),
            "creationTimestamp": record["created"],
            "selfLink": f"{base}/instances/{name}",
            "networkInterfaces": [
                {
                    "name": "nic0",
                    "networkIP": "10.128.0.5",
                    # A stopped VM's ephemeral external IP is released; it gets one again at start.
                    "accessConfigs": [
                        {
                            "name": "External NAT",
                            **({"natIP": inventory.external_ip(name)} if running else {}),
                        }
                    ],
                }
            ],
            "scheduling": {k: v for k, v in record.get("scheduling", {}).items() if v},
            "serviceAccounts": [
                {
                    "email": record.get("serviceAccount"),
                    "scopes": [f"https://www.googleapis.com/auth/{s}" for s in record.get("scopes", [])],
                }
            ],
            # an attached disk names its disk, not its type (compute v1 AttachedDisk: `type` is
            # PERSISTENT or SCRATCH; initializeParams is input only): `compute disks describe` shows it
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "type": "PERSISTENT",
                    "source": f"{base}/disks/{name}",
                    "diskSizeGb": re.sub(r"\D", "", record.get("bootDiskSize", "10")),
                }
            ],
        }
        for stamp in ("lastStartTimestamp", "lastStopTimestamp"):
            if record.get(stamp):
                resource[stamp] = record[stamp]
        if affinity.get("type") == "specific":
            resource["reservationAffinity"] = {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [affinity.get("reservation")],
            }
        return resource

    def cmd_compute_instances_delete(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        names = list(parsed.positionals["INSTANCE_NAMES"])
        zone = self.zone(parsed, names[0])
        existing = self.store.read("vms")
        missing = [n for n in names if f"{project}/{zone}/{n}" not in existing]
        if missing:
            raise GcloudError(
                "Could not fetch resource:\n"
                + "\n".join(
                    f" - The resource 'projects/{project}/zones/{zone}/instances/{n}' was not found"
                    for n in missing
                )
            )
        fault = self.faults().fire("destroy")
        if fault is not None:
            resource = f"projects/{project}/zones/{zone}/instances/{names[0]}"
            raise GcloudError(
                f"Could not fetch resource:\n - The resource '{resource}' is not ready"
                if fault.transient
                else f"Could not fetch resource:\n - Required 'compute.instances.delete' permission for '{resource}'"
            )
        # The delete: the VM goes STOPPING at once (its billing ends; its processes end), then it
        # is gone when the operation is done.
        settings = load_settings(self.layout)
        started = time.time()
        stopping = capacity_seconds(settings.minute_seconds, "vm_stopping", settings.capacity_minutes)
        deleting: dict[str, str] = {}
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for name in names:
                record = vms.get(f"{project}/{zone}/{name}")
                if record is None:
                    continue
                instances.settle(record, started)
                instances.schedule(record, [("STOPPING", 0.0)], started)
                instances.settle(record, started)
                deleting[name] = instances.add_operation(
                    txn,
                    project,
                    zone,
                    "delete",
                    name,
                    str(record.get("id", "")),
                    started=started,
                    user=self.account(),
                )["name"]
            txn.save("vms")
        from tpu_rl_sandbox.machines import dockerd

        for name in names:
            dockerd.stop_all(self.layout.vm_dir(name))
        time.sleep(stopping)
        ended = time.time() if self._wait_while_held("STOPPING") else started + stopping
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            history = txn.doc("vm_history")
            for name in names:
                vms.pop(f"{project}/{zone}/{name}", None)
                shutil.rmtree(self.layout.vm_dir(name), ignore_errors=True)
                lives = history.get(f"{project}/{zone}/{name}") or []
                if lives and lives[-1]["deleted"] is None:
                    lives[-1]["deleted"] = time.time()
                if name in deleting:
                    instances.finish_operation(txn, project, zone, deleting[name], ended)
            txn.save("vms")
            txn.save("vm_history")
        for name in names:
            self.err(f"Deleted [{self._instance_url(project, zone, name)}].\n")
        return 0

    def _through_held_states(
        self,
        project: str,
        zone: str,
        names: list[str],
        held: str,
        after_hold: list[tuple[str, float]],
        held_from: float,
    ) -> float:
        """A create's wait through each held state (sandbox setting ``held_vm_states``): once its
        hold ends, the VMs go on through their next states from that moment. The moment they run."""
        moment = held_from
        while after_hold:
            time.sleep(max(0.0, moment - time.time()))
            self._wait_while_held(held)
            scheduled, after_hold = instances.until_held(
                after_hold, load_settings(self.layout).held_vm_states
            )
            held = scheduled[-1][0]
            released = time.time()
            with self.store.txn() as txn:
                vms = txn.doc("vms")
                for name in names:
                    record = vms.get(f"{project}/{zone}/{name}")
                    if record is not None:
                        instances.settle(record, released)
                        moment = instances.schedule(record, scheduled, released)
                txn.save("vms")
        return moment

    def _wait_while_held(self, state: str) -> bool:
        """Wait while ``state`` is a held VM state (at most the setting ``hold_seconds``); whether it was."""
        settings = load_settings(self.layout)
        if state not in settings.held_vm_states:
            return False
        deadline = time.monotonic() + settings.hold_seconds
        while state in settings.held_vm_states and time.monotonic() < deadline:
            time.sleep(0.05)
            settings = load_settings(self.layout)
        return True

    def _existing_instances(self, parsed: GcloudParse, verb: str) -> tuple[str, str, list[str]]:
        """The project, zone and names of a start or stop: each VM must exist, the caller needs
        ``compute.instances.<verb>``, and gcloud's wait is simulated (no ``--async``)."""
        project = self.project(parsed)
        names = list(parsed.positionals["INSTANCE_NAMES"])
        zone = self.zone(parsed, names[0])
        for name in names:
            self._vm(project, zone, name)
        self._require_permission(
            f"compute.instances.{verb}", project, f"projects/{project}/zones/{zone}/instances/{names[0]}"
        )
        if parsed.get("async"):
            raise GcloudError(f"sandbox: --async is not simulated for instances {verb}")
        return project, zone, names

    @staticmethod
    def _preempted_spot_tpu(txn: Any, key: str, record: Mapping[str, Any]) -> bool:
        """A Spot TPU VM (``ct*``, ``SPOT``) preempted since it last started (its ``vm_history``)."""
        machine = str(record.get("machineType", "")).rsplit("/", 1)[-1]
        spot = (record.get("scheduling") or {}).get("provisioningModel") == "SPOT"
        lives = txn.doc("vm_history").get(key) or [{}]
        preempted, started = lives[-1].get("preempted") or [0.0], lives[-1].get("started") or [0.0]
        return machine.startswith("ct") and spot and preempted[-1] > started[-1]

    def cmd_compute_instances_start(self, parsed: GcloudParse) -> int:
        """surface/compute/instances/start.py: instances.start on each VM, then one "Updated" line and
        its IPs per VM; starting a RUNNING VM does nothing (the API's operation is done at once)."""
        project, zone, names = self._existing_instances(parsed, "start")
        settings = load_settings(self.layout)
        started = time.time()
        running_at = started
        starting: dict[str, str] = {}
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for name in names:
                record = instances.settle(vms[f"{project}/{zone}/{name}"], started)
                if record["status"] == "RUNNING":
                    continue
                if record["status"] != "TERMINATED":
                    raise GcloudError(
                        f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready"
                    )
                if not settings.spot_tpu_restart and self._preempted_spot_tpu(
                    txn, f"{project}/{zone}/{name}", record
                ):
                    # The refusal's text is the sandbox's: the API's own for this case is not
                    # published (the provider reads only that the start failed).
                    raise GcloudError(
                        f"Could not fetch resource:\n - Instance 'projects/{project}/zones/{zone}/instances/{name}' "
                        "is a Spot TPU VM that was preempted: it cannot be restarted; delete and recreate it"
                    )
                phases = instances.start_phases(
                    settings.minute_seconds,
                    settings.capacity_minutes,
                    machine_type=str(record.get("machineType", "")),
                    provisioning_model=(record.get("scheduling") or {}).get("provisioningModel"),
                    created=False,
                )
                starting[name], done_at = instances.begin_transition(
                    txn, project, zone, name, "start", phases, started, user=self.account()
                )
                running_at = max(running_at, done_at)
            txn.save("vms")
        # gcloud waits for the start operation: PROVISIONING, STAGING (unbilled), then RUNNING
        time.sleep(max(0.0, running_at - time.time()))
        with self.store.txn() as txn:
            instances.finish_transitions(txn, project, zone, starting, running_at)
        for name in names:
            self.err(f"Updated [{self._instance_url(project, zone, name)}].\n")
            self.err("Instance internal IP is 10.128.0.5\n")
            self.err(f"Instance external IP is {inventory.external_ip(name)}\n")
        return 0

    def cmd_compute_instances_stop(self, parsed: GcloudParse) -> int:
        """surface/compute/instances/stop.py: instances.stop on each VM and a wait for the
        operations ("Stopping instance(s) NAME..."), then one "Updated" line per VM; stopping a
        stopped VM returns without errors. Its processes end; its boot disk (and what is on it) stays."""
        project, zone, names = self._existing_instances(parsed, "stop")
        from tpu_rl_sandbox.machines import dockerd

        # The stop: each RUNNING VM goes STOPPING at once (its billing ends, its processes end) and
        # is TERMINATED once the guest's shutdown is over; the operation waits for it.
        settings = load_settings(self.layout)
        started = time.time()
        stopping = capacity_seconds(settings.minute_seconds, "vm_stopping", settings.capacity_minutes)
        stops: dict[str, str] = {}
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for name in names:
                record = instances.settle(vms[f"{project}/{zone}/{name}"], started)
                if record["status"] != "RUNNING":
                    continue
                stops[name], _ = instances.begin_transition(
                    txn,
                    project,
                    zone,
                    name,
                    "stop",
                    [("STOPPING", stopping), ("TERMINATED", 0.0)],
                    started,
                    user=self.account(),
                )
            txn.save("vms")
        for name in stops:
            dockerd.stop_all(self.layout.vm_dir(name))
        if stops:
            time.sleep(stopping)
        with self.store.txn() as txn:
            instances.finish_transitions(txn, project, zone, stops, started + stopping)
        self.err(f"Stopping instance(s) {', '.join(names)}...done.\n")
        for name in names:
            self.err(f"Updated [{self._instance_url(project, zone, name)}].\n")
        return 0

    def _preempt_vm(self, project: str, zone: str, name: str) -> None:
        """Compute Engine preempts the VM as its ``instanceTerminationAction`` says: DELETE deletes
        it (its boot disk too: autoDelete), STOP leaves it TERMINATED with its boot disk (so what
        was installed on it). ``vm_history`` notes when."""
        now = time.time()
        from tpu_rl_sandbox.machines import dockerd

        dockerd.stop_all(self.layout.vm_dir(name))  # the machine shuts down: its containers end
        settings = load_settings(self.layout)
        stopping = capacity_seconds(settings.minute_seconds, "vm_stopping", settings.capacity_minutes)
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            history = txn.doc("vm_history")
            key = f"{project}/{zone}/{name}"
            record = vms.get(key)
            if record is None:
                return
            # Compute Engine's system operation of a preemption ("List preemption history":
            # operationType="compute.instances.preempted"): the VM goes STOPPING as it starts
            instances.add_operation(
                txn,
                project,
                zone,
                "compute.instances.preempted",
                name,
                str(record.get("id", "")),
                started=now,
                ended=now + stopping,
                user="system",
            )
            action = (record.get("scheduling") or {}).get("instanceTerminationAction") or "STOP"
            lives = history.get(key) or []
            if lives:
                lives[-1].setdefault("preempted", []).append(now)
            if action == "DELETE":
                vms.pop(key)
                shutil.rmtree(self.layout.vm_dir(name), ignore_errors=True)
                if lives:
                    lives[-1]["deleted"] = now
            else:
                instances.settle(record, now)
                instances.schedule(record, [("STOPPING", stopping), ("TERMINATED", 0.0)], now)
                instances.settle(record, now)
            txn.save("vms")
            txn.save("vm_history")

    def _vm(self, project: str, zone: str, name: str) -> dict[str, Any]:
        record = self.store.read("vms").get(f"{project}/{zone}/{name}")
        if record is None:
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        return instances.settled(record)

    def cmd_compute_instances_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["NAME"])
        record = self._vm(project, self.zone(parsed, name), name)
        self.out(formatted(self._instance_resource(record), parsed.get("format")))
        return 0

    def cmd_compute_disks_describe(self, parsed: GcloudParse) -> int:
        """A VM's boot disk (named after the VM: compute v1 AttachedDiskInitializeParams.diskName),
        its ``type`` the disk type's URL as compute v1 Disk.type gives it; gone with its VM."""
        project = self.project(parsed)
        name = str(parsed.positionals["DISK_NAME"])
        if parsed.get("region"):
            raise GcloudError("sandbox: regional disks are not simulated")
        zone = self.zone(parsed, name)
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        record = self.store.read("vms").get(f"{project}/{zone}/{name}")
        if record is None:
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/disks/{name}' was not found"
            )
        resource = {
            "kind": "compute#disk",
            "name": name,
            "zone": base,
            "sizeGb": re.sub(r"\D", "", record.get("bootDiskSize", "10")),
            "status": "READY",
            "type": f"{base}/diskTypes/{record.get('bootDiskType', DEFAULT_BOOT_DISK_TYPE)}",
            "users": [f"{base}/instances/{name}"],
            "selfLink": f"{base}/disks/{name}",
        }
        self.out(formatted(resource, parsed.get("format")))
        return 0

    def cmd_compute_instances_list(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        zones = [z for z in str(parsed.get("zones") or "").split(",") if z]
        wanted_names = set(parsed.positionals["NAME"])
        resources = []
        for record in self.store.read("vms").values():
            if record["project"] != project or (zones and record["zone"] not in zones):
                continue
            if wanted_names and record["name"] not in wanted_names:
                continue
            resource = self._instance_resource(record)
            if matches_filter(resource, parsed.get("filter")):
                resources.append(resource)
        resources.sort(key=lambda r: r["name"])
        if parsed.get("format"):
            self.out(formatted(resources, parsed.get("format")))
        elif resources:
            rows = [["NAME", "ZONE", "MACHINE_TYPE", "PREEMPTIBLE", "INTERNAL_IP", "EXTERNAL_IP", "STATUS"]]
            rows += [
                [
                    r["name"],
                    r["zone"].rsplit("/", 1)[-1],
                    r["machineType"].rsplit("/", 1)[-1],
                    "",
                    "10.128.0.5",
                    r["networkInterfaces"][0]["accessConfigs"][0].get("natIP", ""),
                    r["status"],
                ]
                for r in resources
            ]
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0
