"""``GclusterHook``: run Cluster Toolkit (``gcluster``) and ``gcloud`` commands from Airflow.

Every command runs without a shell, with stdin closed (or fed a secret/script, then closed), in a
fresh HOME and KUBECONFIG, with a minimal environment; each output line goes to the task log with
secrets redacted. ``run_checked`` turns a failure into a :class:`CommandError` whose ``kind`` (and so
``retryable``) comes from :func:`classify_failure`; a bad connection, a missing tool or secret is a
:class:`ConfigurationError`; unparsable output an :class:`OutputParseError`. This hook never raises
``AirflowFailException``: the operator decides what is fatal.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from airflow.providers.common.compat.sdk import BaseHook

from airflow_provider_tpu_rl.compat import AirflowException, mask_secret
from airflow_provider_tpu_rl.exceptions import (
    CommandError,
    ConfigurationError,
    FailureKind,
    OutputParseError,
)
from airflow_provider_tpu_rl.hooks.connection_fields import (
    CLUSTER_TOOLKIT_DEFAULT_VERSION,
    GCLUSTER_CONN_FIELDS,
    GCLUSTER_UI_FIELD_BEHAVIOUR,
    PACKER_DEFAULT_VERSION,
    TERRAFORM_DEFAULT_VERSION,
    legacy_field_behaviour,
    legacy_form_widgets,
)
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render import preflight as preflight_commands
from airflow_provider_tpu_rl.render import tpu_vm as tpu_vm_commands
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.timeouts import (
    command_timeout,
    kill_grace_seconds,
    ssh_boot_wait,
    stage_command_timeout,
    terraform_lock_timeout,
)
from airflow_provider_tpu_rl.toolchain import job_prereqs
from airflow_provider_tpu_rl.toolchain.adc import AdcStatus, find_adc
from airflow_provider_tpu_rl.toolchain.bundle import (
    bundle_root,
    current_platform,
    default_cache_dir,
    ensure_bundle,
)
from airflow_provider_tpu_rl.toolchain.dependency_check import (
    dependency_problem_line,
    parse_dependency_check,
)
from airflow_provider_tpu_rl.toolchain.failures import classify_failure, error_line
from airflow_provider_tpu_rl.toolchain.job_output import (
    GclusterJob,
    JobState,
    parse_job_list,
)
from airflow_provider_tpu_rl.toolchain.process import (
    CommandResult,
    PreparedProcess,
    Redactor,
    SyncProcess,
    minimal_env,
    prepare_process,
    run_sync,
)
from airflow_provider_tpu_rl.toolchain.tools import (
    PURPOSES,
    VERSION_TIMEOUT,
    Toolchain,
    ToolStatus,
    hashicorp_platform,
    query_version,
    resolve_toolchain,
    reverify,
)

__all__ = [
    "CommandError",
    "CommandResult",
    "ConfigurationError",
    "FailureKind",
    "GclusterConfig",
    "GclusterHook",
    "GclusterJob",
    "JobState",
    "OutputParseError",
    "Toolchain",
    "classify_failure",
]

TOOLS = ("gcluster", "gcloud")
ERROR_TAIL_LINES = 25
JOB_QUERY_TIMEOUT = 300.0
# gcluster's dependency check runs `terraform version --json` at most: bounded like a version query.
DEPENDENCY_CHECK_TIMEOUT = 2 * VERSION_TIMEOUT
# gcluster subcommands that run Terraform (cmd/dependencies.go checks terraform+packer before
# deploy/destroy/export-outputs; create is here too because the destroy task runs it right before
# destroy) and the ones that need kubectl + gke-gcloud-auth-plugin (cmd/job/prereq.go).
DEPLOY_SUBCOMMANDS = frozenset({"deploy", "create", "destroy", "export-outputs"})
JOB_SUBCOMMAND = "job"
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})


def _sha_setting(name: str, value: Any) -> Any:
    """A sha256 extra: a string, a mapping, or form text holding a JSON object."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise ConfigurationError(f"gcluster connection: {name} is not a JSON object: {err}") from err
    if value is not None and not isinstance(value, str | Mapping):
        raise ConfigurationError(f"gcluster connection: {name} must be a string or an object of strings")
    return value


def _subcommand(command: Command) -> str | None:
    return next((a for a in command.argv[1:] if not a.startswith("-")), None)


