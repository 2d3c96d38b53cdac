"""``gcloud secrets``: secrets, their versions and IAM policies. Payloads are never stored: only
their SHA-256 and length."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.clis.gcloud.iam_policy import IamPolicies
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, api_error_text, formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError
from tpu_rl_sandbox.clis.gcloud.values import parse_labels, parse_map
from tpu_rl_sandbox.world import iam, inventory, secret_values
from tpu_rl_sandbox.world.timestamps import rfc3339

# Secret.annotations keys (google/cloud/secretmanager/v1/resources.proto)
ANNOTATION_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class SecretsCommands(IamPolicies):
    """``gcloud secrets``."""

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
                "labels": parse_labels(parsed.get("labels")),
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
        self.out(formatted(resource, parsed.get("format")))
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
        updates = parse_map(dotted, "update-annotations", parsed.get("update-annotations"))
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
            labels.update(parse_labels(parsed.get("update-labels")))
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
        self.out(formatted(versions, parsed.get("format")))
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
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_secrets_remove_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/secrets/remove_iam_policy_binding.py: get the policy (the secret must exist), then
        iam_util.RemoveBindingFromIamPolicyWithCondition: no --condition/--all on a policy holding
        a conditional binding is refused non-interactively; the binding with this member, role and
        condition must be there; --all removes it under every condition."""
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        remove_all, specified, condition = self._removal(parsed, role)
        with self.store.txn() as txn:
            secrets = txn.doc("secrets")
            record = secrets.get(f"{project}/{secret}")
            if record is None:  # the command's CatchHTTPErrorRaiseHTTPException format
                raise GcloudError(
                    f"Status code: 404. Secret [projects/{inventory.project_number(project)}/secrets/{secret}] "
                    "not found or has no versions.."
                )
            self._unbind_in_record(
                record, member, role, condition, specified=specified, remove_all=remove_all
            )
            record.get(iam.GRANTED_AT, {}).get(role, {}).pop(member, None)
            txn.save("secrets")
            plain, conditional = iam.policy_from_docs(
                {"secrets": secrets}, f"projects/{project}/secrets/{secret}", False
            )
        self.err(f"Updated IAM policy for secret [{secret}].\n")
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_secrets_get_iam_policy(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        secret = str(parsed.positionals["SECRET"])
        self._secret_record(project, secret)
        plain, conditional = iam.iam_policy(self.layout, f"projects/{project}/secrets/{secret}")
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0
