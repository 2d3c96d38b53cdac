"""``gcloud container node-pools create|list|delete``: a node pool added to, or taken from, a
cluster that exists (one ``gcluster deploy`` made, or one made outside the provider).

The container API's rules the fake keeps (container v1 ``projects.locations.clusters.nodePools``):
the cluster must exist (404) and be RUNNING (an operation on a cluster that is not is refused with
FAILED_PRECONDITION, 400); an Autopilot cluster takes no user node pool (400); a name the cluster
has already is 409 ALREADY_EXISTS; a pool that is not there is 404. A multi-host TPU pool has the
slice's VMs (``--tpu-topology``: chips / chips per VM nodes; GKE's "Plan TPUs" page). gcloud prints
the API's error as ``ResponseError: code=<code>, message=<message>``
(googlecloudsdk/api_lib/container/util.py, as the clusters' 404 in container_clusters.py). The
sandbox's pools do not autoscale: a flex-start pool gets its slice's nodes when it is created, as
the real one does once the training's pods ask for them.
"""

from __future__ import annotations

import time
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.clis.gcloud.values import parse_labels, parse_map
from tpu_rl_sandbox.world import existing_clusters, gke_nodes, inventory
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.timescale import capacity_seconds

CHIPS_PER_VM = {"ct6e-standard-1t": 1, "ct6e-standard-4t": 4, "ct6e-standard-8t": 8}


