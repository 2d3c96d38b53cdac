"""Fake ``gcluster`` (Cluster Toolkit v1.103.0 CLI surface), with cobra/pflag argument rules.

Run as ``python -m tpu_rl_sandbox.clis.gcluster ARGS`` (through the ``<root>/bin/gcluster`` shim).
Every call is appended to ``<root>/calls.jsonl``.

Dependencies as the real binary resolves them (gcluster.go, cmd/dependencies.go,
pkg/dependencies/resolver.go): the user cache's ``cluster-toolkit/terraform-<v>`` and
``packer-<v>`` folders go first on PATH; ``deploy``/``destroy``/``export-outputs`` then need
``terraform`` (at least the pinned version, asked with ``terraform version --json``) and ``packer``
on PATH, else ask ``[y/N]`` on stdin (EOF is "no") unless ``--download-dependencies`` was given.
The sandbox's "download" writes its stub tool (:mod:`~tpu_rl_sandbox.clis.tool_stubs`) where
gcluster would extract the real one. The versions it requires belong to its release
(:mod:`~tpu_rl_sandbox.clis.gcluster.dependencies`): the pinned one by default, or a newer one the
sandbox settings name (``gcluster_release``), whose ``checksums_generated.go`` would pin newer
tools. The commands are :mod:`~tpu_rl_sandbox.clis.gcluster.deploy` and
:mod:`~tpu_rl_sandbox.clis.gcluster.jobs` (``job submit`` prerequisites among them).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tpu_rl_sandbox.clis.gcluster.cobra import (
    CobraError,
    CobraHelp,
    CobraParse,
    cobra_parse,
)
from tpu_rl_sandbox.clis.gcluster.commands import CREATE_FLAG_NAMES, build_tree
from tpu_rl_sandbox.clis.gcluster.console import Console, Fatal, JobError, read_stdin_line
from tpu_rl_sandbox.clis.gcluster.dependencies import (
    DEPENDENCY_COMMANDS,
    PINNED_RELEASE,
    DependencyError,
    binary_cache_dir,
    go_json_error,
    go_version_compare,
    patched_path,
    release_from_settings,
)
from tpu_rl_sandbox.clis.gcluster.gotime import go_quote
from tpu_rl_sandbox.world.calls import call_start, record_call
from tpu_rl_sandbox.world.faults import FAULT_ENV, FaultGate, parse_faults
from tpu_rl_sandbox.world.layout import SandboxLayout, layout_from_env
from tpu_rl_sandbox.world.store import StateError, StateStore

if TYPE_CHECKING:  # a call imports deploy.py or jobs.py when its command is theirs
    from tpu_rl_sandbox.clis.gcluster.deploy import DeploymentRunner

# Sandbox-only control: ``TPU_RL_SANDBOX_HANG=deploy`` (or ``destroy``) makes that command hang in
# its "terraform apply" after the infrastructure exists, as a stuck Terraform does. Each hung
# process leaves ``<root>/hung/<pid>.json`` (its pid, role and how it ended) for the tests.
HANG_ENV = "TPU_RL_SANDBOX_HANG"
HANG_COMMANDS = ("deploy", "destroy")
HUNG_DIR = "hung"
# The fake "terraform" child: terraform-exec v0.24.0 starts Terraform in a process group of its
# own with Pdeathsig SIGKILL (tfexec/cmd_linux.go); Terraform stops on SIGINT/SIGTERM, releasing
# its state lock ("Interrupt received. ... Stopping operation..."), and dies on SIGKILL.
_HUNG_TERRAFORM = """
import json, os, signal, sys, time
from pathlib import Path
record = Path(sys.argv[1]) / f"{os.getpid()}.json"
def write(ended):
    record.write_text(json.dumps({"pid": os.getpid(), "role": "terraform", "ended": ended}))
def interrupted(signum, frame):
    print("Interrupt received. Stopping operation...", flush=True)
    write("interrupted")
    sys.exit(1)
