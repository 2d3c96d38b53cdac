"""Fake ``gcluster`` (Cluster Toolkit v1.103.0 CLI surface), with cobra/pflag argument rules.

Run as ``python -m tpu_rl_sandbox.fake_gcluster ARGS`` (through the
``<root>/bin/gcluster`` shim). Every call is appended to ``<root>/calls.jsonl``.

Dependencies as the real binary resolves them (gcluster.go, cmd/dependencies.go,
pkg/dependencies/resolver.go): the user cache's ``cluster-toolkit/terraform-<v>`` and
``packer-<v>`` folders go first on PATH; ``deploy``/``destroy``/``export-outputs`` then need
``terraform`` (at least the pinned version, asked with ``terraform version --json``) and ``packer``
on PATH, else ask ``[y/N]`` on stdin (EOF is "no") unless ``--download-dependencies`` was given.
The sandbox's "download" writes its stub tool (:mod:`tool_stubs`) where gcluster would extract
the real one. ``job submit`` prerequisites are in :mod:`gcluster_jobs`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tpu_rl_sandbox import emulator
from tpu_rl_sandbox.flags import (
    CobraCommand,
    CobraError,
    CobraHelp,
    CobraParse,
    Flag,
    cobra_parse,
)
from tpu_rl_sandbox.gcluster_deploy import (
    Console,
    DeploymentRunner,
    Fatal,
    check_overwrite_allowed,
    expand_blueprint,
    load_blueprint,
    read_stdin_line,
    run_validators,
    write_deployment,
)
from tpu_rl_sandbox.gcluster_jobs import JobCommands, JobError, JobRegistry
from tpu_rl_sandbox.gotime import go_quote
from tpu_rl_sandbox.layout import SandboxLayout, layout_from_env
from tpu_rl_sandbox.state import (
    FAULT_ENV,
    FaultGate,
    StateError,
    StateStore,
    call_start,
    parse_faults,
    record_call,
)
from tpu_rl_sandbox.tool_stubs import write_tool_stubs

VERSION = "v1.103.0"
# cmd/dependencies.go initDependencies: the commands whose PersistentPreRun resolves dependencies
DEPENDENCY_COMMANDS = ("deploy", "destroy", "export-outputs")
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


# pkg/dependencies/checksums_generated.go
TERRAFORM_VERSION = "1.12.2"
PACKER_VERSION = "1.15.0"
_GO_VERSION_RE = re.compile(
    r"^v?([0-9]+(?:\.[0-9]+)*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


class DependencyError(Exception):
    """An error of pkg/dependencies; cmd/dependencies.go makes it ``Failed to setup dependencies: …``."""


def user_cache_dir(env: Mapping[str, str]) -> str:
    """Go's ``os.UserCacheDir`` on Linux."""
    cache = env.get("XDG_CACHE_HOME", "")
    if cache:
        if not os.path.isabs(cache):
            raise DependencyError("path in $XDG_CACHE_HOME is relative")
        return cache
    home = env.get("HOME", "")
    if not home:
        raise DependencyError("neither $XDG_CACHE_HOME nor $HOME are defined")
    return home + "/.cache"


def binary_cache_dir(env: Mapping[str, str], name: str, version: str) -> str:
    """pkg/dependencies/resolver.go ``getBinaryCacheDir``: ``<cache>/cluster-toolkit/<name>-<version>``."""
    try:
        cache = user_cache_dir(env)
    except DependencyError as error:
        raise DependencyError(f"failed to determine user cache dir: {error}") from None
    return os.path.join(cache, "cluster-toolkit", f"{name}-{version}")


def patched_path(env: Mapping[str, str]) -> str:
    """gcluster.go main -> ``dependencies.PatchPath``: the two cache folders first on PATH."""
    terraform = binary_cache_dir(env, "terraform", TERRAFORM_VERSION)
    packer = binary_cache_dir(env, "packer", PACKER_VERSION)
    return os.pathsep.join((terraform, packer, env.get("PATH", "")))


def go_version_compare(left: str, right: str) -> int:
    """hashicorp/go-version ``NewVersion(left).Compare(NewVersion(right))`` (-1, 0, 1)."""
    parsed = []
    for text in (left, right):
        match = _GO_VERSION_RE.match(text)
        if not match:
            raise DependencyError(f"invalid version format {go_quote(text)}: Malformed version: {text}")
        parsed.append(([int(p) for p in match.group(1).split(".")], match.group(2) or ""))
    (segs_l, pre_l), (segs_r, pre_r) = parsed
    width = max(len(segs_l), len(segs_r), 3)
    segs_l += [0] * (width - len(segs_l))
    segs_r += [0] * (width - len(segs_r))
    if segs_l != segs_r:
        return -1 if segs_l < segs_r else 1
    if pre_l == pre_r:
        return 0
    if not pre_l or not pre_r:
        return 1 if not pre_l else -1
    return -1 if pre_l < pre_r else 1


def _go_json_error(text: str) -> str:
    """encoding/json's message for output that is not JSON (approximately)."""
    stripped = text.lstrip()
    if not stripped:
        return "unexpected end of JSON input"
    return f"invalid character '{stripped[0]}' looking for beginning of value"


