"""Fake ``gcloud``: the subset the provider uses, with gcloud's argument rules and messages.

Run as ``python -m tpu_rl_sandbox.clis.gcloud ARGS`` (through the
``<root>/bin/gcloud`` shim). Buckets and objects live in fake-gcs-server; everything else
(secrets, IAM, VMs, clusters) in the sandbox state. Secret payloads are never stored: only
their SHA-256 and length.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis import gcs_emulator
from tpu_rl_sandbox.clis.gcloud import storage_ops
from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.in_machine import VM_COMMANDS, SecretAccess, run_on_vm
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, Write, api_error_text
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.clis.gcloud.storage_ops import cp_from_stdin
from tpu_rl_sandbox.machines.fsview import GcsStore, LocalStore, Router
from tpu_rl_sandbox.world import iam, inventory, secret_values, vpc
from tpu_rl_sandbox.world.calls import call_start, record_call
from tpu_rl_sandbox.world.faults import FAULT_ENV, FaultGate, parse_faults
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.layout import SandboxLayout, layout_from_env
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateError, StateStore
from tpu_rl_sandbox.world.timescale import capacity_seconds
from tpu_rl_sandbox.world.timestamps import rfc3339

__all__ = [
    "COMMANDS",
    "ENABLED_BY_DEFAULT",
    "VM_COMMANDS",
    "Gcloud",
    "GcloudError",
    "SecretAccess",
    "iam_bindings",
    "main",
    "project_ssh_key_entries",
    "project_ssh_keys",
    "run_on_vm",
]

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


# googlecloudsdk/command_lib/iam/iam_util.py: CONDITION_FORMAT_EXCEPTION, CONDITION_FILE_FORMAT_EXCEPTION
CONDITION_FORMAT_ERROR = (
    "Invalid value for [condition]: condition must be either `None` or a list of key=value pairs. If not "
    "`None`, `expression` and `title` are required keys.\nExample: "
    "--condition=expression=[expression],title=[title],description=[description]"
)
CONDITION_FILE_FORMAT_ERROR = (
    "Invalid value for [condition-from-file]: condition-from-file must be a path to a YAML or JSON file "
    "containing the condition. `expression` and `title` are required keys. `description` is optional. To "
    "specify a `None` condition, use --condition=None."
)
# APIs enabled in every sandbox project unless settings.disabled_services names them
# (service name -> the title `gcloud services list` shows).
ENABLED_BY_DEFAULT: dict[str, str] = {
    "artifactregistry.googleapis.com": "Artifact Registry API",
    "cloudresourcemanager.googleapis.com": "Cloud Resource Manager API",
    "compute.googleapis.com": "Compute Engine API",
    "container.googleapis.com": "Kubernetes Engine API",
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
# What `gcloud version` reports (the Cloud SDK 528 this machine has, core components only).
SDK_COMPONENTS: dict[str, str] = {
    "Google Cloud SDK": "528.0.0",
    "bq": "2.1.18",
    "core": "2025.06.20",
    "gcloud-crc32c": "1.0.0",
    "gsutil": "5.34",
}
# The API behind each command group (a disabled one fails the group's API calls).
API_OF_GROUP: dict[str, tuple[str, str]] = {
    "secrets": ("secretmanager.googleapis.com", "Secret Manager API"),
    "compute": ("compute.googleapis.com", "Compute Engine API"),
    "container": ("container.googleapis.com", "Kubernetes Engine API"),
}
LOCAL_COMMANDS = {("container", "clusters", "get-credentials")}
# Commands that run without credentials (they call no API): every other one needs an active account,
# and is the one that says it impersonates.
# The release tracks a command path may start with (``gcloud alpha compute ...``).
RELEASE_TRACKS = ("alpha", "beta")


def api_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """The command path without its release track: the API it calls is the same."""
    return path[1:] if path[:1] and path[0] in RELEASE_TRACKS else path


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


ACCOUNT_FREE_COMMANDS = {
    ("auth", "list"),
    ("auth", "configure-docker"),
    ("version",),
    ("config", "get-value"),
}
# googlecloudsdk/core/credentials/exceptions.py NoActiveAccountException, as AuthenticationException
# words it (should_relogin, not for_adc: the login command, then the switch-account text).
NO_ACTIVE_ACCOUNT = (
    "You do not currently have an active account selected.\nPlease run:\n\n  $ gcloud auth login\n\n"
    "to obtain new credentials.\n\nIf you have already logged in with a different account, run:\n\n"
    "  $ gcloud config set account ACCOUNT\n\nto select an already authenticated account to use."
)
# surface/auth/list.py Epilog when no account was displayed (printed only with the default format).
NO_CREDENTIALED_ACCOUNTS = (
    "\nNo credentialed accounts.\n\nTo login, run:\n  $ gcloud auth login `ACCOUNT`\n\n"
)
_FILTER_KEY_RE = re.compile(r"([A-Za-z_][\w.]*)\s*(?:!=|<=|>=|[:=~<>])")
IMPERSONATE_ENV = "CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT"  # the auth/impersonate_service_account property
DEFAULT_SSH_KEY_FILE = "~/.ssh/google_compute_engine"  # command_lib/util/ssh/ssh.py Keys.DEFAULT_KEY_FILE
# gcloud topic datetimes: a duration is ISO 8601 (P1D, PT2H) or digits with s/m/h/d units (1h30m)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in a gcloud duration (``1d``, ``2h30m``, ``PT1H``, ``90`` = seconds)."""
    raw = text.strip()
    if re.fullmatch(r"\d+", raw):
        return int(raw)
    iso = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", raw.upper())
    if iso and any(iso.groups()):
        days, hours, minutes, seconds = (int(g or 0) for g in iso.groups())
        return days * 86400 + hours * 3600 + minutes * 60 + seconds
    pieces = re.findall(r"(\d*)([A-Za-z]+)", raw)
    if not pieces or "".join(n + u for n, u in pieces) != raw:
        raise ValueError(f"Duration unit '{raw}' must be preceded by a number")
    total = 0
    for number, unit in pieces:
        if not number:
            raise ValueError(f"Duration unit '{unit}' must be preceded by a number")
        if unit.lower() not in _DURATION_UNITS:
            raise ValueError(f"Unknown character '{unit[0]}' in duration")
        total += int(number) * _DURATION_UNITS[unit.lower()]
    return total


def _ssh_key_expiry(entry: str) -> dt.datetime | None:
    """compute/ssh_utils._SSHKeyExpiration: ``user:type key google-ssh {"expireOn": ...}``."""
    parts = entry.split()
    if len(parts) < 4 or parts[2] != "google-ssh":
        return None
    try:
        expire_on = json.loads(" ".join(parts[3:]))["expireOn"]
        return dt.datetime.strptime(expire_on, "%Y-%m-%dT%H:%M:%S+0000").replace(tzinfo=dt.UTC)
    except (ValueError, KeyError):
        return None


def project_ssh_key_entries(layout: SandboxLayout, project: str) -> list[str]:
    """The ``ssh-keys`` entries of the project's metadata, as ``gcloud compute ssh`` wrote them."""
    metadata = StateStore(layout).read("project_metadata").get(project, {})
    return list(metadata.get("ssh-keys", []))


def project_ssh_keys(layout: SandboxLayout, project: str) -> list[str]:
    """The distinct public keys (``ssh-rsa AAAA...``) in the project's metadata, unexpired ones.

    One key kept across calls is one entry here. gcloud writes a new metadata *entry* for each call
    with ``--ssh-key-expire-after`` (the entry carries its ``expireOn``), pruning expired entries
    when it rewrites the metadata: :func:`project_ssh_key_entries` lists those.
    """
    now = dt.datetime.now(dt.UTC)
    keys: list[str] = []
    for entry in project_ssh_key_entries(layout, project):
        expiry = _ssh_key_expiry(entry)
        if expiry is not None and expiry < now:
            continue
        parts = entry.split(":", 1)[-1].split()
        key = " ".join(parts[:2])
        if key not in keys:
            keys.append(key)
    return keys


# ================================================================================= helpers
def _format(value: Any, fmt: str | None, default: str = "yaml") -> str:
    fmt = (fmt or default).strip()
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True) + "\n"
    if fmt in ("none", "disable"):
        return ""
    match = re.fullmatch(r"value\((.*)\)", fmt)
    if match:
        keys = [k.strip() for k in match.group(1).split(",") if k.strip()]
        rows = value if isinstance(value, list) else [value]
        lines = []
        for row in rows:
            lines.append("\t".join(str(_dig(row, key) if _dig(row, key) is not None else "") for key in keys))
        return "\n".join(lines) + ("\n" if lines else "")
    import yaml  # imported where used: each fake call is a fresh interpreter

    if isinstance(value, list):
        return "".join("---\n" + yaml.safe_dump(item, sort_keys=True) for item in value)
    return yaml.safe_dump(value, sort_keys=True)


