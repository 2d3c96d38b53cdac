"""``gcloud compute networks describe`` and ``compute firewall-rules list|create|delete`` over the
fake project's VPC (:mod:`~tpu_rl_sandbox.world.vpc`)."""

from __future__ import annotations

import re
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world import vpc


class NetworksCommands(GcloudCall):
    """``gcloud compute networks`` and ``compute firewall-rules``."""

    def _network_missing(self, project: str, network: str) -> GcloudError:
        """The Compute API's 404 for a network that does not exist, as gcloud prints it."""
        return GcloudError(
            f"Could not fetch resource:\n - The resource 'projects/{project}/global/networks/{network}' was not found"
        )

    def cmd_compute_networks_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["NAME"])
        self._require_permission(
            "compute.networks.get", project, f"projects/{project}/global/networks/{name}"
        )
        record = vpc.read_vpc(self.store, project)["networks"].get(name)
        if record is None:
            raise self._network_missing(project, name)
        self.out(formatted(vpc.network_resource(project, record), parsed.get("format")))
        return 0

    def cmd_compute_firewall_rules_list(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        self._require_permission("compute.firewalls.list", project)
        wanted = set(parsed.positionals["NAME"])
        resources = [
            vpc.firewall_resource(project, rule)
            for name, rule in sorted(vpc.read_vpc(self.store, project)["firewalls"].items())
            if not wanted or name in wanted
        ]
        resources = [r for r in resources if matches_filter(r, parsed.get("filter"))]
        if parsed.get("format"):
            self.out(formatted(resources, parsed.get("format")))
        elif resources:
            rows = [["NAME", "NETWORK", "DIRECTION", "PRIORITY", "ALLOW", "DENY", "DISABLED"]]
            for r in resources:
                allow = ",".join(
                    e["IPProtocol"] + (":" + ",".join(e["ports"]) if e.get("ports") else "")
                    for e in r.get("allowed", [])
                )
                deny = ",".join(e["IPProtocol"] for e in r.get("denied", []))
                rows.append(
                    [
                        r["name"],
                        r["network"].rsplit("/", 1)[-1],
                        r["direction"],
                        str(r["priority"]),
                        allow,
                        deny,
                        str(r["disabled"]),
                    ]
                )
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    @staticmethod
    def _firewall_entries(raw: str) -> list[dict[str, Any]]:
        """api_lib/compute/firewalls_utils.py ParseRules: ``PROTOCOL[:PORT[-PORT]]`` each."""
        entries = []
        for spec in [item for item in raw.split(",") if item]:
            match = re.fullmatch(r"(?P<protocol>[a-zA-Z0-9+.-]+)(:(?P<ports>\d+(-\d+)?))?", spec)
            if not match:
                raise GcloudError(
                    f"Firewall rules must be of the form PROTOCOL[:PORT[-PORT]]; received [{spec}]."
                )
            entry: dict[str, Any] = {"IPProtocol": match.group("protocol")}
            if match.group("ports"):
                entry["ports"] = [match.group("ports")]
            entries.append(entry)
        return entries

    def cmd_compute_firewall_rules_create(self, parsed: GcloudParse) -> int:
        """surface/compute/firewall_rules/create.py _CreateFirewall: --rules and --allow exclusive,
        --action only with --rules; INGRESS unless EGRESS/OUT; the network must exist (the API's 404);
        with no source given, the rule's source is 0.0.0.0/0 (firewalls_utils.AddCommonArgs)."""
        project = self.project(parsed)
        name = str(parsed.positionals["NAME"])
        if parsed.get("rules") and parsed.get("allow"):
            raise GcloudError("Can NOT specify --rules and --allow in the same request.")
        if bool(parsed.get("action")) ^ bool(parsed.get("rules")):
            raise GcloudError("Must specify --rules with --action.")
        network = str(parsed.get("network") or vpc.DEFAULT_NETWORK)
        self._require_permission(
            "compute.firewalls.create", project, f"projects/{project}/global/firewalls/{name}"
        )
        key = "denied" if parsed.get("action") == "DENY" else "allowed"
        entries = self._firewall_entries(str(parsed.get("rules") or parsed.get("allow") or ""))

        def listed(flag: str) -> list[str]:
            return [item for item in str(parsed.get(flag) or "").split(",") if item]

        sources, source_tags = listed("source-ranges"), listed("source-tags")
        direction = "EGRESS" if parsed.get("direction") in ("EGRESS", "OUT") else "INGRESS"
        rule = {
            "name": name,
            "network": network,
            "direction": direction,
            "priority": int(parsed.get("priority") or vpc.DEFAULT_PRIORITY),
            "sourceRanges": sources or ([] if source_tags or direction == "EGRESS" else ["0.0.0.0/0"]),
            "sourceTags": source_tags,
            "targetTags": listed("target-tags"),
            "targetServiceAccounts": listed("target-service-accounts"),
            key: entries,
            "description": parsed.get("description") or "",
            "disabled": bool(parsed.get("disabled")),
        }
        with self.store.txn() as txn:
            state = vpc.vpc_for_update(txn, project)
            if network not in state["networks"]:
                raise self._network_missing(project, network)
            if name in state["firewalls"]:
                raise GcloudError(
                    f"Could not fetch resource:\n - The resource 'projects/{project}/global/firewalls/{name}' already exists"
                )
            state["firewalls"][name] = rule
            txn.save(vpc.DOC)
        self.err(
            f"Creating firewall...⠹Created [https://www.googleapis.com/compute/v1/projects/{project}/global/firewalls/{name}].\n"
            "Creating firewall...done.\n"
        )
        return 0

    def cmd_compute_firewall_rules_delete(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        names = list(parsed.positionals["NAME"])
        with self.store.txn() as txn:
            state = vpc.vpc_for_update(txn, project)
            for name in names:
                self._require_permission(
                    "compute.firewalls.delete", project, f"projects/{project}/global/firewalls/{name}"
                )
                if name not in state["firewalls"]:
                    raise GcloudError(
                        f"Could not fetch resource:\n - The resource 'projects/{project}/global/firewalls/{name}' was not found"
                    )
                del state["firewalls"][name]
            txn.save(vpc.DOC)
        for name in names:
            self.err(
                f"Deleted [https://www.googleapis.com/compute/v1/projects/{project}/global/firewalls/{name}].\n"
            )
        return 0