def read_stdin_answer() -> str:
    """``bufio.Reader.ReadString('\\n')`` with the error ignored: a partial last line counts."""
    if sys.stdin is None:
        return ""
    try:
        return sys.stdin.readline()
    except (OSError, ValueError):
        return ""


def _create_flags() -> list[Flag]:
    return [
        Flag(
            "out",
            "string",
            "o",
            usage="Sets the output directory where the HPC deployment directory will be created.",
        ),
        Flag(
            "overwrite-deployment",
            "bool",
            "w",
            usage="If specified, an existing deployment directory is overwritten by the new deployment.",
        ),
        Flag("force", "bool", usage="Forces overwrite of existing deployment directory."),
        Flag(
            "deployment-file",
            "string",
            "d",
            usage="Deployment file to override blueprint variables and backend configuration",
        ),
        Flag(
            "vars",
            "stringSlice",
            usage="Comma-separated list of name=value variables to override YAML configuration. Can be used multiple times.",
        ),
        Flag(
            "backend-config",
            "stringSlice",
            usage="Comma-separated list of name=value variables to set Terraform backend configuration. Can be used multiple times.",
        ),
        Flag(
            "validation-level",
            "string",
            "l",
            default="ERROR",
            usage='Set validation level to one of ("ERROR", "WARNING", "IGNORE")',
        ),
        Flag("skip-validators", "stringSlice", usage="Validators to skip"),
        Flag("add-creator-label", "bool", usage="Add label ghpc_creator to the expanded blueprint."),
    ]


CREATE_FLAG_NAMES = {f.name for f in _create_flags()}