def default_timeout(command: Command) -> float:
    """Seconds a command may run when its caller gives no ``timeout``.

    ``gcluster deploy`` and ``gcluster destroy`` get their task's bound less a margin
    (:func:`~airflow_provider_tpu_rl.timeouts.stage_command_timeout`), so the command is stopped
    and the task fails on its own before Airflow's ``execution_timeout``; every other call gets
    ``[tpu_rl] command_timeout_minutes``.
    """
    sub = _subcommand(command) if command.tool == "gcluster" else None
    if sub == "deploy":
        return stage_command_timeout("deploy")
    if sub == "destroy":
        return stage_command_timeout("teardown")
    return command_timeout()


def terraform_env() -> dict[str, str]:
    """Environment giving Terraform's state lock a wait: ``TF_CLI_ARGS_apply=-lock-timeout=Ns``.

    gcluster runs Terraform through terraform-exec (cluster-toolkit v1.95.0 ``pkg/shell/
    terraform.go``: ``tf.PlanJSON`` then ``tf.Apply``/``tf.ApplyJSON`` of the plan file, for
    deploy and for destroy, which is ``plan -destroy`` + ``apply``). terraform-exec v0.24.0 passes
    the worker's environment through (``tfexec/cmd.go`` ``buildEnv``: ``os.Environ()`` when no
    ``SetEnv``, which gcluster never calls), and Terraform inserts ``TF_CLI_ARGS_<command>`` right
    after the command name. ``apply`` gets no ``-lock-timeout`` from terraform-exec (its default
    options have none), so ours holds; ``plan`` gets an explicit ``-lock-timeout=0s`` after it,
    which wins (Go flags: last one), so a held lock fails the plan at once: that error is
    transient (:mod:`~airflow_provider_tpu_rl.toolchain.failures`) and the task's retries wait.
    """
    return {"TF_CLI_ARGS_apply": f"-lock-timeout={int(terraform_lock_timeout())}s"}


def impersonation_env(chain: str | Sequence[str] | None, command: Command) -> dict[str, str]:
    """The environment that makes ``command`` act as the impersonated service account.

    - ``gcloud`` reads its ``auth/impersonate_service_account`` property from
      ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT``: one account, or a comma-separated delegation
      chain whose last account is the target (googlecloudsdk/core/credentials/store.py
      ``ParseImpersonationAccounts``). ``gcluster job`` runs gcloud and kubectl, whose
      ``gke-gcloud-auth-plugin`` takes its token from ``gcloud config config-helper``
      (surface/config/config_helper.py: ``store.Load``, impersonation allowed): both get it.
    - Terraform's google provider, run by ``gcluster deploy``/``destroy`` with the worker's
      environment (see :func:`terraform_env`), reads ``impersonate_service_account`` from
      ``GOOGLE_IMPERSONATE_SERVICE_ACCOUNT`` (hashicorp/terraform-provider-google, the provider's
      schema); its ``impersonate_service_account_delegates`` has no environment variable, so a
      delegation chain cannot reach it: a :class:`ConfigurationError` for those commands.

    gcluster's own Go calls (the deploy validators, ``cmd/destroy.go``, ``cmd/job/prereq.go``:
    ``google.FindDefaultCredentials``) use the worker's Application Default Credentials and are
    not impersonated.
    """
    try:
        accounts = list(rules.impersonation_accounts("impersonation_chain", chain))
    except SpecError as err:
        raise ConfigurationError(str(err)) from None
    if not accounts:
        return {}
    env = {"CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": ",".join(accounts)}
    if command_purpose(command) == "deploy":
        if len(accounts) > 1:
            raise ConfigurationError(
                f"impersonation_chain {accounts} has delegates, which Terraform under gcluster "
                f"{_subcommand(command)} cannot take (GOOGLE_IMPERSONATE_SERVICE_ACCOUNT is one account): "
                "impersonate the last account directly"
            )
        env["GOOGLE_IMPERSONATE_SERVICE_ACCOUNT"] = accounts[0]
    return env


def is_job_submit(command: Command) -> bool:
    """``gcluster job submit``: the command that runs gcluster's prerequisite check."""
    if command_purpose(command) != "jobs":
        return False
    words = [a for a in command.argv[1:] if not a.startswith("-")]
    return words[1:2] == ["submit"]


def command_purpose(command: Command) -> str | None:
    """The toolchain a gcluster command needs: ``deploy``, ``jobs`` or ``None``."""
    if command.tool != "gcluster":
        return None
    sub = _subcommand(command)
    if sub in DEPLOY_SUBCOMMANDS:
        return "deploy"
    if sub == JOB_SUBCOMMAND:
        return "jobs"
    return None


