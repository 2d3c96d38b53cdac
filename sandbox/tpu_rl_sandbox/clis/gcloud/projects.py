"""``gcloud projects add-iam-policy-binding|get-iam-policy``."""

from __future__ import annotations

from tpu_rl_sandbox.clis.gcloud.iam_policy import IamPolicies
from tpu_rl_sandbox.clis.gcloud.output import formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world import iam
from tpu_rl_sandbox.world.settings import load_settings


class ProjectsCommands(IamPolicies):
    """``gcloud projects``."""

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
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_projects_get_iam_policy(self, parsed: GcloudParse) -> int:
        project = str(parsed.positionals["PROJECT_ID"])
        plain, conditional = iam.iam_policy(self.layout, f"projects/{project}")
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0
