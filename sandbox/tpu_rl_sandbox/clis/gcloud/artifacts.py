"""``gcloud artifacts repositories create``: an Artifact Registry repository in the sandbox's world.

From gcloud 528's sources: surface/artifacts/repositories/create.yaml (GA, a declarative command:
the ``repository_without_property`` resource, l.24-27, with ``--location`` from the ``artifacts/location``
property, command_lib/artifacts/resources.yaml l.13-23; ``--description`` l.29, ``--kms-key`` l.33,
labels l.166; ``async`` l.170, so ``--async``; ``additional_arguments_hook`` l.168:
command_lib/artifacts/util.py ``AddAdditionalArgs`` l.299 with ``--repository-format`` required,
l.317-324), the request hook ``AppendRepoDataToRequest`` (util.py l.232-263: the name checked against
``_REPO_REGEX`` l.89, else ``InvalidInputValueError(_INVALID_REPO_NAME_ERROR)`` l.69-71), and the
declarative create's output (command_lib/util/apis/yaml_command_translator.py l.918-952: "Create
request issued for: [NAME]", the operation waited for, ``log.CreatedResource``: "Created repository
[NAME]."). The real parser's messages (a missing location, a bad name) were checked with gcloud 528
itself. An existing repository: the API's 409, printed "ALREADY_EXISTS: the repository already
exists", exit 1 (second-hand: public CI logs quote that line, e.g. a GitHub Actions log of
``gcloud.artifacts.repositories.create``; the API's own text, not in gcloud's sources).
"""

from __future__ import annotations

import re
import time
import uuid

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, api_error_text, unspecified_attribute
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.timestamps import rfc3339

# command_lib/artifacts/util.py l.89 and l.69-71
REPO_NAME = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
INVALID_REPO_NAME = (
    "Names may only contain lowercase letters, numbers, and hyphens, and must begin with a letter and end "
    "with a letter or number."
)
# The Repository message's FormatValueValuesEnum (api_lib artifactregistry v1 messages), which
# util.py l.238 builds from ``--repository-format`` upper-cased.
FORMATS = ("APT", "DOCKER", "GENERIC", "GO", "KFP", "MAVEN", "NPM", "PYTHON", "YUM")
REPOSITORY_EXISTS = "ALREADY_EXISTS: the repository already exists"
CREATE_PERMISSION = "artifactregistry.repositories.create"


def permission_denied(permission: str, resource: str, account: str) -> GcloudError:
    """Artifact Registry's 403 as gcloud prints it (api_error_text: the account appended)."""
    return GcloudError(
        api_error_text(
            f"PERMISSION_DENIED: Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
            account,
        )
    )


class ArtifactsCommands(GcloudCall):
    """``gcloud artifacts``."""

    def cmd_artifacts_repositories_create(self, parsed: GcloudParse) -> int:
        name = str(parsed.positionals["REPOSITORY"])
        location = parsed.get("location") or self.env.get("CLOUDSDK_ARTIFACTS_LOCATION")
        if not location:
            raise unspecified_attribute("repository", "location", "artifacts/location")
        project = self.project(parsed)
        if not REPO_NAME.match(name):
            raise GcloudError(INVALID_REPO_NAME)
        fmt = str(parsed.get("repository-format")).upper()
        if fmt not in FORMATS:
            # util.py l.238 ``FormatValueValuesEnum(fmt)``: apitools' enum raises a TypeError that
            # gcloud reports as a crash (checked with gcloud 528)
            self.err(
                f"ERROR: gcloud crashed (TypeError): No such value for {fmt} in Enum FormatValueValuesEnum\n\n"
                "If you would like to report this issue, please run the following command:\n  gcloud feedback\n\n"
                "To check gcloud for common problems, please run the following command:\n"
                "  gcloud info --run-diagnostics\n"
            )
            return 1
        parent = f"projects/{project}/locations/{location}"
        if CREATE_PERMISSION in load_settings(self.layout).denied_permissions:
            raise permission_denied(
                CREATE_PERMISSION, f"//artifactregistry.googleapis.com/{parent}", self.account()
            )
        key = f"{project}/{location}/{name}"
        with self.store.txn() as txn:
            registry = txn.doc("registry")
            repositories = registry.setdefault("repositories", {})
            if key in repositories:
                raise GcloudError(REPOSITORY_EXISTS)
            repositories[key] = {
                "name": f"{parent}/repositories/{name}",
                "format": fmt,
                "description": parsed.get("description") or "",
                "createTime": rfc3339(),
                "created_by": self.account(),
                "created_ts": time.time(),
            }
            txn.save("registry")
        self.err(f"Create request issued for: [{name}]\n")
        if parsed.get("async"):
            self.err(f"Check operation [{parent}/operations/{uuid.uuid4()}] for status.\n")
            return 0
        self.err(f"Waiting for operation [{parent}/operations/{uuid.uuid4()}] to complete...done.\n")
        self.err(f"Created repository [{name}].\n")
        return 0