def _dig(resource: Any, dotted: str) -> Any:
    """``a.b`` and ``a[0].b`` keys of gcloud's resource projections."""
    current = resource
    for piece in dotted.split("."):
        match = re.fullmatch(r"([^\[]*)((?:\[\d+\])*)", piece)
        name, indexes = (match.group(1), re.findall(r"\d+", match.group(2))) if match else (piece, [])
        if name:
            if not isinstance(current, dict):
                return None
            current = current.get(name)
        for index in indexes:
            if not isinstance(current, list) or int(index) >= len(current):
                return None
            current = current[int(index)]
    return current


def matches_filter(resource: dict[str, Any], expression: str | None) -> bool:
    """gcloud's ``--filter`` for the forms the provider uses: ``a.b=v``, ``a.b:v``, ``AND``, ``NOT``."""
    if not expression or not expression.strip():
        return True
    terms = re.split(r"\s+AND\s+|\s+(?=(?:NOT\s+|-)?[A-Za-z_][\w.]*\s*[:=~!])", expression.strip())
    for raw in terms:
        term = raw.strip()
        if not term:
            continue
        negate = False
        if term.startswith("NOT "):
            negate, term = True, term[4:].strip()
        elif term.startswith("-"):
            negate, term = True, term[1:].strip()
        match = re.fullmatch(r"([A-Za-z_][\w.\-]*)\s*(!=|=|:|~)\s*(.*)", term)
        if not match:
            raise GcloudError(f"Invalid value for [--filter]: unsupported expression [{raw}].")
        key, op, wanted = match.group(1), match.group(2), match.group(3).strip().strip("'\"()")
        actual = _dig(resource, key)
        if op == ":" and wanted == "*":
            result = actual is not None
        elif actual is None:
            result = False
        elif op in ("=", "!="):
            result = (
                str(actual).lower() == wanted.lower() if not isinstance(actual, list) else wanted in actual
            )
            result = (not result) if op == "!=" else result
        elif op == ":":
            text = json.dumps(actual) if isinstance(actual, (list, dict)) else str(actual)
            result = wanted.lower() in text.lower()
        else:
            result = re.search(wanted, str(actual)) is not None
        if result == negate:
            return False
    return True


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() + "\n" for row in rows
    )


def _parse_labels(raw: str | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in (raw or "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if (
            not sep
            or not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key)
            or not re.fullmatch(r"[a-z0-9_-]{0,63}", value)
        ):
            raise GcloudError(
                f"Invalid value for [--labels]: [{item}] -- keys and values must be lowercase letters, digits, '_' or '-'.",
                code=2,
            )
        labels[key] = value
    return labels


