"""Fake ``gcloud``: the subset the provider uses, with gcloud's argument rules and messages.

Run as ``python -m tpu_rl_sandbox.fake_gcloud ARGS`` (through the
``<root>/bin/gcloud`` shim). Buckets and objects live in fake-gcs-server; everything else
(secrets, IAM, VMs, clusters) in the sandbox state. Secret payloads are never stored: only
their SHA-256 and length.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tpu_rl_sandbox import cloud, emulator, hosts, maxtext_sim, storage_ops
from tpu_rl_sandbox.flags import GcloudParse, GcloudUsageError, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.fsview import GcsStore, LocalStore, Router
from tpu_rl_sandbox.gcloud_commands import (
    COMMANDS,
    VM_COMMANDS,
    GcloudError,
    SecretAccess,
    Write,
    _cp_from_stdin,
    run_on_vm,
)
from tpu_rl_sandbox.layout import SandboxLayout, layout_from_env, rfc3339
from tpu_rl_sandbox.state import (
    FAULT_ENV,
    FaultGate,
    StateError,
    StateStore,
    call_start,
    parse_faults,
    record_call,
)

__all__ = ["COMMANDS", "VM_COMMANDS", "Gcloud", "GcloudError", "SecretAccess", "main", "run_on_vm"]

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
    if isinstance(value, list):
        return "".join("---\n" + yaml.safe_dump(item, sort_keys=True) for item in value)
    return yaml.safe_dump(value, sort_keys=True)


def _dig(resource: Any, dotted: str) -> Any:
    current = resource
    for piece in dotted.split("."):
        if isinstance(current, dict):
            current = current.get(piece)
        else:
            return None
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

    @property
    def router(self) -> Router:
        if self._router is None:
            self._router = Router(GcsStore(emulator.api_for(self.layout)), LocalStore(Path("/")))
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

    # -- dispatch -------------------------------------------------------------------------
    def run(self, argv: list[str]) -> int:
        command, rest = gcloud_resolve(COMMANDS, argv)
        parsed = gcloud_parse(command, rest)
        handler = getattr(self, "cmd_" + "_".join(part.replace("-", "_") for part in command.path))
        try:
            parse_faults(self.env.get(FAULT_ENV))
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
            return _cp_from_stdin(
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
        account = self.env.get("CLOUDSDK_CORE_ACCOUNT", "sandbox-user@example.com")
        self.out(
            _format(
                [{"account": account, "status": "ACTIVE"}], parsed.get("format"), default="value(account)"
            )
        )
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
    def _policy(bindings: dict[str, list[str]]) -> dict[str, Any]:
        etag = hashlib.sha256(json.dumps(bindings, sort_keys=True).encode()).hexdigest()[:12]
        return {
            "bindings": [
                {"members": sorted(members), "role": role} for role, members in sorted(bindings.items())
            ],
            "etag": "BwY" + etag,
            "version": 1,
        }

    def cmd_projects_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        project = str(parsed.positionals["PROJECT_ID"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        self._check_role(role)
        self._check_member(member, project)
        with self.store.txn() as txn:
            iam = txn.doc("iam")
            bindings = iam.setdefault("project_bindings", {}).setdefault(project, {})
            members = bindings.setdefault(role, [])
            if member not in members:
                members.append(member)
            txn.save("iam")
            policy = self._policy(bindings)
        self.err(f"Updated IAM policy for project [{project}].\n")
        self.out(_format(policy, parsed.get("format")))
        return 0

    def cmd_projects_get_iam_policy(self, parsed: GcloudParse) -> int:
        project = str(parsed.positionals["PROJECT_ID"])
        bindings = self.store.read("iam").get("project_bindings", {}).get(project, {})
        self.out(_format(self._policy(bindings), parsed.get("format")))
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
                    f"[projects/{cloud.project_number(project)}/secrets/{secret}] already exists."
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
                f"NOT_FOUND: Secret [projects/{cloud.project_number(project)}/secrets/{secret}] not found."
            )
        return record

    def cmd_secrets_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        record = self._secret_record(project, secret)
        resource = {
            "createTime": record["created"],
            "etag": '"' + hashlib.sha256(secret.encode()).hexdigest()[:14] + '"',
            "name": f"projects/{cloud.project_number(project)}/secrets/{secret}",
            "replication": {"automatic": {}}
            if record.get("replication") == "automatic"
            else {"userManaged": {}},
        }
        if record.get("labels"):
            resource["labels"] = record["labels"]
        self.out(_format(resource, parsed.get("format")))
        return 0

    def cmd_secrets_delete(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            if f"{project}/{secret}" not in secrets:
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{cloud.project_number(project)}/secrets/{secret}] not found."
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
                    f"NOT_FOUND: Secret [projects/{cloud.project_number(project)}/secrets/{secret}] not found."
                )
            version = self._add_version(txn, f"{project}/{secret}", payload)
            txn.save("secrets")
        self.err(f"Created version [{version}] of the secret [{secret}].\n")
        return 0

    def cmd_secrets_versions_access(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = parsed.get("secret")
        if not secret:
            raise GcloudError("argument --secret: Must be specified.", code=2)
        value, problem = cloud.secret_value(
            self.store, project, str(secret), str(parsed.positionals["VERSION"])
        )
        if value is None:
            raise GcloudError(problem.split(": ", 1)[-1].replace("404 ", "NOT_FOUND: ", 1))
        self.out(value)
        return 0

    def cmd_secrets_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        self._check_role(role)
        self._check_member(member, project)
        with self.store.txn() as txn:
            record = txn.doc("secrets").get(f"{project}/{secret}")
            if record is None:
                raise GcloudError(
                    f"NOT_FOUND: Secret [projects/{cloud.project_number(project)}/secrets/{secret}] not found."
                )
            members = record.setdefault("bindings", {}).setdefault(role, [])
            if member not in members:
                members.append(member)
            policy = self._policy(record["bindings"])
            txn.save("secrets")
        self.err(f"Updated IAM policy for secret [{secret}].\n")
        self.out(_format(policy, parsed.get("format")))
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

    def cmd_compute_instances_create(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        names = list(parsed.positionals["INSTANCE_NAMES"])
        zone = self.zone(parsed, names[0])
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
        created: list[dict[str, Any]] = []
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for name in names:
                key = f"{project}/{zone}/{name}"
                if key in vms:
                    raise GcloudError(
                        f"Could not fetch resource:\n - The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
                    )
                record = {
                    "name": name,
                    "project": project,
                    "zone": zone,
                    "status": "RUNNING",
                    "machineType": parsed.get("machine-type") or "n1-standard-1",
                    "labels": labels,
                    "scopes": self._scopes(parsed.get("scopes")),
                    "serviceAccount": parsed.get("service-account")
                    or f"{cloud.project_number(project)}-compute@developer.gserviceaccount.com",
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
                    },
                    "reservationAffinity": {
                        "type": affinity or "any",
                        "reservation": parsed.get("reservation"),
                    },
                    "created": rfc3339(),
                    "ssh_keys_propagated": False,
                }
                vms[key] = record
                created.append(record)
                vm_dir = self.layout.vm_dir(name)
                vm_dir.mkdir(parents=True, exist_ok=True)
            txn.save("vms")
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
                    "accessConfigs": [{"name": "External NAT", "natIP": _external_ip(name)}],
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
        with self.store.txn() as txn:
            vms = txn.doc("vms")
            for name in names:
                vms.pop(f"{project}/{zone}/{name}", None)
                shutil.rmtree(self.layout.vm_dir(name), ignore_errors=True)
            txn.save("vms")
        for name in names:
            self.err(f"Deleted [{self._instance_url(project, zone, name)}].\n")
        return 0

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
                    r["networkInterfaces"][0]["accessConfigs"][0]["natIP"],
                    r["status"],
                ]
                for r in resources
            ]
            self.out(_table(rows))
        else:
            self.err("Listed 0 items.\n")
        return 0

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
        if record["status"] != "RUNNING":
            raise GcloudError(
                f"Instance [{name}] in zone [{zone}] is not running (status {record['status']})."
            )
        if not record.get("ssh_keys_propagated"):
            self.err("Updating project ssh metadata...done.\nWaiting for SSH key to propagate.\n")
            with self.store.txn() as txn:
                txn.doc("vms")[f"{project}/{zone}/{name}"]["ssh_keys_propagated"] = True
                txn.save("vms")
        if self.faults().fire("ssh") is not None:
            self.err(f"ssh: connect to host {_external_ip(name)} port 22: Connection timed out\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        command = parsed.get("command")
        if command is None and extra:
            command = " ".join(extra)
        step_seconds, hold_file = maxtext_sim.context_from_env(dict(self.env))
        store = self.store
        faults = self.faults()
        services = hosts.MachineServices(
            gcs=GcsStore(
                emulator.api_for(self.layout),
                identity=record.get("serviceAccount", ""),
                can_write=lambda bucket: bool(
                    {"cloud-platform", "storage-rw", "storage-full"} & set(record.get("scopes", []))
                ),
                denied_detail="Access denied. Provided scope(s) are not authorized.",
            ),
            secret_access=lambda p, s, v: cloud.secret_value(store, p, s, v),
            fault=faults.fire,
            seed=f"{project}/{zone}/{name}",
            step_seconds=step_seconds,
            hold_file=hold_file,
            cancelled=lambda: False,
            default_project=project,
        )
        vm = hosts.VmHost(
            self.layout.vm_dir(name), services, name, user, project, list(record.get("scopes", []))
        )
        stdin = self.read_stdin()
        if command is None:
            # ssh without a command runs the login shell on stdin (no terminal: no prompt).
            self.err("Pseudo-terminal will not be allocated because stdin is not a terminal.\n")
            return vm.run_session(["-bash"], stdin, self.out, self.err, self.env)
        # sshd runs a command as `<login shell> -c <command>`.
        return vm.run_session(["bash", "-c", str(command)], stdin, self.out, self.err, self.env)

    # -- container ------------------------------------------------------------------------
    def _cluster_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        pools = [
            {
                "name": pool["name"],
                "config": {
                    "machineType": pool["machine_type"],
                    "serviceAccount": pool.get("service_account", ""),
                },
                "initialNodeCount": pool.get("nodes", 1),
                "status": "ERROR" if pool.get("failed") else "RUNNING",
                **(
                    {"placementPolicy": {"tpuTopology": pool["topology"], "type": "COMPACT"}}
                    if pool.get("topology")
                    else {}
                ),
            }
            for pool in record.get("node_pools", [])
        ]
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
        record = cloud.find_cluster(self.store, project, str(location), name)
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


if __name__ == "__main__":
    random.seed()
    sys.exit(main())