def build_tree() -> CobraCommand:
    """The command tree of gcluster v1.103 that the fake implements."""
    root = CobraCommand(
        "gcluster",
        short="A blueprint and deployment engine for HPC clusters in GCP.",
        persistent_flags=[
            Flag("download-dependencies", "bool", usage="Automatically download missing dependencies."),
            Flag("no-color", "bool", usage="Disable colorized output."),
        ],
        flags=[Flag("version", "bool", "v", usage="version for gcluster")],
    )
    create = CobraCommand(
        "create",
        "Create a new deployment.",
        flags=_create_flags(),
        exact_args=1,
        usage_line="gcluster create <BLUEPRINT_FILE> [flags]",
    )
    deploy = CobraCommand(
        "deploy",
        "deploy all resources in a Toolkit deployment directory.",
        flags=[
            *_create_flags(),
            Flag("artifacts", "string", "a", usage="Artifacts directory (automatically configured if unset)"),
            Flag("auto-approve", "bool", usage="Automatically approve proposed changes"),
            Flag("skip", "stringSlice", usage="Skip groups with the given names"),
            Flag("only", "stringSlice", usage="Only apply to groups with the given names"),
            Flag("json-output", "bool", usage="Write Terraform output to JSON file"),
        ],
        exact_args=1,
        silence_usage=True,
        usage_line="gcluster deploy (<DEPLOYMENT_DIRECTORY> | <BLUEPRINT_FILE>) [flags]",
    )
    destroy = CobraCommand(
        "destroy",
        "destroy all resources in a Toolkit deployment directory.",
        flags=[
            Flag("artifacts", "string", "a", usage="Artifacts directory (automatically configured if unset)"),
            Flag("auto-approve", "bool", usage="Automatically approve proposed changes"),
            Flag("skip", "stringSlice", usage="Skip groups with the given names"),
            Flag("only", "stringSlice", usage="Only apply to groups with the given names"),
            Flag("robust", "bool", usage="Perform a robust destroy, including firewall rule cleanup."),
        ],
        exact_args=1,
        silence_usage=True,
        usage_line="gcluster destroy DEPLOYMENT_DIRECTORY [flags]",
    )
    job = CobraCommand(
        "job",
        "[EXPERIMENTAL/ALPHA] Manage jobs on the cluster.",
        runnable=False,
        persistent_flags=[
            Flag("cluster", "string", "c", usage="Name of the GKE cluster."),
            Flag("location", "string", "l", usage="Location (region or zone) of the GKE cluster."),
            Flag("project", "string", "p", usage="Google Cloud Project ID."),
        ],
    )
    submit = CobraCommand(
        "submit",
        "Submits a workload on a GKE cluster using JobSet.",
        silence_usage=True,
        flags=[
            Flag("image", "string", "i"),
            Flag("base-image", "string", "B"),
            Flag("build-context", "string", "b"),
            Flag("command", "string", "e"),
            Flag("compute-type", "string"),
            Flag("dry-run-out", "string", "o"),
            Flag("platform", "string", "f", default="linux/amd64"),
            Flag("mount", "stringSlice"),
            Flag("name", "string", "n"),
            Flag("queue", "string", "q"),
            Flag("num-nodes", "int", default=1),
            Flag("num-slices", "int", default=1),
            Flag("restarts", "int", default=1),
            Flag("gke-ttl-after-finished", "string", default="1h"),
            Flag("grace-period", "string", default="30s"),
            Flag("gke-disable-parallel-containers", "bool"),
            Flag("placement-policy", "string"),
            Flag("node-constraint", "stringToString"),
            Flag("cpu-affinity", "string"),
            Flag("restart-on-exit-codes", "intSlice"),
            Flag("image-pull-secret", "string"),
            Flag("service-account", "string"),
            Flag("topology", "string"),
            Flag("gke-scheduler", "string"),
            Flag("await-job-completion", "bool"),
            Flag("timeout", "string", default="-1s"),
            Flag("priority", "string"),
            Flag("verbose", "bool"),
            Flag("gke-nap-provisioning", "string"),
            Flag("gke-nap-reservation", "string"),
            Flag("env", "stringArray"),
            Flag("pathways", "bool"),
            Flag("pathways-proxy-server-image", "string"),
            Flag("pathways-server-image", "string"),
            Flag("pathways-worker-image", "string"),
            Flag("pathways-headless", "bool"),
            Flag("pathways-gcs-location", "string"),
            Flag("pathways-elastic-slices", "int"),
            Flag("pathways-max-slice-restarts", "int", default=1),
            Flag("pathways-proxy-args", "string"),
            Flag("pathways-server-args", "string"),
            Flag("pathways-worker-args", "string"),
            Flag("pathways-colocated-python-sidecar-image", "string"),
            Flag("pathways-head-np", "string"),
            Flag("pathways-proxy-env", "stringArray"),
            Flag("pathways-server-env", "stringArray"),
            Flag("pathways-worker-env", "stringArray"),
        ],
    )
    list_cmd = CobraCommand(
        "list",
        "List workloads (jobs) in the cluster.",
        silence_usage=True,
        flags=[Flag("status", "string"), Flag("name-contains", "string")],
    )
    logs = CobraCommand(
        "logs",
        "Fetch logs for a job in the cluster.",
        silence_usage=True,
        exact_args=1,
        flags=[Flag("follow", "bool", "f", usage="Stream logs continuously"), Flag("main-only", "bool")],
        usage_line="gcluster job logs [job-name] [flags]",
    )
    cancel = CobraCommand(
        "cancel",
        "Cancel a job in the cluster.",
        silence_usage=True,
        exact_args=1,
        usage_line="gcluster job cancel [job-name] [flags]",
    )
    config = CobraCommand("config", "Manage gcluster job configuration.", runnable=False)
    config.add(
        CobraCommand(
            "set",
            "Set a configuration property.",
            exact_args=2,
            usage_line="gcluster job config set [key] [value] [flags]",
        ),
        CobraCommand("list", "List all configuration properties.", exact_args=0),
    )
    job.add(submit, cancel, list_cmd, logs, config)
    root.add(create, deploy, destroy, job)
    return root


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

    def run(self, argv: list[str]) -> int:
        try:
            self.env["PATH"] = patched_path(self.env)
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
                self.console.out(f"gcluster version {VERSION}\nBuilt from 'main' branch.\n")
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
        """``initDependencies``: terraform (at least the pinned version) and packer on PATH."""
        decision = "ask"
        if "download-dependencies" in parsed.changed:
            decision = "yes" if parsed.get("download-dependencies") else "no"
        try:
            self._ensure_binary("terraform", TERRAFORM_VERSION, decision)
            self._ensure_binary("packer", PACKER_VERSION, decision)
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
            raise DependencyError(_go_json_error(done.stdout)) from None
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
        write_tool_stubs(target, tools=[name])

    # -- create / deploy / destroy ----------------------------------------------------------
    def _resolve(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() else Path(self.cwd) / candidate

    def _runner(self, parsed: CobraParse) -> DeploymentRunner:
        from tpu_rl_sandbox.maxtext_sim import context_from_env  # the simulated MaxText: not on every call

        step_seconds, _ = context_from_env(self.env)
        store = StateStore(self.layout)
        registry = JobRegistry(self.layout)
        return DeploymentRunner(
            self.layout,
            emulator.api_for(self.layout),
            self.console,
            FaultGate.from_env(store, self.env),
            bool(parsed.get("auto-approve")),
            self.read_line,
            min(step_seconds, 0.5) / 4,
            registry.delete_cluster_jobs,
            self.env["PATH"],
        )

    def do_create(self, parsed: CobraParse, blueprint_path: Path) -> tuple[Path, str]:
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
        write_deployment(depl, bp, blueprint_arg, Path(self.cwd), self.console)
        return depl, display

    def run_infra(self, command: str, parsed: CobraParse) -> int:
        target = parsed.args[0]
        resolved = self._resolve(target)
        if command in ("create", "deploy") and not (resolved.exists() or resolved.is_symlink()):
            raise CobraError(f"{go_quote(target)} does not exist")
        if command == "destroy" and not resolved.is_dir():
            raise CobraError(f"{go_quote(target)} must be a directory")
        if command in DEPENDENCY_COMMANDS:
            self.ensure_dependencies(parsed)
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


if __name__ == "__main__":
    sys.exit(main())