class NodePoolsCommands(GcloudCall):
    """``gcloud container node-pools``."""

    def _pool_scope(self, parsed: GcloudParse) -> tuple[str, str, str, str]:
        project = self.project(parsed)
        cluster = parsed.get("cluster")
        if not cluster:
            raise GcloudError(
                "The required property [cluster] is not currently set.\nIt can be set on a per-command "
                "basis by re-running your command with the [--cluster] flag."
            )
        location = parsed.get("location") or parsed.get("region") or parsed.get("zone")
        if not location:
            raise GcloudError(
                "One of [--location, --region, --zone] must be supplied: Please specify location.", code=2
            )
        return (
            project,
            str(location),
            str(cluster),
            inventory.cluster_key(project, str(location), str(cluster)),
        )

    def _existing(self, project: str, location: str, cluster: str) -> dict[str, Any]:
        record = inventory.find_cluster(self.store, project, location, cluster)
        if record is None:
            raise GcloudError(
                f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/{cluster}."
            )
        return record

    @staticmethod
    def _pool_url(project: str, location: str, cluster: str, name: str) -> str:
        return (
            f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/"
            f"{cluster}/nodePools/{name}"
        )

    def _bring_up_nodes(self, key: str, pool: dict[str, Any]) -> None:
        """A TPU pool's node VMs, as a ``gcluster deploy``'s TPU pool gets them (world/gke_nodes.py):
        GKE's own work first (``tpu_pool_create``, unbilled), the VMs through PENDING, PROVISIONING
        and STAGING to RUNNING, then booted until their nodes are Ready (``tpu_node_ready``, billed),
        on the time scale (``timescale.CAPACITY_MINUTES``; instant when it is off). The pool is
        added after (``record_pool_events`` then finds its nodes)."""
        settings = load_settings(self.layout)
        time.sleep(capacity_seconds(settings.minute_seconds, "tpu_pool_create", settings.capacity_minutes))
        begin = time.time()
        with self.store.txn() as txn:
            cluster = txn.doc("clusters")[key]
            running_at = gke_nodes.create_nodes(
                txn,
                cluster,
                pool,
                begin=begin,
                minute_seconds=settings.minute_seconds,
                overrides=dict(settings.capacity_minutes),
            )
        time.sleep(max(0.0, running_at - time.time()))
        with self.store.txn() as txn:
            gke_nodes.finish_creates(txn, txn.doc("clusters")[key], pool, running_at)
        time.sleep(capacity_seconds(settings.minute_seconds, "tpu_node_ready", settings.capacity_minutes))

    def _take_down_nodes(self, key: str, pool: dict[str, Any]) -> None:
        """The pool's node VMs deleted: STOPPING (billing ends), then gone, before the pool is. No
        drain is played: the pipeline deletes its pool after its training's pods ended."""
        settings = load_settings(self.layout)
        begin = time.time()
        with self.store.txn() as txn:
            keys = gke_nodes.begin_deletes(txn, txn.doc("clusters")[key], pool, begin)
        stopping = capacity_seconds(settings.minute_seconds, "vm_stopping", settings.capacity_minutes)
        time.sleep(stopping)
        with self.store.txn() as txn:
            gke_nodes.finish_deletes(txn, keys, begin + stopping)

    def cmd_container_node_pools_list(self, parsed: GcloudParse) -> int:
        project, location, cluster, _ = self._pool_scope(parsed)
        record = self._existing(project, location, cluster)
        pools = [p for p in inventory.gke_node_pools(record) if matches_filter(p, parsed.get("filter"))]
        if parsed.get("format"):
            self.out(formatted(pools, parsed.get("format")))
        elif pools:
            rows = [["NAME", "MACHINE_TYPE", "DISK_SIZE_GB", "NODE_VERSION"]]
            version = existing_clusters.gke_version(record)
            rows += [[p["name"], p["config"]["machineType"], "100", version] for p in pools]
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    def _new_pool(self, parsed: GcloudParse, name: str, zone: str) -> dict[str, Any]:
        machine = str(parsed.get("machine-type") or "e2-medium")
        topology = parsed.get("tpu-topology")
        flex = bool(parsed.get("flex-start"))
        nodes_text = parsed.get("max-nodes") if flex else parsed.get("num-nodes")
        nodes = int(nodes_text) if nodes_text not in (None, "") else 3
        if topology:
            if machine not in CHIPS_PER_VM:
                raise GcloudError(
                    f"ResponseError: code=400, message=TPU topology {topology} is not supported by machine type {machine}."
                )
            a, b = (int(x) for x in str(topology).split("x"))
            vms = max(1, a * b // CHIPS_PER_VM[machine])
            if nodes != vms:
                raise GcloudError(
                    f"ResponseError: code=400, message=Node count {nodes} does not match TPU topology {topology} "
                    f"of machine type {machine} ({vms} nodes)."
                )
        affinity = parsed.get("reservation-affinity")
        if affinity == "specific" and not parsed.get("reservation"):
            raise GcloudError("--reservation must be specified with --reservation-affinity=specific", code=2)
        pool: dict[str, Any] = {
            "name": name,
            "machine_type": machine,
            "nodes": nodes,
            "zones": [zone],
            "node_labels": parse_map(
                "gcloud.container.node-pools.create", "node-labels", parsed.get("node-labels")
            ),
            "resource_labels": parse_labels(parsed.get("labels")),
            "reservation": parsed.get("reservation") if affinity == "specific" else None,
            "reservation_affinity": {
                "type": {"none": "NO_RESERVATION", "specific": "SPECIFIC_RESERVATION"}.get(
                    str(affinity), "ANY_RESERVATION"
                )
            },
            "created_by": "gcloud",
            # config.serviceAccount: the Compute Engine default service account when not given
            "service_account": str(
                parsed.get("service-account")
                or f"{inventory.project_number(str(self.project(parsed)))}-compute@developer.gserviceaccount.com"
            ),
        }
        if topology:
            pool["topology"] = str(topology)
            pool["num_slices"] = 1
        if flex or parsed.get("spot"):
            pool["consumption"] = {
                "spot": bool(parsed.get("spot")),
                "enable_flex_start": flex,
                "enable_queued_provisioning": False,
                "auto_repair": parsed.get("enable-autorepair") is not False,
                "static_node_count": None,
                "placement": None,
                "tpu": machine.startswith("ct"),
                "machine_type": machine,
            }
        return pool

    def cmd_container_node_pools_create(self, parsed: GcloudParse) -> int:
        project, location, cluster, key = self._pool_scope(parsed)
        name = str(parsed.positionals["NAME"])
        record = self._existing(project, location, cluster)
        if record.get("autopilot"):
            raise GcloudError(
                "ResponseError: code=400, message=Autopilot clusters do not support mutating node pools."
            )
        if existing_clusters.status(record) != "RUNNING":
            raise GcloudError(
                f"ResponseError: code=400, message=Cluster is not ready: its status is "
                f"{existing_clusters.status(record)}; try again later."
            )
        zones = str(parsed.get("node-locations") or record.get("zone") or "").split(",")
        pool = self._new_pool(parsed, name, zones[0])
        self.err(f"Creating node pool {name}...\n")
        if gke_nodes.is_tpu_pool(pool) and not any(p["name"] == name for p in record.get("node_pools", [])):
            self._bring_up_nodes(key, pool)  # before the pool is listed done (its create's operation)
        with self.store.txn() as txn:
            clusters = txn.doc("clusters")
            current = clusters.get(key)
            if current is None or not current.get("exists", True):
                raise GcloudError(
                    f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/{cluster}."
                )
            before = list(current.get("node_pools", []))
            if any(p["name"] == name for p in before):
                raise GcloudError(
                    f"ResponseError: code=409, message=Already exists: projects/{project}/locations/"
                    f"{location}/clusters/{cluster}/nodePools/{name}."
                )
            current["node_pools"] = [*before, pool]
            clusters[key] = current
            txn.save("clusters")
            gke_nodes.record_pool_events(txn, key, before, current["node_pools"], time.time())
        self.err(
            f"Creating node pool {name}...done.\nCreated [{self._pool_url(project, location, cluster, name)}].\n"
        )
        version = existing_clusters.gke_version(record)
        self.out(
            table(
                [
                    ["NAME", "MACHINE_TYPE", "DISK_SIZE_GB", "NODE_VERSION"],
                    [name, pool["machine_type"], "100", version],
                ]
            )
        )
        return 0

    def cmd_container_node_pools_delete(self, parsed: GcloudParse) -> int:
        project, location, cluster, key = self._pool_scope(parsed)
        name = str(parsed.positionals["NAME"])
        self._existing(project, location, cluster)
        gone = (
            f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/"
            f"{cluster}/nodePools/{name}."
        )
        self.err(f"Deleting node pool {name}...\n")
        pool = next(
            (
                p
                for p in self._existing(project, location, cluster).get("node_pools", [])
                if p["name"] == name
            ),
            None,
        )
        if pool is not None and gke_nodes.is_tpu_pool(pool):
            self._take_down_nodes(key, pool)  # its node VMs go first, then the pool
        with self.store.txn() as txn:
            clusters = txn.doc("clusters")
            current = clusters.get(key)
            before = list((current or {}).get("node_pools", []))
            if current is None or not any(p["name"] == name for p in before):
                raise GcloudError(gone)
            current["node_pools"] = [p for p in before if p["name"] != name]
            clusters[key] = current
            txn.save("clusters")
            gke_nodes.record_pool_events(txn, key, before, current["node_pools"], time.time())
        self.err(
            f"Deleting node pool {name}...done.\nDeleted [{self._pool_url(project, location, cluster, name)}].\n"
        )
        return 0
