"""``gcloud container clusters list|describe|get-credentials``: the clusters ``gcluster deploy``
made."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world import existing_clusters, inventory


class ClustersCommands(GcloudCall):
    """``gcloud container clusters``."""

    def _cluster_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        pools = inventory.gke_node_pools(record)
        return {
            "name": record["name"],
            "location": record["region"],
            "zone": record["region"],
            "locations": [record["zone"]],
            "status": existing_clusters.status(record),
            "resourceLabels": dict(record.get("labels", {})),
            "createTime": record["created"],
            "currentMasterVersion": existing_clusters.gke_version(record),
            **existing_clusters.workload_identity_config(record),
            **({"autopilot": {"enabled": True}} if record.get("autopilot") else {}),
            # container v1 Cluster.autoscaling (ClusterAutoscaling: enableNodeAutoprovisioning,
            # resourceLimits), as a test sets it on the record
            **({"autoscaling": dict(record["autoscaling"])} if record.get("autoscaling") else {}),
            "currentNodeCount": sum(p["initialNodeCount"] for p in pools),
            "endpoint": inventory.external_ip(record["name"]),
            "nodePools": pools,
            "selfLink": f"https://container.googleapis.com/v1/projects/{record['project']}/locations/{record['region']}/clusters/{record['name']}",
        }

    def _cluster(self, parsed: GcloudParse, verb: str) -> dict[str, Any]:
        project = self.project(parsed)
        name = str(parsed.positionals["NAME"])
        location = parsed.get("location") or parsed.get("region") or parsed.get("zone")
        if not location:
            raise GcloudError(
                "One of [--location, --region, --zone] must be supplied: Please specify location.", code=2
            )
        record = inventory.find_cluster(self.store, project, str(location), name)
        if record is None:
            raise GcloudError(
                f"ResponseError: code=404, message=Not found: projects/{project}/locations/{location}/clusters/{name}.\n"
                f"No cluster named '{name}' in {project}."
            )
        del verb
        return record

    def cmd_container_clusters_list(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        location = parsed.get("location") or parsed.get("region") or parsed.get("zone")
        resources = []
        for record in self.store.read("clusters").values():
            if record["project"] != project or not record.get("exists", True):
                continue
            if location and location not in (record["region"], record["zone"]):
                continue
            resource = self._cluster_resource(record)
            if matches_filter(resource, parsed.get("filter")):
                resources.append(resource)
        resources.sort(key=lambda r: r["name"])
        if parsed.get("format"):
            self.out(formatted(resources, parsed.get("format")))
        elif resources:
            rows = [
                [
                    "NAME",
                    "LOCATION",
                    "MASTER_VERSION",
                    "MASTER_IP",
                    "MACHINE_TYPE",
                    "NODE_VERSION",
                    "NUM_NODES",
                    "STATUS",
                ]
            ]
            rows += [
                [
                    r["name"],
                    r["location"],
                    r["currentMasterVersion"],
                    r["endpoint"],
                    r["nodePools"][0]["config"]["machineType"] if r["nodePools"] else "",
                    r["currentMasterVersion"],
                    str(r["currentNodeCount"]),
                    r["status"],
                ]
                for r in resources
            ]
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    def cmd_container_clusters_describe(self, parsed: GcloudParse) -> int:
        record = self._cluster(parsed, "describe")
        self.out(formatted(self._cluster_resource(record), parsed.get("format")))
        return 0

    def cmd_container_clusters_get_credentials(self, parsed: GcloudParse) -> int:
        record = self._cluster(parsed, "get-credentials")
        self.err("Fetching cluster endpoint and auth data.\n")
        kubeconfig = Path(
            self.env.get("KUBECONFIG") or Path(self.env.get("HOME", str(Path.home()))) / ".kube" / "config"
        )
        context = f"gke_{record['project']}_{record['region']}_{record['name']}"
        import yaml

        try:
            config = yaml.safe_load(kubeconfig.read_text()) or {}
        except (OSError, yaml.YAMLError):
            config = {}
        config.setdefault("apiVersion", "v1")
        config.setdefault("kind", "Config")
        config["clusters"] = [c for c in config.get("clusters", []) if c.get("name") != context] + [
            {"name": context, "cluster": {"server": f"https://{inventory.external_ip(record['name'])}"}}
        ]
        config["contexts"] = [c for c in config.get("contexts", []) if c.get("name") != context] + [
            {"name": context, "context": {"cluster": context, "user": context}}
        ]
        config["users"] = [u for u in config.get("users", []) if u.get("name") != context] + [
            {"name": context, "user": {"exec": {"command": "gke-gcloud-auth-plugin"}}}
        ]
        config["current-context"] = context
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.err(f"kubeconfig entry generated for {record['name']}.\n")
        return 0