signal.signal(signal.SIGTERM, interrupted)
signal.signal(signal.SIGINT, interrupted)
write(None)
print("terraform_data.hang: Still creating... [10s elapsed]", flush=True)
while True:
    time.sleep(0.2)
"""


def hung_processes(layout: SandboxLayout) -> list[dict[str, object]]:
    """The processes ``TPU_RL_SANDBOX_HANG`` left hanging: ``{"pid", "role", "ended"}`` each."""
    folder = layout.root / HUNG_DIR
    if not folder.is_dir():
        return []
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def _set_pdeathsig() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child, as Go's SysProcAttr.Pdeathsig (Linux)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1


def read_stdin_answer() -> str:
    """``bufio.Reader.ReadString('\\n')`` with the error ignored: a partial last line counts."""
    if sys.stdin is None:
        return ""
    try:
        return sys.stdin.readline()
    except (OSError, ValueError):
        return ""


class Gcluster:
    """One ``gcluster`` invocation."""

    def __init__(
        self,
        layout: SandboxLayout,
        env: dict[str, str],
        cwd: str,
        out: Callable[[str], None],
        err: Callable[[str], None],
        read_line: Callable[[], str | None] = read_stdin_line,
        read_answer: Callable[[], str] = read_stdin_answer,
    ) -> None:
        self.layout = layout
        self.env = dict(env)
        self.cwd = cwd
        self.console = Console(out, err)
        self.read_line = read_line
        self.read_answer = read_answer
        self.release = PINNED_RELEASE

    def run(self, argv: list[str]) -> int:
        try:
            self.release = release_from_settings(self.layout)
        except StateError as error:
            self.console.err(f"Error: sandbox: {error}\n")
            return 1
        try:
            self.env["PATH"] = patched_path(self.env, self.release)
        except DependencyError as error:
            self.console.error(f"Failed to patch PATH with custom binaries directories: {error}")
            return 1
        root = build_tree()
        try:
            parsed = cobra_parse(root, argv)
        except CobraHelp as shown:
            self.console.out(shown.text)
            return 0
        except CobraError as error:
            self.console.err(f"Error: {error.message}\n")
            return 1
        path = parsed.command.command_path().split()[1:]
        try:
            parse_faults(self.env.get(FAULT_ENV))
            if path == [] and parsed.get("version"):
                self.console.out(f"gcluster version {self.release.version}\nBuilt from 'main' branch.\n")
                return 0
            if path == []:
                self.console.out(root.usage())
                return 0
            if path[0] == "job":
                return self.run_job(path[1:], parsed)
            return self.run_infra(path[0], parsed)
        except Fatal as fatal:
            if fatal.code == 0:
                self.console.info(fatal.message)
            else:
                self.console.error(fatal.message)
            return fatal.code
        except (JobError, CobraError) as error:
            message = error.message if isinstance(error, CobraError) else str(error)
            self.console.err(f"Error: {message}\n")
            return 1
        except StateError as error:
            self.console.err(f"Error: sandbox: {error}\n")
            return 1

    # -- dependencies (cmd/dependencies.go, pkg/dependencies/resolver.go) --------------------
    def ensure_dependencies(self, parsed: CobraParse) -> None:
        """``initDependencies``: terraform (at least the release's version) and packer on PATH."""
        decision = "ask"
        if "download-dependencies" in parsed.changed:
            decision = "yes" if parsed.get("download-dependencies") else "no"
        try:
            self._ensure_binary("terraform", self.release.terraform, decision)
            self._ensure_binary("packer", self.release.packer, decision)
        except DependencyError as error:
            raise Fatal(f"Failed to setup dependencies: {error}") from None

    def _ensure_binary(self, name: str, version: str, decision: str) -> None:
        path = shutil.which(name, path=self.env["PATH"])
        if path is None:
            self._download_flow(name, version, decision)
            return
        if name != "terraform":
            return  # "for packer, just check existence for now"
        try:
            installed = self._installed_terraform_version(path)
        except DependencyError as error:
            self.console.out(
                f"Warning: Could not determine installed terraform version: {error}. Proceeding to download "
                f"recommended version {version}.\n"
            )
            self._download_flow(name, version, decision)
            return
        try:
            order = go_version_compare(installed, version)
        except DependencyError as error:
            self.console.out(
                f"Warning: Could not parse installed terraform version {go_quote(installed)}: {error}. Proceeding "
                f"to download recommended version {version}.\n"
            )
            self._download_flow(name, version, decision)
            return
        if order > 0:
            self.console.out(
                f"WARNING: Terraform version {installed} is currently installed. We recommend using version "
                f"{version} for compatibility with all features.\n"
            )
        elif order < 0:
            self.console.out(
                f"Installed terraform version {installed} is older than required version {version}.\n"
            )
            self._download_flow(name, version, decision)

    def _installed_terraform_version(self, path: str) -> str:
        """``getInstalledTfVersion``: ``terraform version --json`` -> ``terraform_version``."""
        try:
            done = subprocess.run(
                [path, "version", "--json"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=self.env,
                cwd=self.cwd,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DependencyError("signal: killed") from None
        except OSError as error:
            raise DependencyError(f"fork/exec {path}: {error.strerror}") from None
        if done.returncode != 0:
            raise DependencyError(f"exit status {done.returncode}")
        try:
            data = json.loads(done.stdout)
        except ValueError:
            raise DependencyError(go_json_error(done.stdout)) from None
        value = data.get("terraform_version", "") if isinstance(data, dict) else ""
        return value if isinstance(value, str) else ""

    def _download_flow(self, name: str, version: str, decision: str) -> None:
        """``downloadFlow``: confirm (flag or ``[y/N]`` on stdin), then download into the cache."""
        if decision == "no":
            raise DependencyError(
                f"{name} is missing. Download is explicitly disabled. Enable download by specifying "
                "--download-dependencies flag."
            )
        if decision == "ask":
            self.console.out(f"{name} v{version} is missing. Do you want to download it? [y/N]: ")
            answer = self.read_answer().strip().lower()
            if answer not in ("y", "yes"):
                raise DependencyError(f"user declined to download {name}")
        target = Path(binary_cache_dir(self.env, name, version))
        self.console.out(f"Downloading {name} v{version}...\n")
        # The sandbox has no releases.hashicorp.com: the "download" is the sandbox's stub, written
        # where gcluster would extract the real binary (and never into this user's real cache).
        real_cache = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"
        resolved = target.resolve()
        if resolved.is_relative_to(real_cache.resolve()) and not resolved.is_relative_to(self.layout.root):
            raise StateError(
                f"refusing to write a stub {name} into {target}: that is this user's real cache, which a real "
                "gcluster puts first on PATH; run with HOME (or XDG_CACHE_HOME) inside the sandbox"
            )
        from tpu_rl_sandbox.clis.tool_stubs import write_tool_stubs

        write_tool_stubs(target, tools=[name])

    # -- create / deploy / destroy ----------------------------------------------------------
    def _resolve(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() else Path(self.cwd) / candidate

    def _runner(self, parsed: CobraParse) -> DeploymentRunner:
        from tpu_rl_sandbox.apis import gcs_emulator
        from tpu_rl_sandbox.clis.gcluster.deploy import DeploymentRunner
        from tpu_rl_sandbox.clis.gcluster.jobs import JobRegistry
        from tpu_rl_sandbox.machines.maxtext_sim import (
            context_from_env,
        )  # the simulated MaxText: not on every call

        step_seconds, _ = context_from_env(self.env)
        store = StateStore(self.layout)
        registry = JobRegistry(self.layout)
        return DeploymentRunner(
            self.layout,
            gcs_emulator.api_for(self.layout),
            self.console,
            FaultGate.from_env(store, self.env),
            bool(parsed.get("auto-approve")),
            self.read_line,
            min(step_seconds, 0.5) / 4,
            registry.delete_cluster_jobs,
            self.env["PATH"],
        )

    def do_create(self, parsed: CobraParse, blueprint_path: Path) -> tuple[Path, str]:
        from tpu_rl_sandbox.clis.gcluster.deploy import (
            check_overwrite_allowed,
            expand_blueprint,
            load_blueprint,
            run_validators,
            write_deployment,
        )

        blueprint_arg = str(parsed.args[0])
        blueprint = load_blueprint(blueprint_path)
        bp = expand_blueprint(
            blueprint,
            list(parsed.get("vars")),
            list(parsed.get("backend-config")),
            parsed.get("deployment-file") or None,
            str(parsed.get("validation-level")),
        )
        run_validators(bp, self.console)
        out_dir = self._resolve(str(parsed.get("out") or "."))
        deployment = str(bp["vars"]["deployment_name"])
        display = os.path.join(str(parsed.get("out") or ""), deployment) if parsed.get("out") else deployment
        depl = out_dir / deployment
        self.console.info(f"Creating deployment folder {go_quote(display)} ...")
        check_overwrite_allowed(
            depl, bp, bool(parsed.get("overwrite-deployment")), bool(parsed.get("force")), display
        )
        write_deployment(depl, bp, blueprint_arg, Path(self.cwd), self.console, self.release.version)
        return depl, display

    def run_infra(self, command: str, parsed: CobraParse) -> int:
        target = parsed.args[0]
        resolved = self._resolve(target)
        if command in ("create", "deploy") and not (resolved.exists() or resolved.is_symlink()):
            raise CobraError(f"{go_quote(target)} does not exist")
        if command in ("destroy", "export-outputs") and not resolved.is_dir():
            raise CobraError(f"{go_quote(target)} must be a directory")  # cmd/utils.go checkDir
        if command in DEPENDENCY_COMMANDS:
            self.ensure_dependencies(parsed)
        if command == "export-outputs":
            self.export_outputs(resolved, parsed)
            return 0
        for name in ("skip", "only"):
            if name in parsed.changed and not parsed.get(name):
                parsed.values[name] = []
        if command == "create":
            depl, display = self.do_create(parsed, resolved)
            self.console.info("To deploy your infrastructure please run:")
            self.console.info("")
            self.console.info(f"gcluster deploy {display}")
            self.console.info("")
            self.console.info("Find instructions for cleanly destroying infrastructure and advanced manual")
            self.console.info("deployment instructions at:")
            self.console.info("")
            self.console.info(os.path.join(display, "instructions.txt"))
            return 0
        only = list(parsed.get("only")) if "only" in parsed.changed else None
        skip = list(parsed.get("skip")) if "skip" in parsed.changed else None
        runner = self._runner(parsed)
        if command == "deploy":
            if resolved.is_dir():
                for flag in sorted(parsed.changed):
                    if flag in CREATE_FLAG_NAMES:
                        raise Fatal(
                            f"Error: cannot specify flag {go_quote(flag)} with DEPLOYMENT_DIRECTORY provided"
                        )
                depl, display = resolved, target
            else:
                depl, display = self.do_create(parsed, resolved)
            runner.deploy(depl, display, only, skip)
            self.hang_if_asked("deploy")
            return 0
        runner.destroy(resolved, target, only, skip, bool(parsed.get("robust")))
        self.hang_if_asked("destroy")
        return 0

    def export_outputs(self, group_dir: Path, parsed: CobraParse) -> None:
        """cmd/export.go ``runExportCmd`` as far as the deployment's artifacts folder.

        ``getArtifactsDir``: ``--artifacts`` or ``<group>/../.ghpc/artifacts`` (modulewriter
        ``ArtifactsDir``); ``shell.CheckWritableDir`` then fails a folder that is missing or not
        writable ("%s must be a writable directory", through checkErr's ``Error: %s``). Then the
        deployment folder is checked (``shell.ValidateDeploymentDirectory``), the group looked up
        (``Blueprint.Group``: "could not find group %s in blueprint"), Terraform initialised in the
        group folder and its state's outputs written to ``<artifacts>/<group>_outputs.tfvars``
        (``shell.ExportOutputs``; no outputs: "contains no artifacts to export", no file).
        """
        from tpu_rl_sandbox.apis import gcs_emulator
        from tpu_rl_sandbox.clis.gcluster.deploy import TerraformState, group_names, load_blueprint

        group = Path(os.path.abspath(group_dir))
        artifacts = str(parsed.get("artifacts") or "") or str(group.parent / ".ghpc" / "artifacts")
        try:  # shell.DirInfo: os.Lstat (a symlink is not a directory), then access(W_OK|R_OK|X_OK)
            is_dir = stat.S_ISDIR(os.lstat(artifacts).st_mode)
        except OSError:
            is_dir = False
        if not (is_dir and os.access(artifacts, os.R_OK | os.W_OK | os.X_OK)):
            raise Fatal(f"Error: {artifacts} must be a writable directory")
        bp = load_blueprint(Path(artifacts) / "expanded_blueprint.yaml")
        root = group.parent
        for name in group_names(bp):
            if not (root / name).is_dir():
                raise Fatal(f"Error: improper deployment: {root / name} is not a directory for group {name}")
        found = next((g for g in bp["deployment_groups"] if str(g["group"]) == group.name), None)
        if found is None:
            raise Fatal(f"Error: could not find group {group.name} in blueprint")
        api = gcs_emulator.api_for(self.layout)
        tf = TerraformState(group, found.get("terraform_backend"), api, str(group), self.env["PATH"])
        tf.init()
        outputs = tf.load().get("outputs") or {}
        if not outputs:
            self.console.info(f"Deployment group {group.name} contains no artifacts to export")
            return
        target = Path(artifacts) / f"{group.name}_outputs.tfvars"
        self.console.info(f"Writing outputs artifact from deployment group {group.name} to file {target}")
        target.write_text(
            "".join(
                f"{key} = {json.dumps((value or {}).get('value'))}\n"
                for key, value in sorted(outputs.items())
            )
        )

    def hang_if_asked(self, command: str) -> None:
        """Hang like a stuck ``terraform apply`` when ``TPU_RL_SANDBOX_HANG`` names ``command``."""
        wanted = {c.strip() for c in self.env.get(HANG_ENV, "").split(",") if c.strip()}
        unknown = wanted - set(HANG_COMMANDS)
        if unknown:
            raise StateError(f"bad {HANG_ENV} entry {sorted(unknown)[0]!r}: expected one of {HANG_COMMANDS}")
        if command not in wanted:
            return
        folder = self.layout.root / HUNG_DIR
        folder.mkdir(exist_ok=True)
        (folder / f"{os.getpid()}.json").write_text(
            json.dumps({"pid": os.getpid(), "role": "gcluster", "ended": None})
        )
        child = subprocess.Popen(
            [sys.executable, "-c", _HUNG_TERRAFORM, str(folder)],
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=_set_pdeathsig,
        )
        child.wait()

    # -- job ------------------------------------------------------------------------------
    def run_job(self, path: list[str], parsed: CobraParse) -> int:
        from tpu_rl_sandbox.clis.gcluster.jobs import JobCommands

        jobs = JobCommands(self.layout, self.env, self.console, self.cwd)
        if path[:1] == ["config"]:
            if path[1:] == ["set"]:
                jobs.config_set(parsed)
            else:
                jobs.config_list(parsed)
            return 0
        if path == ["submit"]:
            return jobs.submit(parsed)
        if path == ["list"]:
            jobs.list(parsed)
        elif path == ["logs"]:
            jobs.logs(parsed)
        elif path == ["cancel"]:
            jobs.cancel(parsed)
        return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the fake ``gcluster``; records the call in ``<root>/calls.jsonl``."""
    args = list(sys.argv[1:] if argv is None else argv)
    start = call_start(os.environ, time.time())
    env = dict(os.environ)
    try:
        layout = layout_from_env(env)
    except Exception as error:
        sys.stderr.write(f"Error: {error}\n")
        return 1
    code = 1

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def err(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    try:
        code = Gcluster(layout, env, os.getcwd(), out, err).run(args)
    except StateError as error:
        err(f"Error: sandbox: {error}\n")
        code = 1
    finally:
        record_call(layout, "gcluster", args, env, os.getcwd(), code, start, time.time())
    return code