# Secret.annotations keys (google/cloud/secretmanager/v1/resources.proto)
ANNOTATION_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def _parse_map(command: str, flag: str, raw: str | None) -> dict[str, str]:
    """map_util's ``KEY=VALUE[,...]`` (arg_parsers.ArgDict): every item needs ``=``."""
    pairs: dict[str, str] = {}
    for item in (raw or "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise GcloudUsageError(command, f"argument --{flag}: Bad syntax for dict arg: [{item}].")
        pairs[key] = value
    return pairs


def _posix_username(account: str) -> str:
    """The OS Login POSIX username of an account: ``sa_<unique id>`` for a service account, the
    e-mail with every other character as ``_`` for a user (OS Login docs, "username"), 32 at most."""
    if account.endswith(".gserviceaccount.com"):
        return "sa_" + str(int(hashlib.sha256(account.encode()).hexdigest()[:15], 16))[:18]
    return re.sub(r"[^a-z0-9_]", "_", account.lower())[:32]


def _external_ip(name: str) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    return f"34.{digest[0]}.{digest[1]}.{digest[2] or 1}"


# ===================================================================================== app
class Gcloud:
    """One ``gcloud`` invocation."""

    def __init__(
        self,
        layout: SandboxLayout,
        env: Mapping[str, str],
        stdin: Callable[[], bytes],
        stdout: Write,
        stderr: Write,
    ) -> None:
        self.layout = layout
        self.env = env
        self.read_stdin = stdin
        self.out = stdout
        self.err = stderr
        self.store = StateStore(layout)
        self._router: Router | None = None
        self._impersonated: str | None = None

    @property
    def router(self) -> Router:
        if self._router is None:
            self._router = Router(GcsStore(gcs_emulator.api_for(self.layout)), LocalStore(Path("/")))
        return self._router

    def project(self, parsed: GcloudParse) -> str:
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        if not project:
            raise GcloudError(
                "The required property [project] is not currently set.\nIt can be set on a per-command basis by "
                "re-running your command with the [--project] flag.\n\nYou may set it for your current workspace by "
                "running:\n\n  $ gcloud config set project VALUE"
            )
        return str(project)

    def zone(self, parsed: GcloudParse, resource: str) -> str:
        zone = parsed.get("zone") or self.env.get("CLOUDSDK_COMPUTE_ZONE")
        if not zone:
            raise GcloudError(f"Underspecified resource [{resource}]. Specify the [--zone] flag.")
        return str(zone)

    def faults(self) -> FaultGate:
        return FaultGate.from_env(self.store, self.env)

    def account(self) -> str:
        """Who the API calls run as: the impersonated target while impersonating, else the account."""
        return self._impersonated or self.env.get("CLOUDSDK_CORE_ACCOUNT", "sandbox-user@example.com")

    def impersonation(self, parsed: GcloudParse) -> tuple[str, list[str]] | None:
        """``(target, delegates)`` of the ``auth/impersonate_service_account`` property: the
        ``--impersonate-service-account`` flag, else ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT``
        (a flag sets its property for the invocation; properties.py reads ``CLOUDSDK_<SECTION>_<NAME>``).
        A comma-separated list is a delegation chain, the last account the target
        (googlecloudsdk/core/credentials/store.py ``ParseImpersonationAccounts``)."""
        value = parsed.get("impersonate-service-account") or self.env.get(IMPERSONATE_ENV)
        if not value:
            return None
        accounts = [account.strip() for account in str(value).split(",")]
        return accounts[-1], accounts[:-1]

    def _require_service(self, path: tuple[str, ...], parsed: GcloudParse) -> None:
        """An API call to a service disabled in the project (``settings.disabled_services``) fails
        with the API's 403 SERVICE_DISABLED text (gcloud does not offer to enable it without a
        terminal: googlecloudsdk/api_lib/util/api_enablement.py)."""
        service = API_OF_GROUP.get(path[0])
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        if service is None or not project or path in LOCAL_COMMANDS:
            return
        if service[0] not in load_settings(self.layout).disabled_services:
            return
        number = inventory.project_number(str(project))
        message = (
            f"PERMISSION_DENIED: {service[1]} has not been used in project {number} before or it is disabled. "
            f"Enable it by visiting https://console.developers.google.com/apis/api/{service[0]}/overview?project={number} "
            "then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our "
            "systems and retry."
        )
        raise GcloudError(api_error_text(message, self.account()))

    def _require_permission(self, permission: str, project: str, resource: str = "") -> None:
        """Refuse when the caller lacks ``permission`` (``settings.denied_permissions``), with the
        API's 403 text as gcloud prints it."""
        if permission not in load_settings(self.layout).denied_permissions:
            return
        if permission.startswith("compute."):
            raise GcloudError(
                f"Could not fetch resource:\n - Required '{permission}' permission for '{resource or 'projects/' + project}'"
            )
        if permission == "serviceusage.services.list":
            message = (
                "PERMISSION_DENIED: Permission denied to list services for consumer container "
                f"[projects/{inventory.project_number(project)}]"
            )
            raise GcloudError(api_error_text(message, self.account()))
        verb = permission.rsplit(".", 1)[-1]
        raise GcloudError(
            f"[{self.account()}] does not have permission to access projects instance [{project}:{verb}] "
            "(or it may not exist): The caller does not have permission"
        )

    # -- dispatch -------------------------------------------------------------------------
    def run(self, argv: list[str]) -> int:
        command, rest = gcloud_resolve(COMMANDS, argv)
        parsed = gcloud_parse(command, rest)
        handler = getattr(self, "cmd_" + "_".join(part.replace("-", "_") for part in command.path))
        try:
            parse_faults(self.env.get(FAULT_ENV))
            loads_credentials = command.path not in ACCOUNT_FREE_COMMANDS
            if loads_credentials and not load_settings(self.layout).gcloud_logged_in:
                raise GcloudError(NO_ACTIVE_ACCOUNT)
            impersonated = self.impersonation(parsed) if loads_credentials else None
            if impersonated is not None:
                # store.py Load(): said on stderr whenever credentials are loaded while impersonating
                self._impersonated = impersonated[0]
                self.err(
                    "WARNING: This command is using service account impersonation. All API calls will be "
                    f"executed as [{impersonated[0]}].\n"
                )
            self._require_service(api_path(command.path), parsed)
            result: int = handler(parsed)
        except GcloudError as error:
            self.err(f"ERROR: ({command.dotted}) {error.message}\n")
            return error.code
        except storage_ops.StorageOpError as error:
            self.err(f"ERROR: ({command.dotted}) {error}\n")
            return 1
        except StateError as error:
            self.err(f"ERROR: ({command.dotted}) sandbox: {error}\n")
            return 1
        return result

    # -- storage --------------------------------------------------------------------------
    def cmd_storage_buckets_create(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        location = str(parsed.get("location") or "US").upper()
        api = self.router.gcs.api
        for url in parsed.positionals["URL"]:
            if not url.startswith("gs://"):
                raise GcloudError(f"Expected a bucket URL (gs://bucket), got [{url}].")
            bucket = url[len("gs://") :].rstrip("/")
            if "/" in bucket or not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", bucket):
                raise GcloudError(f"HTTPError 400: Invalid bucket name: '{bucket}'")
            self.err(f"Creating gs://{bucket}/...\n")
            with self.store.txn() as txn:
                buckets = txn.doc("buckets")
                if api.get_bucket(bucket) is not None:
                    # Cloud Storage's two 409s: a name another project holds (the XML API's
                    # BucketNameUnavailable text, the JSON API's "Error 409: ..., conflict" as
                    # googleapi relays it: GoogleCloudPlatform/mlops-with-vertex-ai issue 26), and
                    # a bucket of the request's project (cloud.google.com/storage/docs/json_api/v1/
                    # status-codes, "409 Conflict"). gcloud storage prints "HTTPError 409: <message>".
                    owner = buckets.get(bucket, {}).get("project", project)
                    if owner != project:
                        raise GcloudError(
                            "HTTPError 409: The requested bucket name is not available. The bucket namespace is shared "
                            "by all users of the system. Please select a different name and try again."
                        )
                    raise GcloudError(
                        "HTTPError 409: Your previous request to create the named bucket succeeded and you already own it."
                    )
                api.create_bucket(bucket, location)
                buckets[bucket] = {"project": project, "location": location, "created": rfc3339()}
                txn.save("buckets")
        return 0

    def cmd_storage_buckets_describe(self, parsed: GcloudParse) -> int:
        url = str(parsed.positionals["URL"])
        bucket = url[len("gs://") :].rstrip("/") if url.startswith("gs://") else url
        meta = self.router.gcs.api.get_bucket(bucket)
        if meta is None:
            raise GcloudError(f"gs://{bucket} not found: 404.")
        record = self.store.read("buckets").get(bucket, {})
        created = record.get("created") or meta.get("timeCreated", rfc3339())
        resource = {
            "creation_time": created,
            "default_storage_class": meta.get("storageClass", "STANDARD"),
            "location": record.get("location") or meta.get("location", "US"),
            "location_type": "region",
            "metageneration": 1,
            "name": bucket,
            "storage_url": f"gs://{bucket}/",
            "uniform_bucket_level_access": True,
            "update_time": created,
        }
        self.out(_format(resource, parsed.get("format")))
        return 0

    def cmd_storage_buckets_list(self, parsed: GcloudParse) -> int:
        records = self.store.read("buckets")
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        rows = []
        for meta in self.router.gcs.api.list_buckets():
            record = records.get(meta["name"], {})
            if project and record.get("project", project) != project:
                continue
            resource = {
                "name": meta["name"],
                "storage_url": f"gs://{meta['name']}/",
                "location": record.get("location", "US"),
            }
            if matches_filter(resource, parsed.get("filter")):
                rows.append(resource)
        self.out(_format(rows, parsed.get("format")))
        return 0

    def cmd_storage_ls(self, parsed: GcloudParse) -> int:
        storage_ops.ls(
            self.router,
            list(parsed.positionals["PATH"]),
            bool(parsed.get("long")),
            bool(parsed.get("recursive")),
            bool(parsed.get("readable-sizes")),
            self.out,
        )
        return 0

    def cmd_storage_rm(self, parsed: GcloudParse) -> int:
        storage_ops.rm(self.router, list(parsed.positionals["URLS"]), bool(parsed.get("recursive")), self.err)
        return 0

    def _local(self, path: str) -> str:
        return path if path.startswith("gs://") else str(Path(path).expanduser().resolve())

    def cmd_storage_cp(self, parsed: GcloudParse) -> int:
        if list(parsed.positionals["SOURCE"])[:1] == ["-"]:
            return cp_from_stdin(
                self.router, list(parsed.positionals["SOURCE"]), self._local, self.read_stdin(), self.err
            )
        items = [self._local(p) for p in parsed.positionals["SOURCE"]]
        if len(items) < 2:
            raise GcloudError("argument DESTINATION: Must be specified.", code=2)
        trailing = "/" if parsed.positionals["SOURCE"][-1].endswith("/") else ""
        storage_ops.cp(self.router, items[:-1], items[-1] + trailing, bool(parsed.get("recursive")), self.err)
        return 0

    def cmd_storage_rsync(self, parsed: GcloudParse) -> int:
        items = [self._local(p) for p in parsed.positionals["SOURCE"]]
        if len(items) != 2:
            raise GcloudError("rsync requires exactly one SOURCE and one DESTINATION.", code=2)
        storage_ops.rsync(
            self.router,
            items[0],
            items[1],
            bool(parsed.get("recursive")),
            bool(parsed.get("delete-unmatched-destination-objects")),
            self.err,
            exclude=parsed.get("exclude") or None,
        )
        return 0

    # -- auth / config --------------------------------------------------------------------
    def cmd_auth_configure_docker(self, parsed: GcloudParse) -> int:
        raw = (
            parsed.positionals.get("REGISTRIES")
            or "gcr.io,us.gcr.io,eu.gcr.io,asia.gcr.io,staging-k8s.gcr.io,marketplace.gcr.io"
        )
        registries = [r.strip() for r in str(raw).split(",") if r.strip()]
        config_dir = Path(
            self.env.get("DOCKER_CONFIG") or Path(self.env.get("HOME", str(Path.home()))) / ".docker"
        )
        config_file = config_dir / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            config = {}
        helpers = config.setdefault("credHelpers", {})
        missing = [r for r in registries if helpers.get(r) != "gcloud"]
        if not missing:
            self.err("gcloud credential helpers already registered correctly.\n")
            return 0
        self.err("Adding credentials for: " + ",".join(missing) + "\n")
        for registry in missing:
            helpers[registry] = "gcloud"
        config_dir.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(config, indent=2))
        self.err("Docker configuration file updated.\n")
        return 0

    def cmd_auth_list(self, parsed: GcloudParse) -> int:
        if not load_settings(self.layout).gcloud_logged_in:
            # No account to display: display_taps.py Filterer.Done warns about every filter key
            # (none was present in any resource), then the command's Epilog (default format only).
            keys = sorted(set(_FILTER_KEY_RE.findall(str(parsed.get("filter") or ""))))
            if keys:
                self.err(
                    f"WARNING: The following filter keys were not present in any resource : {', '.join(keys)}\n"
                )
            if not parsed.get("format"):
                self.err(NO_CREDENTIALED_ACCOUNTS)
            return 0
        account = self.env.get("CLOUDSDK_CORE_ACCOUNT", "sandbox-user@example.com")
        self.out(
            _format(
                [{"account": account, "status": "ACTIVE"}], parsed.get("format"), default="value(account)"
            )
        )
        return 0

    def cmd_version(self, parsed: GcloudParse) -> int:
        """``gcloud version``: the SDK and its installed components (surface/version.py prints
        ``NAME VERSION`` lines; ``--format=json`` an object)."""
        if parsed.get("format"):
            self.out(_format(dict(SDK_COMPONENTS), parsed.get("format")))
        else:
            self.out("".join(f"{name} {version}\n" for name, version in SDK_COMPONENTS.items()))
        return 0

    def cmd_config_get_value(self, parsed: GcloudParse) -> int:
        name = str(parsed.positionals["PROPERTY"])
        env_name = {"project": "CLOUDSDK_CORE_PROJECT", "account": "CLOUDSDK_CORE_ACCOUNT"}.get(
            name.split("/")[-1], "CLOUDSDK_" + name.replace("/", "_").upper()
        )
        value = self.env.get(env_name)
        if value:
            self.out(value + "\n")
        else:
            self.err("(unset)\n")
        return 0

    # -- IAM ------------------------------------------------------------------------------
    def _check_member(self, member: str, project: str) -> None:
        kinds = ("serviceAccount", "user", "group", "domain", "principal", "principalSet")
        kind, sep, ident = member.partition(":")
        valid = (sep and kind in kinds) or member in ("allUsers", "allAuthenticatedUsers")
        if not valid:
            raise GcloudError(f"INVALID_ARGUMENT: Invalid principal: {member}")
        if kind == "serviceAccount" and ident.endswith(".iam.gserviceaccount.com"):
            accounts = self.store.read("iam").get("service_accounts", {})
            if ident not in accounts:
                raise GcloudError(f"INVALID_ARGUMENT: Service account {ident} does not exist.")
        del project

    @staticmethod
    def _check_role(role: str) -> None:
        if not re.fullmatch(
            r"(roles/[A-Za-z0-9_.]+|projects/[^/]+/roles/[A-Za-z0-9_.]+|organizations/\d+/roles/[A-Za-z0-9_.]+)",
            role,
        ):
            raise GcloudError(f"INVALID_ARGUMENT: Role ({role}) does not exist in the resource's hierarchy.")

    @staticmethod
    def _policy(
        bindings: dict[str, list[str]], conditional: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """An IAM policy as gcloud prints it (version 3 once it holds a conditional binding)."""
        conditional = conditional or []
        entries: list[dict[str, Any]] = [
            {"members": sorted(members), "role": role}
            for role, members in sorted(bindings.items())
            if members
        ]
        entries += [
            {"condition": dict(b["condition"]), "members": sorted(b["members"]), "role": b["role"]}
            for b in conditional
        ]
        entries.sort(key=lambda b: (b["role"], "condition" in b))
        digest = json.dumps([bindings, conditional], sort_keys=True).encode()
        etag = hashlib.sha256(digest).hexdigest()[:12]
        return {"bindings": entries, "etag": "BwY" + etag, "version": 3 if conditional else 1}

    def _condition(self, parsed: GcloudParse, role: str) -> tuple[bool, dict[str, str] | None]:
        """``(specified, condition)`` from ``--condition``/``--condition-from-file``; ``(True, None)``
        is ``--condition=None``. googlecloudsdk/command_lib/iam/iam_util.py: _ConditionArgDict,
        ValidateConditionArgument, ValidateMutexConditionAndPrimitiveRoles."""
        dotted = parsed.command.dotted
        if {"condition", "condition-from-file"} <= parsed.given:
            raise GcloudUsageError(
                dotted,
                "argument --condition: At most one of --condition | --condition-from-file can be specified.",
            )
        condition: dict[str, str | None]
        if "condition" in parsed.given:
            condition = {}
            for item in str(parsed.get("condition")).split(","):
                key, sep, value = item.partition("=")
                if key not in ("expression", "title", "description", "None"):
                    raise GcloudUsageError(
                        dotted,
                        f"argument --condition: valid keys are [None, description, expression, title]; received: {key}",
                    )
                condition[key] = value if sep else None
            if "None" in condition:
                if {"expression", "description", "title"} & set(condition):
                    raise GcloudError(CONDITION_FORMAT_ERROR)
                return True, None
            if not condition.get("expression") or not condition.get("title"):
                raise GcloudError(CONDITION_FORMAT_ERROR)
        elif "condition-from-file" in parsed.given:
            import yaml

            source = str(parsed.get("condition-from-file"))
            try:
                loaded = yaml.safe_load(Path(source).expanduser().read_text())
            except OSError as error:
                raise GcloudUsageError(
                    dotted, f"argument --condition-from-file: Unable to read file [{source}]: {error}"
                ) from None
            except yaml.YAMLError:
                raise GcloudError(CONDITION_FILE_FORMAT_ERROR) from None
            if not isinstance(loaded, dict) or not loaded.get("expression") or not loaded.get("title"):
                raise GcloudError(CONDITION_FILE_FORMAT_ERROR)
            condition = {k: str(loaded[k]) for k in ("expression", "title", "description") if loaded.get(k)}
        else:
            return False, None
        if role in ("roles/editor", "roles/owner", "roles/viewer"):
            raise GcloudError(
                "Binding with a condition and a basic role is not allowed. Basic roles are `roles/editor`, "
                "`roles/owner`, and `roles/viewer`."
            )
        return True, {k: str(v) for k, v in condition.items() if v is not None}

    def _refuse_unconditional(
        self, conditional: list[dict[str, Any]], specified: bool, condition: dict[str, str] | None
    ) -> None:
        """iam_util.AddBindingToIamPolicyWithCondition: a policy holding a conditional binding needs
        ``--condition`` (the fake is never interactive: Airflow runs it without a terminal, and
        ``--quiet`` disables prompts anyway)."""
        if conditional and not specified:
            raise GcloudError(
                "Adding a binding without specifying a condition to a policy containing conditions is "
                "prohibited in non-interactive mode. Run the command again with `--condition=None`"
            )
        if not conditional and specified and condition is not None:
            self.err(
                "WARNING: Adding binding with condition to a policy without condition will change the behavior "
                "of add-iam-policy-binding and remove-iam-policy-binding commands.\n"
            )

    @staticmethod
    def _add_binding(
        plain: dict[str, list[str]],
        conditional: list[dict[str, Any]],
        member: str,
        role: str,
        condition: dict[str, str] | None,
    ) -> None:
        """iam_util._AddBindingToIamPolicyWithCondition: join the binding with the same role and
        condition, else append a new one."""
        if condition is None:
            members = plain.setdefault(role, [])
            if member not in members:
                members.append(member)
            return
        for binding in conditional:
            if binding["role"] == role and binding["condition"] == condition:
                if member not in binding["members"]:
                    binding["members"].append(member)
                return
        conditional.append({"role": role, "members": [member], "condition": dict(condition)})

    def _bind_in_record(self, record: dict[str, Any], member: str, role: str, condition: Any) -> None:
        """Add a binding to a secret's or bucket's stored policy (see :meth:`_add_binding`)."""
        self._add_binding(
            record.setdefault("bindings", {}),
            record.setdefault("conditional_bindings", []),
            member,
            role,
            condition,
        )

    def cmd_projects_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        project = str(parsed.positionals["PROJECT_ID"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        specified, condition = self._condition(parsed, role)
        self._require_permission("resourcemanager.projects.setIamPolicy", project)
        _, conditional = iam.iam_policy(self.layout, f"projects/{project}")
        self._refuse_unconditional(conditional, specified, condition)
        self._check_role(role)
        self._check_member(member, project)
        with self.store.txn() as txn:
            iam_doc = txn.doc("iam")
            bindings = iam_doc.setdefault("project_bindings", {}).setdefault(project, {})
            own_conditional = iam_doc.setdefault("project_conditional", {}).setdefault(project, [])
            self._add_binding(bindings, own_conditional, member, role, condition)
            txn.save("iam")
            plain, conditional = iam.policy_from_docs(
                {"iam": iam_doc}, f"projects/{project}", load_settings(self.layout).conditional_bindings
            )
        self.err(f"Updated IAM policy for project [{project}].\n")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_projects_get_iam_policy(self, parsed: GcloudParse) -> int:
        project = str(parsed.positionals["PROJECT_ID"])
        plain, conditional = iam.iam_policy(self.layout, f"projects/{project}")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def _bucket_of(self, parsed: GcloudParse) -> str:
        url = str(parsed.positionals["URL"])
        command = " ".join(["gcloud", *parsed.command.path])
        if not url.startswith("gs://"):
            # command_lib/storage/errors_util.raise_error_if_not_gcs_bucket
            raise GcloudError(
                f'"{command}" only accepts Google Cloud Storage URLs.\nExample: "gs://bucket"\nReceived: "{url}"'
            )
        bucket = url[len("gs://") :].rstrip("/")
        if not bucket or "/" in bucket:
            raise GcloudError(
                f'"{command}" only accepts bucket URLs.\nExample: "gs://bucket"\nReceived: "{url}"'
            )
        if self.router.gcs.api.get_bucket(bucket) is None:
            raise GcloudError("HTTPError 404: The specified bucket does not exist.")
        return bucket

    def cmd_storage_buckets_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/storage/buckets/add_iam_policy_binding.py: the bucket must exist; the binding is
        added with iam_util.AddBindingToIamPolicyWithCondition (no --condition on a policy with a
        conditional binding is refused non-interactively), then the policy is set."""
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        specified, condition = self._condition(parsed, role)
        bucket = self._bucket_of(parsed)
        _, conditional = iam.iam_policy(self.layout, f"b/{bucket}")
        self._refuse_unconditional(conditional, specified, condition)
        self._check_role(role)
        self._check_member(member, "")
        with self.store.txn() as txn:
            buckets = txn.doc("buckets")
            record = buckets.setdefault(bucket, {})
            self._bind_in_record(record, member, role, condition)
            txn.save("buckets")
            plain, conditional = iam.policy_from_docs({"buckets": buckets}, f"b/{bucket}", False)
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_storage_buckets_get_iam_policy(self, parsed: GcloudParse) -> int:
        bucket = self._bucket_of(parsed)
        plain, conditional = iam.iam_policy(self.layout, f"b/{bucket}")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    # -- secrets --------------------------------------------------------------------------
    def _read_payload(self, source: str) -> bytes:
        if source == "-":
            return self.read_stdin()
        try:
            return Path(source).expanduser().read_bytes()
        except OSError:
            raise GcloudError(f"Unable to read file [{source}]: No such file or directory") from None

    def _add_version(self, txn: Any, key: str, payload: bytes) -> int:
        if not payload:
            raise GcloudError("INVALID_ARGUMENT: Secret Payload cannot be empty.")
        record = txn.doc("secrets")[key]
        number = len(record.setdefault("versions", [])) + 1
        record["versions"].append(
            {
                "version": number,
                "sha256": hashlib.sha256(payload).hexdigest(),
                "length": len(payload),
                "state": "ENABLED",
                "created": rfc3339(),
            }
        )
        return number

    def cmd_secrets_create(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,255}", secret):
            raise GcloudError(
                f"Invalid value for [secret]: [{secret}] must contain only letters, numbers, dashes and underscores.",
                code=2,
            )
        policy = parsed.get("replication-policy") or "automatic"
        if policy == "user-managed" and not parsed.get("locations"):
            raise GcloudError(
                "The [--locations] flag is required when --replication-policy=user-managed.", code=2
            )
        payload = self._read_payload(str(parsed.get("data-file"))) if parsed.get("data-file") else None
        key = f"{project}/{secret}"
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            if key in secrets:
                raise GcloudError(
                    f"Resource in projects [{project}] is the subject of a conflict: Secret "
                    f"[projects/{inventory.project_number(project)}/secrets/{secret}] already exists."
                )
            secrets[key] = {
                "created": rfc3339(),
                "replication": policy,
                "labels": _parse_labels(parsed.get("labels")),
                "versions": [],
                "bindings": {},
            }
            version = self._add_version(txn, key, payload) if payload is not None else None
            txn.save("secrets")
        self.err(f"Created secret [{secret}].\n")
        if version is not None:
            self.err(f"Created version [{version}] of the secret [{secret}].\n")
        return 0

    def _secret_record(self, project: str, secret: str) -> dict[str, Any]:
        record = self.store.read("secrets").get(f"{project}/{secret}")
        if record is None:
            raise GcloudError(
                f"NOT_FOUND: Secret [projects/{inventory.project_number(project)}/secrets/{secret}] not found."
            )
        return record

    def cmd_secrets_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        record = self._secret_record(project, secret)
        resource = {
            "createTime": record["created"],
            "etag": '"' + hashlib.sha256(secret.encode()).hexdigest()[:14] + '"',
            "name": f"projects/{inventory.project_number(project)}/secrets/{secret}",
            "replication": {"automatic": {}}
            if record.get("replication") == "automatic"
            else {"userManaged": {}},
        }
        if record.get("labels"):
            resource["labels"] = record["labels"]
        if record.get("annotations"):
            resource["annotations"] = record["annotations"]
        self.out(_format(resource, parsed.get("format")))
        return 0

    def cmd_secrets_update(self, parsed: GcloudParse) -> int:
        """surface/secrets/update.py: at least one update flag (MinimumArgumentException), the
        annotation flags are one mutex group; map_util's KEY=VALUE lists (split on ","); the server
        checks annotation keys (Secret.annotations: 1-63 characters, alphanumeric at both ends,
        ``-_.`` inside; keys and values under 16 KiB in total)."""
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        dotted = parsed.command.dotted
        annotation_flags = {"update-annotations", "remove-annotations", "clear-annotations"} & parsed.given
        if len(annotation_flags) > 1:
            names = " | ".join(f"--{n}" for n in sorted(annotation_flags))
            raise GcloudUsageError(dotted, f"argument {names}: At most one of these can be specified.")
        update_flags = annotation_flags | ({"update-labels", "remove-labels", "clear-labels"} & parsed.given)
        if not update_flags:
            raise GcloudError(
                "One of [--clear-labels, --remove-labels, --update-labels, --update-annotations, "
                "--remove-annotations, --clear-annotations] must be specified.\n"
                f"No updates requested for secret [{secret}].",
                code=2,
            )
        updates = _parse_map(dotted, "update-annotations", parsed.get("update-annotations"))
        for key in updates:
            if not ANNOTATION_KEY.fullmatch(key):
                raise GcloudError(
                    f"INVALID_ARGUMENT: Annotation key [{key}] must be 1-63 characters, begin and end "
                    "with an alphanumeric character and contain only alphanumerics, '-', '_' and '.'."
                )
        with self.store.txn() as txn:
            record = txn.doc("secrets").get(f"{project}/{secret}")
            if record is None:
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{inventory.project_number(project)}/secrets/{secret}] not found."
                )
            annotations = dict(record.get("annotations") or {})
            if "clear-annotations" in parsed.given:
                annotations = {}
            for key in str(parsed.get("remove-annotations") or "").split(","):
                annotations.pop(key, None)
            annotations.update(updates)
            if sum(len(k) + len(v) for k, v in annotations.items()) >= 16 * 1024:
                raise GcloudError("INVALID_ARGUMENT: The total size of annotations must be less than 16KiB.")
            labels = {} if "clear-labels" in parsed.given else dict(record.get("labels") or {})
            for key in str(parsed.get("remove-labels") or "").split(","):
                labels.pop(key, None)
            labels.update(_parse_labels(parsed.get("update-labels")))
            record["annotations"], record["labels"] = annotations, labels
            txn.save("secrets")
        self.err(f"Updated secret [{secret}].\n")
        return 0

    def cmd_secrets_delete(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            if f"{project}/{secret}" not in secrets:
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{inventory.project_number(project)}/secrets/{secret}] not found."
                )
            del secrets[f"{project}/{secret}"]
            txn.save("secrets")
        self.err(f"Deleted secret [{secret}].\n")
        return 0

    def cmd_secrets_versions_add(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        payload = self._read_payload(str(parsed.get("data-file")))
        with self.store.txn() as txn:
            if f"{project}/{secret}" not in txn.doc("secrets"):
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{inventory.project_number(project)}/secrets/{secret}] not found."
                )
            version = self._add_version(txn, f"{project}/{secret}", payload)
            txn.save("secrets")
        self.err(f"Created version [{version}] of the secret [{secret}].\n")
        return 0

    def _version_resource(self, project: str, secret: str, version: dict[str, Any]) -> dict[str, Any]:
        """A SecretVersion as the API returns it (name, state, createTime, ...)."""
        return {
            "name": f"projects/{inventory.project_number(project)}/secrets/{secret}/versions/{version['version']}",
            "state": version.get("state", "ENABLED"),
            "createTime": version.get("created"),
            "etag": '"'
            + hashlib.sha256(f"{secret}/{version['version']}/{version.get('state')}".encode()).hexdigest()[
                :14
            ]
            + '"',
            "replicationStatus": {"automatic": {}},
        }

    def cmd_secrets_versions_list(self, parsed: GcloudParse) -> int:
        """surface/secrets/versions/list.py: the secret's versions, newest first (the API's order)."""
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        record = self._secret_record(project, secret)
        versions = [self._version_resource(project, secret, v) for v in reversed(record.get("versions", []))]
        if parsed.get("filter"):
            raise GcloudError("the sandbox's gcloud secrets versions list does not evaluate --filter")
        if parsed.get("uri"):
            self.out("".join(f"https://secretmanager.googleapis.com/v1/{v['name']}\n" for v in versions))
            return 0
        if not versions and not parsed.get("format"):
            self.err("Listed 0 items.\n")
            return 0
        self.out(_format(versions, parsed.get("format")))
        return 0

    def cmd_secrets_versions_disable(self, parsed: GcloudParse) -> int:
        """surface/secrets/versions/disable.py: the version must exist; a destroyed one cannot be
        disabled (FAILED_PRECONDITION)."""
        project = self.project(parsed)
        secret = parsed.get("secret")
        if not secret:
            raise GcloudError("argument --secret: Must be specified.", code=2)
        number = str(parsed.positionals["VERSION"])
        name = f"projects/{inventory.project_number(project)}/secrets/{secret}/versions/{number}"
        with self.store.txn() as txn:
            record = txn.doc("secrets").get(f"{project}/{secret}")
            version = next(
                (v for v in (record or {}).get("versions", []) if str(v.get("version")) == number), None
            )
            if version is None:
                raise GcloudError(f"NOT_FOUND: Secret Version [{name}] not found.")
            if version.get("state") == "DESTROYED":
                raise GcloudError(f"FAILED_PRECONDITION: Secret Version [{name}] is in DESTROYED state.")
            version["state"] = "DISABLED"
            txn.save("secrets")
        self.err(f"Disabled version [{number}] of the secret [{secret}].\n")
        return 0

    def cmd_secrets_versions_access(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = parsed.get("secret")
        if not secret:
            raise GcloudError("argument --secret: Must be specified.", code=2)
        value, problem = secret_values.secret_value(
            self.store, project, str(secret), str(parsed.positionals["VERSION"])
        )
        if value is None:
            raise GcloudError(api_error_text(problem, self.account()))
        self.out(value)
        return 0

    def cmd_secrets_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/secrets/add_iam_policy_binding.py: get the policy (the secret must exist), add the
        binding with iam_util.AddBindingToIamPolicyWithCondition, set it (the server checks the
        principal and the role). A new unconditional member's grant time is recorded: reads as that
        member are refused until it has propagated (iam.member_has_permission)."""
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        specified, condition = self._condition(parsed, role)
        self._secret_record(project, secret)
        _, conditional = iam.iam_policy(self.layout, f"projects/{project}/secrets/{secret}")
        self._refuse_unconditional(conditional, specified, condition)
        self._check_role(role)
        self._check_member(member, project)
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            record = secrets.get(f"{project}/{secret}")
            if record is None:
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{inventory.project_number(project)}/secrets/{secret}] not found."
                )
            new_member = condition is None and member not in record.get("bindings", {}).get(role, [])
            self._bind_in_record(record, member, role, condition)
            if new_member:  # an unchanged policy has nothing to propagate
                record.setdefault(iam.GRANTED_AT, {}).setdefault(role, {})[member] = time.time()
            txn.save("secrets")
            plain, conditional = iam.policy_from_docs(
                {"secrets": secrets}, f"projects/{project}/secrets/{secret}", False
            )
        self.err(f"Updated IAM policy for secret [{secret}].\n")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_secrets_remove_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/secrets/remove_iam_policy_binding.py: get the policy (the secret must exist), then
        iam_util.RemoveBindingFromIamPolicyWithCondition: no --condition/--all on a policy holding
        a conditional binding is refused non-interactively; the binding with this member, role and
        condition must be there; --all removes it under every condition."""
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        remove_all = bool(parsed.get("all"))
        if remove_all and {"condition", "condition-from-file"} & parsed.given:
            raise GcloudUsageError(
                parsed.command.dotted,
                "argument --all: At most one of --all | --condition | --condition-from-file can be specified.",
            )
        specified, condition = self._condition(parsed, role)
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            record = secrets.get(f"{project}/{secret}")
            if record is None:  # the command's CatchHTTPErrorRaiseHTTPException format
                raise GcloudError(
                    f"Status code: 404. Secret [projects/{inventory.project_number(project)}/secrets/{secret}] "
                    "not found or has no versions.."
                )
            plain = record.setdefault("bindings", {})
            conditional = record.setdefault("conditional_bindings", [])
            if conditional and not specified and not remove_all:
                raise GcloudError(
                    "Removing a binding without specifying a condition from a policy containing conditions "
                    "is prohibited in non-interactive mode. Run the command again with `--condition=None` "
                    "to remove a binding without condition or run command with `--all` to remove all "
                    "bindings of the specified principal and role."
                )
            removed = False
            if (remove_all or condition is None) and member in plain.get(role, []):
                plain[role].remove(member)
                if not plain[role]:
                    del plain[role]
                record.get(iam.GRANTED_AT, {}).get(role, {}).pop(member, None)
                removed = True
            for binding in list(conditional):
                matches = remove_all or binding["condition"] == condition
                if binding["role"] == role and member in binding["members"] and matches:
                    binding["members"].remove(member)
                    removed = True
            record["conditional_bindings"] = [b for b in conditional if b["members"]]
            if not removed:
                raise GcloudError(
                    "Policy binding with the specified principal, role, and condition not found!"
                )
            txn.save("secrets")
            plain, conditional = iam.policy_from_docs(
                {"secrets": secrets}, f"projects/{project}/secrets/{secret}", False
            )
        self.err(f"Updated IAM policy for secret [{secret}].\n")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_secrets_get_iam_policy(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        self._secret_record(project, secret)
        plain, conditional = iam.iam_policy(self.layout, f"projects/{project}/secrets/{secret}")
        self.out(_format(self._policy(plain, conditional), parsed.get("format")))
        return 0

    # -- compute --------------------------------------------------------------------------
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
        labels = _parse_labels(parsed.get("labels"))
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
        created: list[dict[str, Any]] = []
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
                    "project": project,
                    "zone": zone,
                    "status": "RUNNING",
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
                    },
                    "bootDiskSize": size,
                    "scheduling": {
                        "provisioningModel": parsed.get("provisioning-model") or "STANDARD",
                        "instanceTerminationAction": parsed.get("instance-termination-action"),
                        "onHostMaintenance": parsed.get("maintenance-policy") or "MIGRATE",
                        "maxRunDuration": parsed.get("max-run-duration"),
                    },
                    "reservationAffinity": {
                        "type": affinity or "any",
                        "reservation": parsed.get("reservation"),
                    },
                    "created": rfc3339(),
                }
                vms[key] = record
                created.append(record)
                history = txn.doc("vm_history")
                history.setdefault(key, []).append(
                    {"machineType": machine_type, "created": time.time(), "deleted": None, "programs": []}
                )
                vm_dir = self.layout.vm_dir(name)
                vm_dir.mkdir(parents=True, exist_ok=True)
            txn.save("vms")
            txn.save("vm_history")
        # the create operation runs until the VM is up (the VM exists, and bills, meanwhile)
        time.sleep(capacity_seconds(load_settings(self.layout).minute_seconds, "vm_create"))
        for record in created:
            self.err(f"Created [{self._instance_url(project, zone, record['name'])}].\n")
        if parsed.get("format"):
            self.out(_format([self._instance_resource(r) for r in created], parsed.get("format")))
        else:
            rows = [["NAME", "ZONE", "MACHINE_TYPE", "PREEMPTIBLE", "INTERNAL_IP", "EXTERNAL_IP", "STATUS"]]
            rows += [
                [r["name"], zone, r["machineType"], "", "10.128.0.5", _external_ip(r["name"]), r["status"]]
                for r in created
            ]
            self.out(_table(rows))
        return 0

    def _instance_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        project, zone, name = record["project"], record["zone"], record["name"]
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        affinity = record.get("reservationAffinity", {})
        running = record["status"] == "RUNNING"
        resource = {
            "id": str(int(hashlib.sha256(f"{project}/{zone}/{name}".encode()).hexdigest()[:15], 16)),
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
                        {"name": "External NAT", **({"natIP": _external_ip(name)} if running else {})}
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
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
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
        # the delete operation stops the VM first (it bills until then): its processes end
        time.sleep(capacity_seconds(load_settings(self.layout).minute_seconds, "vm_delete"))
        from tpu_rl_sandbox.machines import dockerd

        for name in names:
            dockerd.stop_all(self.layout.vm_dir(name))
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            history = txn.doc("vm_history")
            for name in names:
                vms.pop(f"{project}/{zone}/{name}", None)
                shutil.rmtree(self.layout.vm_dir(name), ignore_errors=True)
                lives = history.get(f"{project}/{zone}/{name}") or []
                if lives and lives[-1]["deleted"] is None:
                    lives[-1]["deleted"] = time.time()
            txn.save("vms")
            txn.save("vm_history")
        for name in names:
            self.err(f"Deleted [{self._instance_url(project, zone, name)}].\n")
        return 0

    def cmd_compute_instances_start(self, parsed: GcloudParse) -> int:
        """surface/compute/instances/start.py: instances.start on each VM, then one "Updated" line and
        its IPs per VM; starting a RUNNING VM does nothing (the API's operation is done at once)."""
        project = self.project(parsed)
        names = list(parsed.positionals["INSTANCE_NAMES"])
        zone = self.zone(parsed, names[0])
        for name in names:
            self._vm(project, zone, name)
        self._require_permission(
            "compute.instances.start", project, f"projects/{project}/zones/{zone}/instances/{names[0]}"
        )
        if parsed.get("async"):
            raise GcloudError("sandbox: --async is not simulated for instances start")
        time.sleep(capacity_seconds(load_settings(self.layout).minute_seconds, "vm_create"))
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            history = txn.doc("vm_history")
            for name in names:
                record = vms[f"{project}/{zone}/{name}"]
                if record["status"] == "RUNNING":
                    continue
                if record["status"] != "TERMINATED":
                    raise GcloudError(
                        f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready"
                    )
                record.update(status="RUNNING", lastStartTimestamp=rfc3339())
                lives = history.get(f"{project}/{zone}/{name}") or []
                if lives:
                    lives[-1].setdefault("started", []).append(time.time())
            txn.save("vms")
            txn.save("vm_history")
        for name in names:
            self.err(f"Updated [{self._instance_url(project, zone, name)}].\n")
            self.err("Instance internal IP is 10.128.0.5\n")
            self.err(f"Instance external IP is {_external_ip(name)}\n")
        return 0

    def _preempt_vm(self, project: str, zone: str, name: str) -> None:
        """Compute Engine preempts the VM as its ``instanceTerminationAction`` says: DELETE deletes
        it (its boot disk too: autoDelete), STOP leaves it TERMINATED with its boot disk (so what
        was installed on it). ``vm_history`` notes when."""
        now = time.time()
        from tpu_rl_sandbox.machines import dockerd

        dockerd.stop_all(self.layout.vm_dir(name))  # the machine shuts down: its containers end
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            history = txn.doc("vm_history")
            key = f"{project}/{zone}/{name}"
            record = vms.get(key)
            if record is None:
                return
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
                record.update(status="TERMINATED", lastStopTimestamp=rfc3339())
            txn.save("vms")
            txn.save("vm_history")

    def _record_program(self, project: str, zone: str, name: str, module: str, runtime: str) -> None:
        from tpu_rl_sandbox.machines.vm_services import record_program

        record_program(self.store, project, zone, name, module, runtime)

    def _vm(self, project: str, zone: str, name: str) -> dict[str, Any]:
        record = self.store.read("vms").get(f"{project}/{zone}/{name}")
        if record is None:
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        return record

    def cmd_compute_instances_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["NAME"])
        record = self._vm(project, self.zone(parsed, name), name)
        self.out(_format(self._instance_resource(record), parsed.get("format")))
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
            self.out(_format(resources, parsed.get("format")))
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
            self.out(_table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    def _ssh_key_expiration(self, parsed: GcloudParse) -> dt.datetime | None:
        """compute/ssh_utils.GetSSHKeyExpirationFromArgs / AddSSHKeyExpirationArgs."""
        dotted = parsed.command.dotted
        if {"ssh-key-expiration", "ssh-key-expire-after"} <= parsed.given:
            raise GcloudUsageError(
                dotted,
                "argument --ssh-key-expiration: At most one of --ssh-key-expiration | --ssh-key-expire-after "
                "can be specified.",
            )
        now = dt.datetime.now(dt.UTC)
        if parsed.get("ssh-key-expire-after"):
            raw = str(parsed.get("ssh-key-expire-after"))
            try:
                seconds = parse_duration(raw)
            except ValueError as error:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expire-after: Failed to parse duration: {error}"
                ) from None
            if seconds < 1:
                raise GcloudUsageError(
                    dotted,
                    f"argument --ssh-key-expire-after: value must be greater than or equal to 1s; received: {raw}",
                )
            return now + dt.timedelta(seconds=seconds)
        if parsed.get("ssh-key-expiration"):
            raw = str(parsed.get("ssh-key-expiration"))
            try:
                moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expiration: Failed to parse date/time: {raw}"
                ) from None
            moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
            if moment < now:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expiration: Date/time must be in the future: {raw}"
                )
            return moment
        return None

    def _ensure_ssh_key(self, parsed: GcloudParse, user: str) -> str:
        """The public key (``ssh-rsa AAAA... comment``) of ``--ssh-key-file`` (default
        ``~/.ssh/google_compute_engine``), made with ``ssh-keygen -N '' -t rsa -f PATH`` when absent
        (command_lib/util/ssh/ssh.py Keys.EnsureKeysExist / Validate / KeygenCommand)."""
        home = self.env.get("HOME") or str(Path.home())
        raw = str(parsed.get("ssh-key-file") or DEFAULT_SSH_KEY_FILE)
        path = Path(home + raw[1:] if raw == "~" or raw.startswith("~/") else raw)
        if not path.is_absolute():
            path = Path.cwd() / path
        public = Path(str(path) + ".pub")

        def first_line(file: Path) -> str | None:
            try:
                return (file.read_text().splitlines() or [""])[0].strip() or None
            except OSError:
                return None

        private_line, public_line = first_line(path), first_line(public)
        if public_line is not None and not re.fullmatch(r"(ssh|ecdsa)-\S+ \S+( .*)?", public_line):
            self.err(f"WARNING: The public SSH key file [{public}] is corrupt.\n")
            public_line = None
        present = (private_line is not None, public_line is not None)
        if present == (True, True):
            return str(public_line)
        if present == (False, False) and not path.exists() and not public.exists():
            self.err(
                "WARNING: The private SSH key file for gcloud does not exist.\n"
                "WARNING: The public SSH key file for gcloud does not exist.\n"
                "WARNING: You do not have an SSH key for gcloud.\n"
                "WARNING: SSH keygen will be executed to generate a key.\n"
            )
        else:
            status = [
                ("private key", "PRESENT" if present[0] else "BROKEN" if path.exists() else "ABSENT", path),
                (
                    "public key",
                    "PRESENT" if present[1] else "BROKEN" if public.exists() else "ABSENT",
                    public,
                ),
            ]
            lines = "".join(
                f"{kind:<15} {'(' + state + ')':<10} [{file}]\n" for kind, state, file in sorted(status)
            )
            self.err(
                f"WARNING: Your SSH key files are broken.\n{lines}We are going to overwrite all above files.\n"
            )
            if not parsed.get("force-key-file-overwrite"):
                raise GcloudError("Aborted by user.")
            path.unlink(missing_ok=True)
            public.unlink(missing_ok=True)
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
        material = base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + os.urandom(270)).decode()
        hostname = self.env.get("HOSTNAME") or "localhost"
        public_text = f"ssh-rsa {material} {user}@{hostname}"
        private_text = (
            "-----BEGIN OPENSSH PRIVATE KEY-----\n"
            + base64.b64encode(b"openssh-key-v1\x00tpu-rl-sandbox stand-in " + os.urandom(96)).decode()
            + "\n-----END OPENSSH PRIVATE KEY-----\n"
        )
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(private_text)
        os.chmod(path, 0o600)
        public.write_text(public_text + "\n")
        os.chmod(public, 0o644)
        self.err(
            "Generating public/private rsa key pair.\n"
            f"Your identification has been saved in {path}\nYour public key has been saved in {public}\n"
        )
        return public_text

    def _add_project_ssh_key(
        self, project: str, user: str, public_key: str, expiration: dt.datetime | None
    ) -> bool:
        """compute/ssh_utils._AddSSHKeyToMetadataMessage + _PrepareSSHKeysValue: the entry is
        added to the project's ``ssh-keys`` only when that exact entry is not there; expired
        entries are dropped whenever the value is rewritten. True when the metadata changed."""
        if expiration is None:
            entry = f"{user}:{public_key}"
        else:
            key = " ".join(public_key.split()[:2])
            expire_on = expiration.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
            blob = json.dumps({"userName": user, "expireOn": expire_on}).replace(" ", "")
            entry = f"{user}:{key} google-ssh {blob}"
        now = dt.datetime.now(dt.UTC)
        with self.store.txn() as txn:
            metadata = txn.doc("project_metadata").setdefault(project, {})
            entries: list[str] = metadata.setdefault("ssh-keys", [])
            if entry in entries:
                return False
            kept = [e for e in entries if (_ssh_key_expiry(e) or now) >= now]
            metadata["ssh-keys"] = [*kept, entry]
            txn.save("project_metadata")
        return True

    def _os_login(self, project: str) -> bool:
        """command_lib/util/ssh/ssh.py FeatureEnabledInMetadata / MetadataHasEnable: the project's
        ``enable-oslogin`` item, ``.lower() == 'true'`` (the sandbox's VMs carry no instance metadata)."""
        value = self._project_metadata(project).get("enable-oslogin")
        return isinstance(value, str) and value.lower() == "true"

    def cmd_compute_ssh(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        targets = list(parsed.positionals["USER_AT_INSTANCE"])
        if not targets:
            raise GcloudError("argument [USER@]INSTANCE: Must be specified.", code=2)
        target, extra = targets[0], targets[1:]
        user, _, name = target.rpartition("@")
        user = user or self.env.get("USER") or "sandbox"
        zone = self.zone(parsed, name)
        record = self._vm(project, zone, name)
        expiration = self._ssh_key_expiration(parsed)
        public_key = self._ensure_ssh_key(parsed, user)
        if record["status"] != "RUNNING":
            # A stopped VM has no external IP (ssh_utils.GetExternalInterface: an access config
            # without natIP raises UnallocatedIPAddressError); through IAP, the tunnel has no backend:
            # the websocket's close "%r: %r" of code 4003 (iap_tunnel_websocket_helper._OnClose) in
            # iap_tunnel_websocket's "Error while connecting [%s].%s" with its 4003 hint.
            if parsed.get("tunnel-through-iap"):
                self.err(
                    "ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting "
                    "[4003: 'failed to connect to backend']. (Failed to connect to port 22)\n"
                )
                self.err("kex_exchange_identification: Connection closed by remote host\n")
                self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
                return 255
            raise GcloudError(
                f"Instance [{name}] in zone [{zone}] has not been allocated an external IP address yet. "
                "Try rerunning this command later."
            )
        os_login = self._os_login(project)
        keys_newly_added = False
        if os_login:
            # command_lib/util/ssh/ssh.py GetOsloginState: the key goes to the caller's OS Login
            # profile, not the metadata, and the session's user is the profile's POSIX username.
            user = _posix_username(self.account())
        elif self._add_project_ssh_key(project, user, public_key, expiration):
            keys_newly_added = True
            self.err(
                "Updating project ssh metadata...⠹Updated "
                f"[https://www.googleapis.com/compute/v1/projects/{project}].\n"
                "Updating project ssh metadata...done.\nWaiting for SSH key to propagate.\n"
            )
        # The connection: from the worker's address to the external IP, or from IAP's range with
        # --tunnel-through-iap; a firewall that lets neither in leaves ssh's connect to time out.
        # surface/compute/ssh.py: after a new key, the poller retries until SSH_KEY_PROPAGATION_TIMEOUT
        # and raises ssh_utils.NetworkError; otherwise ssh's own exit 255 is reported.
        source = vpc.IAP_ADDRESS if parsed.get("tunnel-through-iap") else vpc.CALLER_ADDRESS
        network = str(record.get("network") or vpc.DEFAULT_NETWORK)
        if not vpc.ingress_allowed(vpc.read_vpc(self.store, project), network, source, 22):
            self.err(f"ssh: connect to host {_external_ip(name)} port 22: Connection timed out\n")
            if keys_newly_added:
                raise GcloudError(
                    "Could not SSH into the instance.  It is possible that your SSH key has not propagated to the "
                    "instance yet. Try running this command again.  If you still cannot connect, verify that the "
                    "firewall and instance are set to accept ssh traffic."
                )
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        denied = load_settings(self.layout).denied_permissions
        if os_login and {"compute.instances.osLogin", "compute.instances.osAdminLogin"} <= set(denied):
            # the guest's OS Login authorizes neither login: sshd refuses the key.
            self.err(f"{user}@{_external_ip(name)}: Permission denied (publickey).\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        sudoer = not os_login or "compute.instances.osAdminLogin" not in denied
        if self.faults().fire("ssh") is not None:
            self.err(f"ssh: connect to host {_external_ip(name)} port 22: Connection timed out\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        command = parsed.get("command")
        if command is None and extra:
            command = " ".join(extra)
        # the VM's simulated machine, imported only by the calls that reach it
        from tpu_rl_sandbox.machines import hosts
        from tpu_rl_sandbox.machines.vm_services import vm_services

        services = vm_services(self.layout, dict(self.env), project, zone, name, record)
        boot = record.get("lastStartTimestamp") or record["created"]  # its last boot
        booted = dt.datetime.fromisoformat(str(boot).replace("Z", "+00:00")).timestamp()
        boot_apt = load_settings(self.layout).boot_apt_seconds
        vm = hosts.VmHost(
            self.layout.vm_dir(name),
            services,
            name,
            user,
            project,
            list(record.get("scopes", [])),
            apt_busy_until=(booted + boot_apt / 2, booted + boot_apt),
            sudoer=sudoer,
            machine_type=str(record.get("machineType") or ""),
            zone=zone,
            layout_root=self.layout.root,
        )
        stdin = self.read_stdin()
        if command is None:
            # ssh without a command runs the login shell on stdin (no terminal: no prompt).
            self.err("Pseudo-terminal will not be allocated because stdin is not a terminal.\n")
        # sshd runs a command as `<login shell> -c <command>`.
        argv = ["-bash"] if command is None else ["bash", "-c", str(command)]
        status = vm.run_session(argv, stdin, self.out, self.err, self.env)
        if vm.preempted:
            # The VM shut down under the session: sshd closed the connection (OpenSSH clientloop.c
            # "Connection to %s closed by remote host.", exit 255), gcloud reports ssh's exit code.
            self._preempt_vm(project, zone, name)
            self.err(f"Connection to {_external_ip(name)} closed by remote host.\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        return status

    # -- networks, firewall rules, project metadata ----------------------------------------
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
        self.out(_format(vpc.network_resource(project, record), parsed.get("format")))
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
            self.out(_format(resources, parsed.get("format")))
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
            self.out(_table(rows))
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

    def _project_metadata(self, project: str) -> dict[str, Any]:
        return dict(self.store.read("project_metadata").get(project, {}))

    def cmd_compute_project_info_describe(self, parsed: GcloudParse) -> int:
        """A Compute API Project: ``commonInstanceMetadata.items`` (``ssh-keys`` as one newline-joined
        value, as compute/ssh_utils writes it)."""
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
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}",
        }
        self.out(_format(resource, parsed.get("format")))
        return 0

    def cmd_compute_project_info_add_metadata(self, parsed: GcloudParse) -> int:
        """surface/compute/project_info/add_metadata.py: ``--metadata KEY=VALUE,...`` merged in."""
        project = self.project(parsed)
        values = _parse_map("gcloud.compute.project-info.add-metadata", "metadata", parsed.get("metadata"))
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

    # -- services -------------------------------------------------------------------------
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
            self.out(_format(resources, parsed.get("format")))
        elif resources:
            rows = [["NAME", "TITLE"]] + [[r["config"]["name"], r["config"]["title"]] for r in resources]
            self.out(_table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    # -- reservations ---------------------------------------------------------------------
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

    def cmd_compute_reservations_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["RESERVATION"])
        zone = parsed.get("zone") or self.env.get("CLOUDSDK_COMPUTE_ZONE")
        if not zone:
            raise GcloudError(
                "Error parsing [reservation].\nThe [reservation] resource is not properly specified.\n"
                "Failed to find attribute [zone]. The attribute can be set in the following ways: \n"
                "- provide the argument `reservation` on the command line with a fully specified name\n"
                "- provide the argument `--zone` on the command line\n- set the property `compute/zone`"
            )
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        self._require_permission("compute.reservations.get", project, path)
        spec = load_settings(self.layout).reservation(str(zone), name)
        if spec is None:
            raise GcloudError(f"Could not fetch resource:\n - The resource '{path}' was not found")
        with self.store.txn() as txn:
            docs = {doc: txn.doc(doc) for doc in ("vms", "clusters")}
            in_use = self._reservations_in_use(docs, project, str(zone), name)
        self.out(
            _format(self._reservation_resource(project, str(zone), name, spec, in_use), parsed.get("format"))
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

    # -- container ------------------------------------------------------------------------
    def _cluster_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        pools = inventory.gke_node_pools(record)
        return {
            "name": record["name"],
            "location": record["region"],
            "zone": record["region"],
            "locations": [record["zone"]],
            "status": "RUNNING" if record.get("healthy", True) else "DEGRADED",
            "resourceLabels": dict(record.get("labels", {})),
            "createTime": record["created"],
            "currentMasterVersion": "1.35.1-gke.1000",
            "currentNodeCount": sum(p["initialNodeCount"] for p in pools),
            "endpoint": _external_ip(record["name"]),
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
            self.out(_format(resources, parsed.get("format")))
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
            self.out(_table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

    def cmd_container_clusters_describe(self, parsed: GcloudParse) -> int:
        record = self._cluster(parsed, "describe")
        self.out(_format(self._cluster_resource(record), parsed.get("format")))
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
            {"name": context, "cluster": {"server": f"https://{_external_ip(record['name'])}"}}
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


# ==================================================================================== main
def main(argv: list[str] | None = None) -> int:
    """Entry point of the fake ``gcloud``; records the call in ``<root>/calls.jsonl``."""
    args = list(sys.argv[1:] if argv is None else argv)
    start = call_start(os.environ, time.time())
    env = dict(os.environ)
    try:
        layout = layout_from_env(env)
    except Exception as error:
        sys.stderr.write(f"ERROR: (gcloud) {error}\n")
        return 1
    code = 1

    def read_stdin() -> bytes:
        return sys.stdin.buffer.read() if sys.stdin is not None else b""

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    try:
        app = Gcloud(layout, env, stdin=read_stdin, stdout=out, stderr=err)
        try:
            code = app.run(args)
        except GcloudUsageError as error:
            sys.stderr.write(error.render())
            code = 2
        except GcloudError as error:
            sys.stderr.write(f"ERROR: (gcloud) {error.message}\n")
            code = error.code
        except StateError as error:
            sys.stderr.write(f"ERROR: (gcloud) sandbox: {error}\n")
            code = 1
        return code
    finally:
        record_call(layout, "gcloud", args, env, os.getcwd(), code, start, time.time())
        sys.stdout.flush()
