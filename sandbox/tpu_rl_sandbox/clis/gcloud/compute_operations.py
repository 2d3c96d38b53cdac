"""``gcloud compute operations list``: the zone operations of the fake instances
(``world/instances.py``), with gcloud's scope flags, filter and formats."""

from __future__ import annotations

from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world import instances


class OperationsCommands(GcloudCall):
    """``gcloud compute operations``."""

    def cmd_compute_operations_list(self, parsed: GcloudParse) -> int:
        """Zonal operations of ``--zones`` (every zone when it is given empty or no scope flag is);
        the sandbox keeps no regional or global ones, so those scopes list none."""
        project = self.project(parsed)
        matches_filter({}, parsed.get("filter"))  # gcloud parses the filter before any call
        if parsed.given & {"regions", "global"}:
            resources: list[dict[str, Any]] = []
        else:
            zones = [z for z in str(parsed.get("zones") or "").split(",") if z] or None
            resources = instances.operations(self.store.read("operations"), project, zones)
        names = set(parsed.positionals.get("NAME") or [])
        resources = [
            op
            for op in resources
            if (not names or op["name"] in names) and matches_filter(op, parsed.get("filter"))
        ]
        limit = parsed.get("limit")
        if limit:
            resources = resources[: int(limit)]
        if parsed.get("format"):
            self.out(formatted(resources, parsed.get("format")))
        elif resources:
            rows = [["NAME", "TYPE", "TARGET", "HTTP_STATUS", "STATUS", "TIMESTAMP"]]
            rows += [
                [
                    op["name"],
                    op["operationType"],
                    op["targetLink"].split("/zones/", 1)[-1],
                    "200",
                    op["status"],
                    op["insertTime"],
                ]
                for op in resources
            ]
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0
