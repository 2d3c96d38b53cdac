"""``gcloud compute project-info describe|add-metadata``: the project's metadata."""

from __future__ import annotations

from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.clis.gcloud.values import parse_map
from tpu_rl_sandbox.world import inventory
from tpu_rl_sandbox.world.settings import load_settings


class ProjectInfoCommands(GcloudCall):
    """``gcloud compute project-info``."""

    def _project_metadata(self, project: str) -> dict[str, Any]:
        return dict(self.store.read("project_metadata").get(project, {}))

    def cmd_compute_project_info_describe(self, parsed: GcloudParse) -> int:
        """A Compute API Project: ``commonInstanceMetadata.items`` (``ssh-keys`` as one newline-joined
        value, as compute/ssh_utils writes it) and its ``quotas`` (compute v1 ``Project.quotas``:
        metric, limit, usage; the limits from the sandbox setting ``project_quotas``)."""
        project = self.project(parsed)
        self._require_permission("compute.projects.get", project)
        items = []
        for key, value in sorted(self._project_metadata(project).items()):
            items.append({"key": key, "value": "\n".join(value) if isinstance(value, list) else str(value)})
        resource = {
            "kind": "compute#project",
            "name": project,
            "id": str(inventory.project_number(project)),
            "commonInstanceMetadata": {"kind": "compute#metadata", "items": items},
            "quotas": [
                {"limit": float(limit), "metric": metric, "usage": 0.0}
                for metric, limit in sorted(load_settings(self.layout).project_quotas.items())
            ],
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}",
        }
        self.out(formatted(resource, parsed.get("format")))
        return 0

    def cmd_compute_project_info_add_metadata(self, parsed: GcloudParse) -> int:
        """surface/compute/project_info/add_metadata.py: ``--metadata KEY=VALUE,...`` merged in."""
        project = self.project(parsed)
        values = parse_map("gcloud.compute.project-info.add-metadata", "metadata", parsed.get("metadata"))
        if not values:
            raise GcloudError(
                "At least one of [--metadata] or [--metadata-from-file] must be provided.", code=2
            )
        self._require_permission("compute.projects.setCommonInstanceMetadata", project)
        with self.store.txn() as txn:
            metadata = txn.doc("project_metadata").setdefault(project, {})
            metadata.update(values)
            txn.save("project_metadata")
        self.err(f"Updated [https://www.googleapis.com/compute/v1/projects/{project}].\n")
        return 0
