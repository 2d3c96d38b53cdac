"""What a TPU VM's SSH sessions need from its project, read with gcloud: the network, a firewall
rule that lets tcp:22 in, and whether OS Login is enforced (then ``sudo`` needs admin login).

Read-only gcloud calls through :class:`GclusterHook` (bounded, minimal env); the JSON is judged by
the pure :mod:`airflow_provider_tpu_rl.spec.preflight`. Used by ``TpuRlPreflightOperator`` and
``tpu-rl doctor --project``. A gcloud that cannot run raises the hook's ``ConfigurationError``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_tpu_rl.exceptions import CommandError
from airflow_provider_tpu_rl.render import preflight as commands
from airflow_provider_tpu_rl.spec import preflight as checks

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

log = logging.getLogger(__name__)


class VmAccessReader:
    """The network, firewall and OS Login reads of one project."""

    def __init__(self, hook: GclusterHook, *, timeout: float) -> None:
        self.hook = hook
        self.timeout = timeout

    def read_json(
        self, command: Any, what: str, needs: str, *, as_list: bool = False
    ) -> tuple[Any, list[str]]:
        """Run a read; its JSON, or ``(None, [one line])`` when it fails (``None, []``: not found).
        A transient failure raises (the task's retries apply)."""
        result = self.hook.run(command, log_output=False, timeout=self.timeout)
        if not result.ok and any(m in result.output for m in commands.NOT_FOUND):
            return None, []
        try:
            self.hook.check_result(command, result)
        except CommandError as err:
            if err.retryable:
                raise
            return None, [f"could not read {what} ({checks.error_line(str(err))}): the caller needs {needs}"]
        lines = result.output_lines
        document = checks.parse_json_list(lines) if as_list else checks.parse_json_document(lines)
        if document is None:
            return None, [f"gcloud printed no JSON for {what}"]
        return document, []

    def os_login(self, project: str) -> tuple[bool, list[str]]:
        """Whether the project's metadata enforces OS Login (``enable-oslogin``), and any problem."""
        info, problems = self.read_json(
            commands.describe_project_info(project),
            f"project {project}'s metadata",
            "compute.projects.get (roles/compute.instanceAdmin.v1)",
        )
        if info is None:
            return False, problems or [f"project {project} has no Compute Engine metadata"]
        enabled = checks.os_login_enabled(info)
        log.info("OS Login %s in %s", "enforced" if enabled else "not enforced", project)
        return enabled, []

    def network_problems(self, project: str, sources: Sequence[str]) -> list[str]:
        """The TPU VM's network exists and a firewall rule lets the SSH sessions in."""
        network = checks.VM_NETWORK
        found, problems = self.read_json(
            commands.describe_network(project, network),
            f"network {network}",
            "compute.networks.get (roles/compute.networkViewer)",
        )
        if problems:
            return problems
        if found is None:
            return [checks.network_not_found_problem(project, network)]
        rules_found, problems = self.read_json(
            commands.list_firewall_rules(project),
            f"the firewall rules of project {project}",
            "compute.firewalls.list (roles/compute.networkViewer)",
            as_list=True,
        )
        if problems:
            return problems
        rule = checks.ssh_allowing_rule(rules_found, network, sources)
        if rule is None:
            return [checks.ssh_firewall_problem(project, network, sources)]
        log.info("firewall rule %s lets SSH reach network %s", rule, network)
        return []
