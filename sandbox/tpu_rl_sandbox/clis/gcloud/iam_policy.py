"""IAM policies as gcloud edits them (googlecloudsdk/command_lib/iam/iam_util.py): members,
roles, ``--condition``/``--condition-from-file``, adding a binding, the policy as printed."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError

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


class IamPolicies(GcloudCall):
    """The policy editing the ``add-iam-policy-binding`` commands share."""

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

    def _removal(self, parsed: GcloudParse, role: str) -> tuple[bool, bool, dict[str, str] | None]:
        """``(--all, condition specified, condition)`` of a ``remove-iam-policy-binding``
        (iam_util.AddArgsForRemoveIamPolicyBinding: ``--all`` excludes the condition flags)."""
        remove_all = bool(parsed.get("all"))
        if remove_all and {"condition", "condition-from-file"} & parsed.given:
            raise GcloudUsageError(
                parsed.command.dotted,
                "argument --all: At most one of --all | --condition | --condition-from-file can be specified.",
            )
        specified, condition = self._condition(parsed, role)
        return remove_all, specified, condition

    @staticmethod
    def _unbind_in_record(
        record: dict[str, Any],
        member: str,
        role: str,
        condition: dict[str, str] | None,
        *,
        specified: bool,
        remove_all: bool,
    ) -> None:
        """iam_util.RemoveBindingFromIamPolicyWithCondition on a secret's or bucket's stored policy:
        no ``--condition``/``--all`` on a policy holding a conditional binding is refused
        non-interactively; the binding with this member, role and condition must be there;
        ``--all`` removes it under every condition."""
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
            removed = True
        for binding in list(conditional):
            matches = remove_all or binding["condition"] == condition
            if binding["role"] == role and member in binding["members"] and matches:
                binding["members"].remove(member)
                removed = True
        record["conditional_bindings"] = [b for b in conditional if b["members"]]
        if not removed:
            raise GcloudError("Policy binding with the specified principal, role, and condition not found!")
