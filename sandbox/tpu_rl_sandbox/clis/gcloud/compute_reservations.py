"""``gcloud compute reservations describe`` and whether VMs or TPU nodes can consume a reservation
(the sandbox settings define the reservations)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, unspecified_attribute
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.settings import load_settings


class ReservationsCommands(GcloudCall):
    """``gcloud compute reservations``."""

    def _reservations_in_use(
        self, docs: Mapping[str, dict[str, Any]], project: str, zone: str, name: str
    ) -> int:
        """VMs and GKE TPU nodes of ``project`` in ``zone`` consuming reservation ``name``."""
        used = 0
        for record in docs.get("vms", {}).values():
            affinity = record.get("reservationAffinity", {})
            if (
                record.get("project") == project
                and record.get("zone") == zone
                and affinity.get("type") == "specific"
                and str(affinity.get("reservation") or "").rsplit("/", 1)[-1] == name
            ):
                used += 1
        for cluster in docs.get("clusters", {}).values():
            if (
                cluster.get("project") != project
                or not cluster.get("exists", True)
                or cluster.get("zone") != zone
            ):
                continue
            for pool in cluster.get("node_pools", []):
                if pool.get("reservation") == name and not pool.get("failed"):
                    used += int(pool.get("nodes") or 0)
        return used

    def _reservation_resource(
        self, project: str, zone: str, name: str, spec: dict[str, Any], in_use: int
    ) -> dict[str, Any]:
        """A Compute Engine ``Reservation`` (v1 REST; int64 counts print as strings)."""
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        return {
            "creationTimestamp": "2026-01-05T09:00:00.000-08:00",
            "deploymentType": "DENSE",
            "id": str(int(hashlib.sha256(f"{project}/{zone}/{name}".encode()).hexdigest()[:15], 16)),
            "kind": "compute#reservation",
            "name": name,
            "selfLink": f"{base}/reservations/{name}",
            "shareSettings": {"shareType": "LOCAL"},
            "specificReservation": {
                "assuredCount": str(spec["count"]),
                "count": str(spec["count"]),
                "inUseCount": str(in_use),
                "instanceProperties": {"machineType": spec["machine_type"]},
            },
            "specificReservationRequired": bool(spec.get("specific_reservation_required", True)),
            "status": spec.get("status", "READY"),
            "zone": base,
        }

    def cmd_compute_regions_describe(self, parsed: GcloudParse) -> int:
        """``gcloud compute regions describe REGION``: the Region resource (compute v1) with its
        ``quotas`` (metric, limit, usage), the limits from the sandbox setting ``region_quotas``."""
        project = self.project(parsed)
        region = str(parsed.positionals["NAME"])
        path = f"projects/{project}/regions/{region}"
        self._require_permission("compute.regions.get", project, path)
        if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", region):
            raise GcloudError(f"Could not fetch resource:\n - The resource '{path}' was not found")
        quotas = [
            {"limit": float(limit), "metric": metric, "usage": 0.0}
            for metric, limit in sorted(load_settings(self.layout).region_quotas.items())
        ]
        resource = {
            "kind": "compute#region",
            "name": region,
            "quotas": quotas,
            "selfLink": f"https://www.googleapis.com/compute/v1/{path}",
            "status": "UP",
        }
        self.out(formatted(resource, parsed.get("format")))
        return 0

    def cmd_compute_reservations_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["RESERVATION"])
        zone = parsed.get("zone") or self.env.get("CLOUDSDK_COMPUTE_ZONE")
        if not zone:
            raise unspecified_attribute("reservation", "zone", "compute/zone")
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        self._require_permission("compute.reservations.get", project, path)
        spec = load_settings(self.layout).reservation(str(zone), name)
        if spec is None:
            raise GcloudError(f"Could not fetch resource:\n - The resource '{path}' was not found")
        with self.store.txn() as txn:
            docs = {doc: txn.doc(doc) for doc in ("vms", "clusters")}
            in_use = self._reservations_in_use(docs, project, str(zone), name)
        self.out(
            formatted(
                self._reservation_resource(project, str(zone), name, spec, in_use), parsed.get("format")
            )
        )
        return 0

    def _reservation_problem(
        self,
        docs: Mapping[str, dict[str, Any]],
        project: str,
        zone: str,
        reservation: str,
        machine_type: str,
        count: int,
    ) -> str | None:
        """Why ``count`` VMs of ``machine_type`` cannot consume ``reservation`` (GCE's
        CONDITION_NOT_MET texts, as kubernetes/autoscaler's gce client classifies them), or None."""
        name = reservation.rsplit("/", 1)[-1]
        spec = load_settings(self.layout).reservation(zone, name)
        if spec is None:
            return f"Specified reservation '{name}' does not exist."
        if spec.get("status", "READY") != "READY":
            return (
                f"Cannot insert instance to a reservation with status: {spec['status']}, as it requires "
                "reservation to be in READY state."
            )
        if spec["machine_type"] != machine_type:
            return f"No available resources in specified reservations '{name}'"
        if self._reservations_in_use(docs, project, zone, name) + count > int(spec["count"]):
            return f"Specified reservation '{name}' does not have available resources for the request."
        return None