@dataclass(frozen=True)
class GclusterConfig:
    """The ``gcluster`` connection's extras."""

    project: str | None = None
    region: str | None = None
    zone: str | None = None
    gcluster_path: str | None = None
    gcloud_path: str | None = None
    bundle_dir: str | None = None
    cache_dir: str | None = None
    version: str = CLUSTER_TOOLKIT_DEFAULT_VERSION
    sha256: str | Mapping[str, str] | None = None
    download_base_url: str | None = None
    inherit_env: tuple[str, ...] = ()
    terraform_version: str = TERRAFORM_DEFAULT_VERSION
    terraform_sha256: str | Mapping[str, str] | None = None
    packer_version: str = PACKER_DEFAULT_VERSION
    packer_sha256: str | Mapping[str, str] | None = None
    hashicorp_base_url: str | None = None
    install_tools: bool = True

    def __post_init__(self) -> None:
        install: Any = self.install_tools
        if isinstance(install, str):  # a form field holds text
            text = install.strip().lower()
            if text not in _TRUE | _FALSE:
                raise ConfigurationError(
                    f"gcluster connection: install_tools must be true or false, got {install!r}"
                )
            install = text in _TRUE
        if not isinstance(install, bool):
            raise ConfigurationError(
                f"gcluster connection: install_tools must be true or false, got {install!r}"
            )
        object.__setattr__(self, "install_tools", install)
        for name in ("sha256", "terraform_sha256", "packer_sha256"):
            object.__setattr__(self, name, _sha_setting(name, getattr(self, name)))
        value: Any = self.inherit_env
        if isinstance(value, str):  # a form field holds text: a JSON list or comma-separated names
            try:
                value = json.loads(value) if value.lstrip().startswith("[") else value.split(",")
            except ValueError as err:
                raise ConfigurationError(
                    f"gcluster connection: inherit_env is not a JSON list of names: {err}"
                ) from err
            if isinstance(value, list):
                value = [v.strip() if isinstance(v, str) else v for v in value]
                value = [v for v in value if v != ""]
        if not isinstance(value, list | tuple):
            raise ConfigurationError(
                f"gcluster connection: inherit_env must be a list of names, got {type(value).__name__}"
            )
        names = tuple(value)
        bad = [
            n for n in names if not isinstance(n, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", n)
        ]
        if bad:
            raise ConfigurationError(
                f"gcluster connection: inherit_env: names must match [A-Za-z_][A-Za-z0-9_]*, "
                f"optionally ending in * (got {bad[0]!r})"
            )
        object.__setattr__(self, "inherit_env", names)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> GclusterConfig:
        """Read plain keys, or the old ``extra__gcluster__<key>`` form-field keys."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = extra.get(f.name)
            if value is None or value == "":
                value = extra.get(f"extra__gcluster__{f.name}")
            if value is not None and value != "":
                values[f.name] = value
        return cls(**values)


class GclusterHook(BaseHook):
    """Runs ``gcluster``/``gcloud`` :class:`Command` objects and queries ``gcluster job``.

    :param gcluster_conn_id: connection of type ``gcluster`` (extras: project, region, zone,
        gcluster_path, gcloud_path, bundle_dir, cache_dir, version, sha256, download_base_url,
        terraform_version, terraform_sha256, packer_version, packer_sha256, hashicorp_base_url,
        install_tools).
    :param config: use this configuration instead of reading the connection.
    :param impersonation_chain: service account(s) every command impersonates
        (:func:`impersonation_env`); ``None``: the worker's own identity.
    """

    conn_name_attr = "gcluster_conn_id"
    default_conn_name = "gcluster_default"
    conn_type = "gcluster"
    hook_name = "Cluster Toolkit (gcluster)"

    def __init__(
        self,
        gcluster_conn_id: str = default_conn_name,
        *,
        config: GclusterConfig | None = None,
        impersonation_chain: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.gcluster_conn_id = gcluster_conn_id
        self._config = config
        self.impersonation_chain = impersonation_chain
        self._tool_paths: dict[str, str] = {}
        self._toolchains: dict[str, Toolchain] = {}
        self._running: set[SyncProcess] = set()
        self._running_lock = threading.Lock()
        self._terminated = threading.Event()  # ends a wait between tries (on_kill)

    # ------------------------------------------------------------------ connection form
    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Form fields for Airflow < 3.2 (3.2+ reads ``conn-fields`` from provider info)."""
        return legacy_form_widgets(GCLUSTER_CONN_FIELDS)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return legacy_field_behaviour(GCLUSTER_UI_FIELD_BEHAVIOUR)

    # ------------------------------------------------------------------ configuration
    def _config_from_connection(self, conn: Any) -> GclusterConfig:
        extra = conn.extra_dejson if conn is not None else {}
        return GclusterConfig.from_extra(extra)

    def _missing_connection(self, err: Exception) -> GclusterConfig:
        if self.gcluster_conn_id != self.default_conn_name:
            raise ConfigurationError(
                f"gcluster connection {self.gcluster_conn_id!r} is not defined: {err}"
            ) from err
        self.log.info("No %r connection: using gcluster defaults", self.default_conn_name)
        return GclusterConfig()

    @property
    def config(self) -> GclusterConfig:
        """The connection's configuration (read once)."""
        if self._config is None:
            try:
                conn = self.get_connection(self.gcluster_conn_id)
            except AirflowException as err:  # AirflowNotFoundException
                self._config = self._missing_connection(err)
            else:
                self._config = self._config_from_connection(conn)
        return self._config

    def get_conn(self) -> GclusterConfig:
        return self.config

    def _cache_dir(self, config: GclusterConfig) -> Path:
        return Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()

    def cache_dir(self) -> Path:
        """The persistent per-worker cache (bundle, Terraform/Packer, plugin cache, SSH keys)."""
        return self._cache_dir(self.config)

    def ssh_key_file(self) -> Path:
        """``<cache>/ssh/<conn_id>/google_compute_engine``: one kept SSH key per connection.

        The folder is created (mode 0700); gcloud generates the key itself on first use.
        """
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.gcluster_conn_id) or "default"
        folder = self.cache_dir() / "ssh" / safe
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
        except OSError as err:
            raise ConfigurationError(
                f"cannot create the SSH key folder {folder}: {err}; set cache_dir"
            ) from err
        return folder / "google_compute_engine"

    def _install_bundle(self, config: GclusterConfig, *, download: bool = True) -> Path:
        return ensure_bundle(
            version=config.version,
            cache_dir=self._cache_dir(config),
            sha256=config.sha256,
            base_url=config.download_base_url,
            download=download,
        )

    def _resolve_tool(self, tool: str, config: GclusterConfig, *, download: bool = True) -> str:
        if tool in self._tool_paths:
            return self._tool_paths[tool]
        if tool == "gcluster":
            if not config.gcluster_path:
                # The cached bundle is re-verified on every use (never remembered).
                return str(self._install_bundle(config, download=download) / "gcluster")
            path = str(Path(config.gcluster_path).expanduser())
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise ConfigurationError(f"gcluster_path {path!r} is not an executable file")
        elif tool == "gcloud":
            configured = config.gcloud_path or "gcloud"
            found = shutil.which(os.path.expanduser(configured))
            if found is None:
                raise ConfigurationError(
                    f"gcloud not found ({configured!r}); install the Google Cloud CLI or set gcloud_path"
                )
            path = found
        else:
            raise ConfigurationError(f"unknown tool {tool!r}: this hook runs only {', '.join(TOOLS)}")
        self._tool_paths[tool] = path
        return path

    def _gcluster_resolver(self, config: GclusterConfig) -> Callable[[bool], tuple[str, str]]:
        def resolve(install: bool) -> tuple[str, str]:
            if config.gcluster_path:
                return self._resolve_tool("gcluster", config), "connection"
            try:
                plat = current_platform()
            except ConfigurationError:
                had = False
            else:
                had = (bundle_root(self._cache_dir(config), config.version, plat) / "gcluster").is_file()
            path = self._resolve_tool("gcluster", config, download=install)
            return path, "cache" if had else "downloaded"

        return resolve

    def _resolve_toolchain(
        self,
        config: GclusterConfig,
        purpose: str,
        install: bool,
        *,
        probe: bool = True,
        memo: dict[str, ToolStatus] | None = None,
    ) -> Toolchain:
        return resolve_toolchain(
            purpose,
            cache_dir=self._cache_dir(config),
            install=install and config.install_tools,
            terraform_version=config.terraform_version,
            terraform_sha256=config.terraform_sha256,
            packer_version=config.packer_version,
            packer_sha256=config.packer_sha256,
            base_url=config.hashicorp_base_url,
            gcluster=self._gcluster_resolver(config),
            gcloud_path=config.gcloud_path,
            base_env=minimal_env(os.environ, config.inherit_env),
            probe=probe,
            memo=memo,
            gcluster_version="any" if config.gcluster_path else config.version,
        )

    def toolchain(
        self,
        purpose: str,
        *,
        install: bool = True,
        memo: dict[str, ToolStatus] | None = None,
        probe: bool = True,
    ) -> Toolchain:
        """Find every tool ``purpose`` (``deploy``, ``jobs``, ``tpu_vm``) needs; with ``install``
        (and the connection's ``install_tools``), download the pinned Terraform/Packer when needed.

        Never raises for a missing tool: see :attr:`Toolchain.ok` / :meth:`Toolchain.problem_line`.
        ``memo`` shares tool statuses between purposes (``tpu-rl doctor --for all``); ``probe=False``
        skips asking gcluster and gcloud their versions (any version does; doctor shows them).
        """
        if purpose not in PURPOSES:
            raise ConfigurationError(
                f"unknown toolchain purpose {purpose!r}; choose one of {', '.join(PURPOSES)}"
            )
        chain = self._resolve_toolchain(self.config, purpose, install, memo=memo, probe=probe)
        if chain.ok:
            self._toolchains[purpose] = chain
        return chain

    def require_toolchain(self, purpose: str, *, install: bool = True) -> Toolchain:
        """:meth:`toolchain`, raising :class:`ConfigurationError` (one line) when a tool is missing."""
        chain = self.toolchain(purpose, install=install, probe=False)
        if not chain.ok:
            raise ConfigurationError(f"{chain.problem_line()} (run `tpu-rl doctor` for the details)")
        return chain

    def _ready_toolchain(self, purpose: str, config: GclusterConfig, *, install: bool) -> Toolchain:
        """The toolchain for one command: remembered per hook, its cached binaries re-verified."""
        chain = self._toolchains.get(purpose)
        if chain is not None:
            problem = reverify(chain)
            if problem is None:
                return chain
            self.log.warning("Re-resolving the %s toolchain: %s", purpose, problem)
            del self._toolchains[purpose]
        chain = self._resolve_toolchain(config, purpose, install, probe=False)
        if not chain.ok:
            raise ConfigurationError(f"{chain.problem_line()} (run `tpu-rl doctor` for the details)")
        self._toolchains[purpose] = chain
        return chain

    def gcluster_dependency_problem(
        self, chain: Toolchain, *, timeout: float = DEPENDENCY_CHECK_TIMEOUT
    ) -> str | None:
        """Run gcluster's own Terraform/Packer check with ``chain`` (the ``deploy`` toolchain, as
        the deploy will run); one line saying what it refuses and what to set, or ``None``.

        gcluster checks its dependencies itself at ``deploy``/``destroy`` and, short of them, asks
        ``[y/N]`` on stdin, which this provider closes: the deploy would die "user declined to
        download terraform". Here the check runs without a prompt (``--download-dependencies=false``)
        and without side effects (:func:`~airflow_provider_tpu_rl.render.preflight.gcluster_dependency_check`),
        in a fresh HOME like every command. Raises :class:`ConfigurationError` when gcluster cannot
        be resolved.
        """
        with tempfile.TemporaryDirectory(prefix="tpu-rl-dependency-check-") as folder:
            group = Path(folder) / "deployment" / "primary"
            group.mkdir(parents=True)
            command = preflight_commands.gcluster_dependency_check(str(group))
            result = self._run_with(command, chain, cwd=folder, timeout=timeout)
        config = self.config
        gcluster_status = next((s for s in chain.statuses if s.tool == "gcluster"), None)
        version = gcluster_status.version if gcluster_status else None
        if result.timed_out:
            return (
                f"gcluster's dependency check (`gcluster export-outputs <empty folder> "
                f"--download-dependencies=false`) did not finish in {timeout:g}s"
            )
        check = parse_dependency_check(result.output_lines)
        if not check.failed:
            if check.newer_warning:
                self.log.warning("gcluster: %s", check.newer_warning)
            return None
        if version is None:
            _, version, _ = query_version(
                "gcluster",
                self.tool_path("gcluster"),
                path=os.environ.get("PATH", os.defpath),
                base_env=minimal_env(os.environ, config.inherit_env),
            )
        try:
            plat = hashicorp_platform()
        except ConfigurationError:
            plat = "<os>_<arch>"
        return dependency_problem_line(
            check,
            gcluster_version=f"v{version}" if version else None,
            terraform=next((s for s in chain.statuses if s.tool == "terraform"), None),
            configured_terraform=config.terraform_version,
            default_terraform=TERRAFORM_DEFAULT_VERSION,
            platform=plat,
        )

    def tool_path(self, tool: str) -> str:
        """The executable for ``tool`` (``gcluster`` may be downloaded and cached once)."""
        return self._resolve_tool(tool, self.config)

    def bundle_dir(self) -> Path:
        """The Cluster Toolkit folder that holds ``examples/`` (blueprints)."""
        config = self.config
        if config.bundle_dir:
            return Path(config.bundle_dir).expanduser()
        if config.gcluster_path:
            candidate = Path(config.gcluster_path).expanduser().resolve().parent
            if (candidate / "examples").is_dir():
                return candidate
            raise ConfigurationError(
                f"no examples/ next to gcluster_path {config.gcluster_path!r}; set bundle_dir"
            )
        return self._install_bundle(config)

    # ------------------------------------------------------------------ running commands
    def _prepare(
        self,
        command: Command,
        tool_path: str,
        *,
        secrets: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
        job_home: str | os.PathLike[str] | None,
        toolchain: Toolchain | None = None,
    ) -> PreparedProcess:
        secret_values = {k: v for k, v in (secrets or {}).items() if v}
        for value in secret_values.values():
            mask_secret(value)
        payload: str | None = None
        if command.stdin_secret:
            payload = secret_values.get(command.stdin_secret)
            if payload is None:
                raise ConfigurationError(
                    f"{self._label(command)}: needs the secret {command.stdin_secret!r} on stdin, "
                    "but no value was given for it"
                )
        elif command.stdin_text is not None:
            payload = command.stdin_text
        extra_env = dict(toolchain.env) if toolchain else {}
        if command_purpose(command) == "deploy":
            extra_env.update(terraform_env())
        extra_env.update(impersonation_env(self.impersonation_chain, command))
        return prepare_process(
            [tool_path, *command.argv[1:]],
            command_env=command.env,
            stdin_payload=payload,
            secrets=secret_values.values(),
            job_home=job_home,
            cwd=cwd,
            ok_if_output_contains=command.ok_if_output_contains,
            inherit_env=self.config.inherit_env,
            path_prepend=toolchain.bin_dirs if toolchain else (),
            extra_env=extra_env,
        )

    @staticmethod
    def _label(command: Command) -> str:
        return command.description or " ".join(command.argv[:4])

    def _line_logger(
        self, command: Command, on_line: Callable[[str], None] | None, log_output: bool
    ) -> Callable[[str], None]:
        tool = command.tool

        def handle(line: str) -> None:
            if log_output:
                self.log.info("[%s] %s", tool, line)
            if on_line is not None:
                on_line(line)

        return handle

    def _register(self, process: SyncProcess | None, previous: list[SyncProcess]) -> None:
        with self._running_lock:
            if process is None:
                for p in previous:
                    self._running.discard(p)
                previous.clear()
            else:
                self._running.add(process)
                previous.append(process)

    def run(
        self,
        command: Command,
        *,
        secrets: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
        job_home: str | os.PathLike[str] | None = None,
        log_output: bool = True,
        wait_for_sshd: bool = True,
    ) -> CommandResult:
        """Run ``command`` to the end and return its exit code and redacted output lines.

        ``timeout`` (seconds) defaults to :func:`default_timeout`: no call runs unbounded. At the
        timeout the command's process tree gets SIGTERM, then SIGKILL after ``[tpu_rl]
        kill_grace_seconds``, and the result says ``timed_out``.

        ``secrets`` maps names to values: the one named by ``command.stdin_secret`` is written to
        stdin (exactly, no newline added), and all are masked. ``job_home`` keeps HOME (and so the
        ``gcluster job config set`` context) across calls; by default each call gets a fresh one.

        A gcluster command that runs Terraform (deploy/create/destroy/export-outputs) or a
        ``gcluster job`` command first needs its toolchain (:meth:`require_toolchain`): a missing
        tool is a one-line :class:`ConfigurationError` before any process starts; the toolchain's
        folders go first on the command's PATH, with ``TF_PLUGIN_CACHE_DIR``.

        A ``gcloud compute ssh`` refused by a booting guest is tried again (``wait_for_sshd``, off
        for a probe that only looks).
        """
        purpose = command_purpose(command)
        toolchain = self._ready_toolchain(purpose, self.config, install=True) if purpose else None
        bound = default_timeout(command) if timeout is None else timeout
        if wait_for_sshd and tpu_vm_commands.is_ssh(command):
            return self._run_until_sshd_answers(
                command, timeout=bound, secrets=secrets, cwd=cwd, job_home=job_home, on_line=on_line,
                log_output=log_output,
            )  # fmt: skip
        return self._run_with(
            command,
            toolchain,
            secrets=secrets,
            cwd=cwd,
            job_home=job_home,
            on_line=on_line,
            timeout=bound,
            log_output=log_output,
        )

    def _run_until_sshd_answers(self, command: Command, *, timeout: float, **kwargs: Any) -> CommandResult:
        """A ``gcloud compute ssh`` tried again while the VM's sshd refuses it (a guest still
        booting: no session ran), every ``[tpu_rl] ssh_boot_poll_seconds`` for up to
        ``ssh_boot_wait_minutes``, one log line per wait; ``timeout`` bounds the whole."""
        bound, poll = ssh_boot_wait()
        started = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - started)
            result = self._run_with(command, None, timeout=max(left, 1.0), **kwargs)
            refused = tpu_vm_commands.ssh_refused(result.exit_code, result.output_lines)
            waited = time.monotonic() - started
            if refused is None or result.timed_out or waited + poll > min(bound, left):
                return result
            self.log.info(
                "%s: %s (the VM's guest is still booting): trying again in %gs, %.0fs of %.0fs waited",
                self._label(command), refused, poll, waited, bound,
            )  # fmt: skip
            if self._terminated.wait(poll):
                return result

    def _run_with(
        self,
        command: Command,
        toolchain: Toolchain | None,
        *,
        timeout: float,
        secrets: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        job_home: str | os.PathLike[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        log_output: bool = True,
    ) -> CommandResult:
        """Run ``command`` with ``toolchain``'s folders first on PATH, bounded by ``timeout``."""
        tool_path = self.tool_path(command.tool)
        prepared = self._prepare(
            command, tool_path, secrets=secrets, cwd=cwd, job_home=job_home, toolchain=toolchain
        )
        submit = job_home is not None and is_job_submit(command)
        if submit and job_prereqs.seed(prepared.home, prepared.env):
            self.log.info("gcluster's prerequisite check passed within the hour here: not repeated")
        self.log.info("Running %s", prepared.redact(" ".join(command.argv)))
        mine: list[SyncProcess] = []
        result = run_sync(
            prepared,
            on_line=self._line_logger(command, on_line, log_output),
            timeout=timeout,
            register=lambda p: self._register(p, mine),
            grace=kill_grace_seconds(),
        )
        if submit and result.ok:
            job_prereqs.keep(prepared.home, prepared.env)
        return result

    def check_result(
        self, command: Command, result: CommandResult, secrets: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Return ``result`` if it is a success, else raise a :class:`CommandError`.

        Its ``kind`` is what :func:`classify_failure` makes of the output; a timeout is transient.
        """
        if result.ok:
            if result.ok_marker:
                self.log.info("%s: counted as done (%r in output)", self._label(command), result.ok_marker)
            return result
        redact = Redactor(v for v in (secrets or {}).values() if v)
        tail = "\n".join(redact(line) for line in result.output_lines[-ERROR_TAIL_LINES:])
        label = redact(self._label(command))
        if result.timed_out:
            raise CommandError(f"{label} timed out; last output:\n{tail}", FailureKind.TRANSIENT)
        refused = (
            tpu_vm_commands.ssh_refused(result.exit_code, result.output_lines)
            if tpu_vm_commands.is_ssh(command)
            else None
        )
        if refused is not None:
            bound = ssh_boot_wait()[0] / 60
            raise CommandError(
                f"{label}: the VM's sshd still refused connections after the boot wait "
                f"([tpu_rl] ssh_boot_wait_minutes = {bound:g}): {redact(refused)}",
                FailureKind.TRANSIENT,
            )
        kind = classify_failure(result.output)
        # The error line first: the one line a watcher or a user reads says what went wrong.
        said = error_line([redact(line) for line in result.output_lines])
        raise CommandError(
            f"{label} failed with exit code {result.exit_code} ({kind.value})"
            + (f": {said}" if said else "")
            + f"; last output:\n{tail}",
            kind,
        )

    def run_checked(
        self,
        command: Command,
        *,
        secrets: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
        job_home: str | os.PathLike[str] | None = None,
        log_output: bool = True,
    ) -> CommandResult:
        """:meth:`run`, raising :class:`CommandError` on failure (see :meth:`check_result`)."""
        result = self.run(
            command,
            secrets=secrets,
            cwd=cwd,
            on_line=on_line,
            timeout=timeout,
            job_home=job_home,
            log_output=log_output,
        )
        return self.check_result(command, result, secrets)

    def terminate(self) -> None:
        """Stop every command this hook is running (SIGTERM its process group, then SIGKILL)."""
        self._terminated.set()
        with self._running_lock:
            running = list(self._running)
        for process in running:
            process.stop()

    on_kill = terminate

    def active_gcloud_account(self, *, timeout: float = 180.0) -> str | None:
        """gcloud's active credentialed account, or ``None`` (cluster-toolkit cmd/job/prereq.go
        ``ensureGCloudAuthenticated``: exit 0 and an account on stdout). ``ConfigurationError``
        when gcloud cannot run."""
        from airflow_provider_tpu_rl.render.preflight import active_account
        from airflow_provider_tpu_rl.spec.preflight import parse_active_account

        result = self.run(active_account(), log_output=False, timeout=timeout)
        return parse_active_account(result.output_lines) if result.ok else None

    def gcloud_components(self, *, timeout: float = 180.0) -> set[str] | None:
        """The components of the gcloud this hook runs (``gcloud version --format=json``), or
        ``None`` when it does not say; ``ConfigurationError`` when gcloud cannot run."""
        from airflow_provider_tpu_rl.render.preflight import gcloud_version
        from airflow_provider_tpu_rl.spec.preflight import parse_gcloud_components

        result = self.run(gcloud_version(), log_output=False, timeout=timeout)
        return parse_gcloud_components(result.output_lines) if result.ok else None

    def adc_status(self, *, timeout: float = 20.0) -> AdcStatus:
        """Whether ``gcluster job submit`` would find usable Application Default Credentials in
        the environment it runs with here (the minimal env, a fresh HOME): :func:`find_adc`."""
        prepared = prepare_process(
            ["gcluster"],
            command_env={},
            stdin_payload=None,
            secrets=(),
            job_home=None,
            cwd=None,
            inherit_env=self.config.inherit_env,
        )
        try:
            return find_adc(prepared.env, timeout=timeout)
        finally:
            prepared.cleanup()

    @contextlib.contextmanager
    def job_session(self) -> Iterator[Path]:
        """A HOME for one task's sequence of ``gcluster job`` commands, removed afterwards."""
        home = Path(tempfile.mkdtemp(prefix="tpu-rl-job-home-"))
        try:
            yield home
        finally:
            shutil.rmtree(home, ignore_errors=True)

    # ------------------------------------------------------------------ gcluster job queries
    @staticmethod
    def _scope(
        config: GclusterConfig, project: str | None, location: str | None
    ) -> tuple[str | None, str | None]:
        """Project and location default to the connection's."""
        return project or config.project, location or config.region

    @staticmethod
    def _parse_jobs(command: Command, result: CommandResult) -> list[GclusterJob]:
        try:
            return parse_job_list(result.output_lines)
        except ValueError as err:
            tail = "\n".join(result.output_lines[-ERROR_TAIL_LINES:])
            raise OutputParseError(f"{command.description}: {err}; output:\n{tail}") from err

    def list_jobs(
        self,
        project: str | None = None,
        cluster: str | None = None,
        location: str | None = None,
        *,
        name_contains: str | None = None,
        timeout: float | None = JOB_QUERY_TIMEOUT,
    ) -> list[GclusterJob]:
        """The cluster's jobs (``gcluster job list``); project/location default to the connection's."""
        project, location = self._scope(self.config, project, location)
        command = gke.job_list(project, cluster, location, name_contains=name_contains)
        result = self.run_checked(command, timeout=timeout, log_output=False)
        return self._parse_jobs(command, result)

    def get_job(
        self,
        name: str,
        project: str | None = None,
        cluster: str | None = None,
        location: str | None = None,
        *,
        timeout: float | None = JOB_QUERY_TIMEOUT,
    ) -> GclusterJob | None:
        """The job called ``name``, or ``None`` when the cluster has no such JobSet."""
        jobs = self.list_jobs(project, cluster, location, name_contains=name, timeout=timeout)
        return next((job for job in jobs if job.name == name), None)

    def cancel_job(
        self,
        name: str,
        project: str | None = None,
        cluster: str | None = None,
        location: str | None = None,
        *,
        timeout: float | None = JOB_QUERY_TIMEOUT,
    ) -> bool:
        """Delete the job's JobSet; ``False`` when there was none (already gone is fine)."""
        project, location = self._scope(self.config, project, location)
        command = gke.job_cancel(project, cluster, location, name)
        result = self.run_checked(command, timeout=timeout)
        return result.ok_marker is None
