"""``gcloud services list``: the APIs enabled in the fake project (the sandbox settings disable some)."""

from __future__ import annotations

from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import formatted, matches_filter, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError
from tpu_rl_sandbox.world import inventory
from tpu_rl_sandbox.world.settings import load_settings

# APIs enabled in every sandbox project unless settings.disabled_services names them
# (service name -> the title `gcloud services list` shows).
ENABLED_BY_DEFAULT: dict[str, str] = {
    "artifactregistry.googleapis.com": "Artifact Registry API",
    "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
    "compute.googleapis.com": "Compute Engine API",
    "container.googleapis.com": "Kubernetes Engine API",
    # GKE image streaming's API (docs.cloud.google.com/kubernetes-engine/docs/how-to/image-streaming,
    # "Requirements": "Enable Container File System API"; states)
    "containerfilesystem.googleapis.com": "Container File System API",
    "containerregistry.googleapis.com": "Container Registry API",
    "file.googleapis.com": "Cloud Filestore API",
    "iam.googleapis.com": "Identity and Access Management (IAM) API",
    "iamcredentials.googleapis.com": "IAM Service Account Credentials API",
    "logging.googleapis.com": "Cloud Logging API",
    "monitoring.googleapis.com": "Cloud Monitoring API",
    "oslogin.googleapis.com": "Cloud OS Login API",
    "secretmanager.googleapis.com": "Secret Manager API",
    "servicenetworking.googleapis.com": "Service Networking API",
    "serviceusage.googleapis.com": "Service Usage API",
    "storage-api.googleapis.com": "Google Cloud Storage JSON API",
    "storage-component.googleapis.com": "Cloud Storage",
    "storage.googleapis.com": "Cloud Storage API",
    "tpu.googleapis.com": "Cloud TPU API",
}


class ServicesCommands(GcloudCall):
    """``gcloud services``."""

    def cmd_services_list(self, parsed: GcloudParse) -> int:
        """surface/services/list.py (GA): Service Usage services of the project, ``--enabled``
        (the default) or ``--available``; table ``config.name:label=NAME:sort=1, config.title``."""
        if parsed.get("enabled") and parsed.get("available"):
            raise GcloudUsageError(
                parsed.command.dotted,
                "argument --available: At most one of --available | --enabled can be specified.",
            )
        project = self.project(parsed)
        self._require_permission("serviceusage.services.list", project)
        disabled = set(load_settings(self.layout).disabled_services)
        number = inventory.project_number(project)
        resources = []
        for name, title in sorted(ENABLED_BY_DEFAULT.items()):
            state = "DISABLED" if name in disabled else "ENABLED"
            if state == "DISABLED" and not parsed.get("available"):
                continue
            resource: dict[str, Any] = {
                "config": {"name": name, "title": title},
                "name": f"projects/{number}/services/{name}",
                "parent": f"projects/{number}",
                "state": state,
            }
            if matches_filter(resource, parsed.get("filter")):
                resources.append(resource)
        if parsed.get("limit"):
            resources = resources[: int(parsed.get("limit"))]
        if parsed.get("format"):
            self.out(formatted(resources, parsed.get("format")))
        elif resources:
            rows = [["NAME", "TITLE"]] + [[r["config"]["name"], r["config"]["title"]] for r in resources]
            self.out(table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0
