"""The machines the sandbox shell runs on: a GKE pod (workload image) and a TPU VM.

Both keep their files in a host folder (:class:`~fsview.LocalStore`). The pod's image already
has MaxText installed; the VM starts as a bare Ubuntu image and only gets ``uv``, a venv,
MaxText and its extra dependencies when the script installs them (and ``~/.local/bin`` /
the venv are only on ``$PATH`` after ``source``-ing their activation scripts, as in a real
non-login SSH session).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpu_rl_sandbox import maxtext_sim
from tpu_rl_sandbox.bashsim import (
    CallbackSink,
    CommandFn,
    Shell,
    Sink,
    absolute,
)
from tpu_rl_sandbox.flags import GcloudUsageError
from tpu_rl_sandbox.fsview import GcsStore, LocalStore, Router
from tpu_rl_sandbox.state import FaultSpec

SECRET_REF_RE = re.compile(r"projects/([A-Za-z0-9_.:-]+)/secrets/([A-Za-z0-9_-]+)/versions/([A-Za-z0-9_-]+)")
SYSTEM_BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DEFAULT_PATH = ":".join(SYSTEM_BIN_DIRS)
UV_INSTALLER_URL_RE = re.compile(r"^https://astral\.sh/uv/(?:[0-9.]+/)?install\.sh$")
INSTALL_UV_COMMAND = "__tpu_rl_sandbox_install_uv"

SecretAccess = Callable[[str, str, str], tuple[str | None, str]]


@dataclass
class MachineServices:
    """What a machine can reach outside itself."""

    gcs: GcsStore
    secret_access: SecretAccess
    fault: Callable[[str], FaultSpec | None]
    seed: str
    step_seconds: float
    hold_file: str | None
    cancelled: Callable[[], bool]
    default_project: str = ""


class MachineHost:
    """Commands and files shared by the pod and the VM."""

    platform = "gke"
    hostname = "sandbox-host"
    internal_ip = "10.128.0.2"

    def __init__(self, fs_root: Path, services: MachineServices) -> None:
        self.fs = LocalStore(fs_root)
        self.services = services
        self.router = Router(services.gcs, self.fs)
        for directory in ("/tmp", "/root", "/etc"):  # noqa: S108 (inside the simulated machine)
            self.fs.host_path(directory).mkdir(parents=True, exist_ok=True)

    # -- ShellHost ------------------------------------------------------------------------
    def read_file(self, shell: Shell, path: str) -> str | None:
        data = self.fs.read(absolute(shell, path))
        return None if data is None else data.decode("utf-8", "replace")

    def open_sink(self, shell: Shell, path: str, append: bool) -> Sink | None:
        target = self.fs.host_path(absolute(shell, path))
        if not target.parent.is_dir():
            return None
        handle = target.open("a" if append else "w")

        def write(text: str) -> None:
            handle.write(text)
            handle.flush()

        class _FileSink(CallbackSink):
            def close(self) -> None:
                handle.close()

        return _FileSink(write)

    def file_test(self, shell: Shell, op: str, path: str) -> bool:
        target = self.fs.host_path(path)
        if op == "-f":
            return target.is_file()
        if op == "-d":
            return target.is_dir()
        if op == "-s":
            return target.is_file() and target.stat().st_size > 0
        return target.exists()

    def is_dir(self, shell: Shell, path: str) -> bool:
        return self.fs.host_path(path).is_dir()

    def resolve_command(self, shell: Shell, name: str) -> CommandFn | None:
        if "/" in name:
            path = absolute(shell, name)
            return self.executable_at(shell, path)
        for directory in shell.vars.get("PATH", DEFAULT_PATH).split(":"):
            if not directory:
                continue
            if directory in SYSTEM_BIN_DIRS:
                found = self.system_command(name)
                if found is not None:
                    return found
                continue
            found = self.executable_at(shell, f"{directory.rstrip('/')}/{name}")
            if found is not None:
                return found
        if name == INSTALL_UV_COMMAND:
            return self.cmd_install_uv
        return None

    # -- resolution -----------------------------------------------------------------------
    def system_command(self, name: str) -> CommandFn | None:
        table: dict[str, CommandFn] = {
            "python3": self.cmd_python,
            "python": self.cmd_python,
            "hostname": self.cmd_hostname,
            "awk": self.cmd_awk,
            "sleep": self.cmd_noop,
            "date": self.cmd_date,
            "env": self.cmd_env,
            "printenv": self.cmd_env,
            "nproc": lambda s, a, i, o, e, env: self._print(o, "180"),
            "cat": self.cmd_cat,
            "mkdir": self.cmd_mkdir,
            "ls": self.cmd_ls,
            "rm": self.cmd_rm,
            "cp": self.cmd_cp,
            "mv": self.cmd_mv,
            "touch": self.cmd_touch,
            "tee": self.cmd_tee,
            "grep": self.cmd_grep,
            "head": self.cmd_head,
            "tail": self.cmd_tail,
            "wc": self.cmd_wc,
            "df": lambda s, a, i, o, e, env: self._print(
                o, "Filesystem Size Used Avail Use% Mounted on\ntmpfs 720G 0 720G 0% /dev/shm"
            ),
            "free": lambda s, a, i, o, e, env: self._print(
                o, "              total        used        free\nMem:          1440G         12G       1428G"
            ),
            "which": self.cmd_which,
            "bash": self.cmd_bash,
            "sh": self.cmd_bash,
            "pip": self.cmd_pip,
            "pip3": self.cmd_pip,
            "uname": lambda s, a, i, o, e, env: self._print(o, "Linux" if "-m" not in a else "x86_64"),
            "id": lambda s, a, i, o, e, env: self._print(o, "uid=0(root) gid=0(root) groups=0(root)"),
            "whoami": lambda s, a, i, o, e, env: self._print(o, env.get("USER", "root")),
            "sync": self.cmd_noop,
        }
        return table.get(name)

    def executable_at(self, shell: Shell, path: str) -> CommandFn | None:
        data = self.fs.read(path)
        if data is None:
            system = path.rsplit("/", 1)
            if len(system) == 2 and system[0] in SYSTEM_BIN_DIRS:
                return self.system_command(system[1])
            return None
        text = data.decode("utf-8", "replace")
        match = re.match(r"#!sandbox (\S+)", text)
        if match:
            return self.marker_command(match.group(1), path)
        if text.startswith("#!"):
            return lambda s, argv, stdin, out, err, env: self.run_script(s, text, argv, stdin, out, err, env)
        return None

    def marker_command(self, kind: str, path: str) -> CommandFn | None:
        del kind, path
        return None

    # -- helpers --------------------------------------------------------------------------
    @staticmethod
    def _print(out: Sink, text: str) -> int:
        out.write(text + "\n")
        return 0

    def cmd_noop(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        return 0

    def run_script(
        self, shell: Shell, text: str, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        child = Shell(self, env, shell.cwd, out, err, name=argv[0])
        return child.run(text, stdin)

    def cmd_bash(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = argv[1:]
        child = Shell(self, env, shell.cwd, out, err, name=argv[0].rsplit("/", 1)[-1])
        options: list[str] = []
        while args and args[0].startswith("-") and args[0] not in ("-c", "-s", "--"):
            options.append(args.pop(0))
        if args and args[0] == "-c":
            if len(args) < 2:
                err.write(f"{argv[0]}: -c: option requires an argument\n")
                return 2
            self._apply_options(child, options)
            return child.run(args[1], stdin)
        if args and args[0] == "--":
            args = args[1:]
        if not args or args[0] == "-s":
            self._apply_options(child, options)
            return child.run(stdin)
        text = self.read_file(shell, args[0])
        if text is None:
            err.write(f"{argv[0]}: {args[0]}: No such file or directory\n")
            return 127
        self._apply_options(child, options)
        return child.run(text)

    @staticmethod
    def _apply_options(shell: Shell, options: list[str]) -> None:
        for option in options:
            if option.startswith("-") and not option.startswith("--"):
                shell.opts.errexit |= "e" in option
                shell.opts.nounset |= "u" in option
                shell.opts.xtrace |= "x" in option

    def cmd_hostname(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        return self._print(out, f"{self.internal_ip} " if "-I" in argv else self.hostname)

    def cmd_awk(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = argv[1:]
        separator: str | None = None
        if args and args[0].startswith("-F"):
            separator = args[0][2:] or (args[1] if len(args) > 1 else None)
            args = args[1:] if args[0] != "-F" else args[2:]
        if not args:
            err.write("usage: awk [-F fs] 'program' [file ...]\n")
            return 2
        match = re.fullmatch(r"\s*\{\s*print\s+\$(\d+)\s*\}\s*", args[0])
        if not match:
            err.write(f"awk: sandbox supports only '{{print $N}}' programs, got {args[0]!r}\n")
            return 2
        column = int(match.group(1))
        text = stdin
        if len(args) > 1:
            text = "".join(self.read_file(shell, f) or "" for f in args[1:])
        for line in text.splitlines():
            fields = line.split(separator) if separator else line.split()
            out.write((line if column == 0 else (fields[column - 1] if column <= len(fields) else "")) + "\n")
        return 0

    def cmd_date(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        now = dt.datetime.now(dt.UTC)
        fmt = next((a[1:] for a in argv[1:] if a.startswith("+")), "%a %b %d %H:%M:%S UTC %Y")
        return self._print(out, now.strftime(fmt))

    def cmd_env(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        for key in sorted(env):
            out.write(f"{key}={env[key]}\n")
        return 0

    def cmd_cat(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        if len(argv) == 1:
            out.write(stdin)
            return 0
        status = 0
        for name in argv[1:]:
            text = self.read_file(shell, name)
            if text is None:
                err.write(f"cat: {name}: No such file or directory\n")
                status = 1
            else:
                out.write(text)
        return status

    def cmd_mkdir(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        parents = any(a.startswith("-") and "p" in a for a in argv[1:])
        status = 0
        for name in (a for a in argv[1:] if not a.startswith("-")):
            target = self.fs.host_path(absolute(shell, name))
            if target.exists() and not parents:
                err.write(f"mkdir: cannot create directory '{name}': File exists\n")
                status = 1
                continue
            if not parents and not target.parent.is_dir():
                err.write(f"mkdir: cannot create directory '{name}': No such file or directory\n")
                status = 1
                continue
            target.mkdir(parents=True, exist_ok=True)
        return status

    def cmd_ls(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        names = [a for a in argv[1:] if not a.startswith("-")] or ["."]
        status = 0
        for name in names:
            target = self.fs.host_path(absolute(shell, name))
            if target.is_dir():
                for child in sorted(target.iterdir()):
                    out.write(child.name + "\n")
            elif target.exists():
                out.write(name + "\n")
            else:
                err.write(f"ls: cannot access '{name}': No such file or directory\n")
                status = 2
        return status

    def cmd_rm(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        flags = "".join(a[1:] for a in argv[1:] if a.startswith("-"))
        status = 0
        for name in (a for a in argv[1:] if not a.startswith("-")):
            target = self.fs.host_path(absolute(shell, name))
            if target.is_dir():
                if "r" not in flags and "R" not in flags:
                    err.write(f"rm: cannot remove '{name}': Is a directory\n")
                    status = 1
                    continue
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            elif "f" not in flags:
                err.write(f"rm: cannot remove '{name}': No such file or directory\n")
                status = 1
        return status

    def cmd_cp(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        names = [a for a in argv[1:] if not a.startswith("-")]
        recursive = any(a.startswith("-") and ("r" in a or "R" in a or "a" in a) for a in argv[1:])
        if len(names) < 2:
            err.write("cp: missing destination file operand\n")
            return 1
        *sources, destination = names
        dst = self.fs.host_path(absolute(shell, destination))
        for source in sources:
            src = self.fs.host_path(absolute(shell, source))
            if not src.exists():
                err.write(f"cp: cannot stat '{source}': No such file or directory\n")
                return 1
            target = dst / src.name if dst.is_dir() else dst
            if src.is_dir():
                if not recursive:
                    err.write(f"cp: -r not specified; omitting directory '{source}'\n")
                    return 1
                shutil.copytree(src, target, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, target)
        return 0

    def cmd_mv(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        names = [a for a in argv[1:] if not a.startswith("-")]
        if len(names) != 2:
            err.write("mv: missing destination file operand\n")
            return 1
        src = self.fs.host_path(absolute(shell, names[0]))
        dst = self.fs.host_path(absolute(shell, names[1]))
        if not src.exists():
            err.write(f"mv: cannot stat '{names[0]}': No such file or directory\n")
            return 1
        shutil.move(src, dst / src.name if dst.is_dir() else dst)
        return 0

    def cmd_touch(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        for name in (a for a in argv[1:] if not a.startswith("-")):
            target = self.fs.host_path(absolute(shell, name))
            if not target.parent.is_dir():
                err.write(f"touch: cannot touch '{name}': No such file or directory\n")
                return 1
            target.touch()
        return 0

    def cmd_tee(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        append = "-a" in argv[1:]
        for name in (a for a in argv[1:] if not a.startswith("-")):
            sink = self.open_sink(shell, name, append)
            if sink is None:
                err.write(f"tee: {name}: No such file or directory\n")
                return 1
            sink.write(stdin)
            getattr(sink, "close", lambda: None)()
        out.write(stdin)
        return 0

    def cmd_grep(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = [a for a in argv[1:] if not a.startswith("-")]
        quiet = any(a.startswith("-") and "q" in a for a in argv[1:])
        if not args:
            err.write("Usage: grep [OPTION]... PATTERNS [FILE]...\n")
            return 2
        pattern = re.compile(args[0])
        text = stdin if len(args) == 1 else "".join(self.read_file(shell, f) or "" for f in args[1:])
        found = [line for line in text.splitlines() if pattern.search(line)]
        if not quiet:
            for line in found:
                out.write(line + "\n")
        return 0 if found else 1

    def cmd_head(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        count = self._count_arg(argv)
        for line in stdin.splitlines()[:count]:
            out.write(line + "\n")
        return 0

    def cmd_tail(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        count = self._count_arg(argv)
        for line in stdin.splitlines()[-count:] if count else []:
            out.write(line + "\n")
        return 0

    @staticmethod
    def _count_arg(argv: list[str]) -> int:
        for index, arg in enumerate(argv):
            if arg == "-n" and index + 1 < len(argv):
                return int(argv[index + 1])
            if re.fullmatch(r"-n?\d+", arg):
                return int(arg.lstrip("-n"))
        return 10

    def cmd_wc(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        return self._print(out, str(len(stdin.splitlines())))

    def cmd_which(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        status = 0
        for name in argv[1:]:
            if self.resolve_command(shell, name) is None:
                status = 1
            else:
                out.write(f"/usr/bin/{name}\n")
        return status

    def cmd_pip(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        out.write("Requirement already satisfied\n")
        return 0

    # -- python ---------------------------------------------------------------------------
    def python_packages(self, shell: Shell, interpreter: str) -> set[str] | None:
        """Packages importable by ``interpreter`` (``None`` = MaxText image: everything)."""
        del shell, interpreter
        return None

    def cmd_python(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        interpreter = argv[0]
        args = argv[1:]
        while args and args[0] in ("-u", "-B", "-E", "-s", "-I", "-O"):
            args = args[1:]
        if not args:
            return 0
        if args[0] == "-c":
            return self.python_inline(shell, args[1:], out, err, env)
        if args[0] == "-m" and len(args) > 1:
            module = args[1]
            if module in ("pip",):
                return self.cmd_pip(shell, ["pip", *args[2:]], stdin, out, err, env)
            packages = self.python_packages(shell, interpreter)
            top = module.split(".", 1)[0]
            if packages is not None and top not in packages:
                err.write(
                    f"{interpreter}: Error while finding module specification for '{module}' "
                    f"(ModuleNotFoundError: No module named '{top}')\n"
                )
                return 1
            if module == maxtext_sim.TRAIN_RL and packages is not None and "tunix" not in packages:
                err.write(
                    "Traceback (most recent call last):\nModuleNotFoundError: No module named 'tunix'\n"
                )
                return 1
            if module not in maxtext_sim.MODULES:
                err.write(f"sandbox: python3 -m {module} is not simulated\n")
                return 1
            return self.run_maxtext(shell, module, args[2:], out, err, env)
        err.write(f"sandbox: running Python files ({args[0]}) is not simulated\n")
        return 1

    def python_inline(self, shell: Shell, args: list[str], out: Sink, err: Sink, env: dict[str, str]) -> int:
        """``python3 -c CODE [ARGS]``: patch lines succeed; Secret Manager reads are resolved."""
        text = " ".join(args)
        match = SECRET_REF_RE.search(text)
        if match is None:
            return 0
        project, secret, version = match.groups()
        value, problem = self.services.secret_access(project, secret, version)
        if value is None:
            err.write('Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n')
            err.write(f"{problem}\n")
            return 1
        out.write(value)
        return 0

    def run_maxtext(
        self, shell: Shell, module: str, argv: list[str], out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        services = self.services
        ctx = maxtext_sim.SimContext(
            router=self.router,
            write=out.write,
            platform=self.platform,
            seed=services.seed,
            fault=services.fault,
            cancelled=services.cancelled,
            step_seconds=services.step_seconds,
            hold_file=services.hold_file,
        )
        return maxtext_sim.run(module, argv, env, ctx)

    def cmd_install_uv(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        err.write("sandbox: uv installer is only available on a VM\n")
        return 1


class PodHost(MachineHost):
    """The Pathways head / main container of a GKE job (MaxText image)."""

    platform = "gke"

    def __init__(self, fs_root: Path, services: MachineServices, job_name: str) -> None:
        super().__init__(fs_root, services)
        self.hostname = f"{job_name}-0"
        self.internal_ip = "10.4.0.17"
        for directory in ("/sys/fs/cgroup", "/deps/src/maxtext/trainers/post_train/rl", "/app"):
            self.fs.host_path(directory).mkdir(parents=True, exist_ok=True)


class VmHost(MachineHost):
    """A Compute Engine TPU VM (Ubuntu accelerator image)."""

    platform = "vm"

    def __init__(
        self,
        fs_root: Path,
        services: MachineServices,
        vm_name: str,
        user: str,
        project: str,
        scopes: list[str],
    ) -> None:
        super().__init__(fs_root, services)
        self.hostname = vm_name
        self.internal_ip = "10.128.0.5"
        self.user = user
        self.project = project
        self.scopes = scopes
        for directory in (f"/home/{user}", "/dev/shm", "/var/lib/dpkg"):  # noqa: S108 (simulated VM)
            self.fs.host_path(directory).mkdir(parents=True, exist_ok=True)

    @property
    def home(self) -> str:
        return f"/home/{self.user}"

    def login_env(self, base: dict[str, str]) -> dict[str, str]:
        env = {
            "HOME": self.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "PATH": DEFAULT_PATH,
            "SHELL": "/bin/bash",
        }
        env.update({k: v for k, v in base.items() if k in ("LANG", "LC_ALL", "TERM")})
        return env

    def system_command(self, name: str) -> CommandFn | None:
        table: dict[str, CommandFn] = {
            "sudo": self.cmd_sudo,
            "apt": self.cmd_apt,
            "apt-get": self.cmd_apt,
            "curl": self.cmd_curl,
            "wget": self.cmd_wget,
            "gcloud": self.cmd_gcloud,
            "gsutil": self.cmd_gsutil,
        }
        if name in table:
            return table[name]
        return super().system_command(name)

    # -- installed software ---------------------------------------------------------------
    def marker_command(self, kind: str, path: str) -> CommandFn | None:
        if kind == "uv":
            return self.cmd_uv
        if kind == "python":
            return self.cmd_python
        if kind == "pip":
            return lambda s, a, i, o, e, env: self.cmd_uv(
                s, ["uv", "pip", *a[1:]], i, o, e, {**env, "VIRTUAL_ENV": self._venv_of(path)}
            )
        if kind == "extra-deps":
            return lambda s, a, i, o, e, env: self.install_extra_deps(self._venv_of(path), o)
        return None

    @staticmethod
    def _venv_of(path: str) -> str:
        return path.rsplit("/bin/", 1)[0]

    def _packages_file(self, venv: str) -> Path:
        return self.fs.host_path(f"{venv}/.sandbox-packages.json")

    def venv_packages(self, venv: str) -> set[str]:
        try:
            return set(json.loads(self._packages_file(venv).read_text()))
        except (OSError, ValueError):
            return set()

    def _add_packages(self, venv: str, names: set[str]) -> None:
        self._packages_file(venv).write_text(json.dumps(sorted(self.venv_packages(venv) | names)))

    def python_packages(self, shell: Shell, interpreter: str) -> set[str] | None:
        if "/" in interpreter:
            path = absolute(shell, interpreter)
            if "/bin/" in path and not path.startswith("/usr/"):
                return self.venv_packages(self._venv_of(path))
            return set()
        for directory in shell.vars.get("PATH", DEFAULT_PATH).split(":"):
            if directory in SYSTEM_BIN_DIRS:
                return set()
            if self.fs.exists(f"{directory.rstrip('/')}/{interpreter}"):
                return self.venv_packages(directory.rstrip("/").rsplit("/bin", 1)[0])
        return set()

    def cmd_install_uv(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        home = env.get("HOME", self.home)
        bin_dir = f"{home}/.local/bin"
        self.fs.write(f"{bin_dir}/uv", b"#!sandbox uv\n")
        self.fs.write(f"{bin_dir}/uvx", b"#!sandbox uv\n")
        self.fs.write(f"{bin_dir}/env", b'export PATH="$HOME/.local/bin:$PATH"\n')
        out.write(
            f"downloading uv 0.9.7 x86_64-unknown-linux-gnu\nno checksums to verify\ninstalling to {bin_dir}\n"
        )
        out.write(
            "  uv\n  uvx\neverything's installed!\n\nTo add $HOME/.local/bin to your PATH, either restart your shell or run:\n\n"
        )
        out.write("    source $HOME/.local/bin/env (sh, bash, zsh)\n")
        return 0

    def cmd_uv(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = argv[1:]
        if args[:2] == ["python", "install"]:
            for version in args[2:] or ["3.12"]:
                self.fs.write(
                    f"{env.get('HOME', self.home)}/.local/share/uv/python/cpython-{version}/bin/python3",
                    b"#!sandbox python\n",
                )
                err.write(f"Installed Python {version}.9 in 2.31s\n + cpython-{version}.9-linux-x86_64-gnu\n")
            return 0
        if args and args[0] == "venv":
            flags_with_values = {"--python", "-p"}
            names: list[str] = []
            skip = False
            for item in args[1:]:
                if skip:
                    skip = False
                    continue
                if item in flags_with_values:
                    skip = True
                    continue
                if not item.startswith("-"):
                    names.append(item)
            venv = absolute(shell, names[0] if names else ".venv")
            self.fs.write(f"{venv}/pyvenv.cfg", b"home = /usr/bin\nversion_info = 3.12.9\n")
            self.fs.write(f"{venv}/bin/python3", b"#!sandbox python\n")
            self.fs.write(f"{venv}/bin/python", b"#!sandbox python\n")
            if "--seed" in args:
                self.fs.write(f"{venv}/bin/pip", b"#!sandbox pip\n")
            self.fs.write(
                f"{venv}/bin/activate",
                f'export VIRTUAL_ENV="{venv}"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n'.encode(),
            )
            self._add_packages(venv, {"pip"} if "--seed" in args else set())
            err.write(
                f"Using CPython 3.12.9\nCreating virtual environment with seed packages at: {names[0] if names else '.venv'}\n"
            )
            err.write(f"Activate with: source {names[0] if names else '.venv'}/bin/activate\n")
            return 0
        if args[:2] == ["pip", "install"]:
            venv = env.get("VIRTUAL_ENV", "")
            if "--system" in args:
                venv = ""
            if not venv or not self.fs.exists(f"{venv}/pyvenv.cfg"):
                err.write(
                    "error: No virtual environment found; run `uv venv` to create an environment, or pass "
                    "`--system` to install into a non-virtual environment\n"
                )
                return 2
            requested = {
                re.split(r"[\[=<>~! ]", a, maxsplit=1)[0].lower() for a in args[2:] if not a.startswith("-")
            }
            self._add_packages(venv, requested)
            if "maxtext" in requested:
                self.fs.write(f"{venv}/bin/install_tpu_post_train_extra_deps", b"#!sandbox extra-deps\n")
                self._add_packages(venv, {"maxtext", "jax", "orbax", "transformers", "torch"})
            err.write(f"Resolved 212 packages in 3.1s\nInstalled {len(requested) + 200} packages in 41.2s\n")
            return 0
        err.write(f"sandbox: `uv {' '.join(args)}` is not simulated\n")
        return 2

    def install_extra_deps(self, venv: str, out: Sink) -> int:
        self._add_packages(venv, {"tunix", "vllm", "tpu_inference"})
        out.write("Installing post-training extra dependencies (tunix, vllm, tpu-inference)...\nDone.\n")
        return 0

    # -- system tools ---------------------------------------------------------------------
    def cmd_sudo(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = argv[1:]
        while args and args[0].startswith("-"):
            args = args[1:]
        # sudo's own syntax: leading VAR=value words set the command's environment (sudoers
        # permitting, as for an ALL user on a TPU VM).
        assignments: dict[str, str] = {}
        while args and "=" in args[0] and args[0].split("=", 1)[0].isidentifier():
            name, value = args[0].split("=", 1)
            assignments[name] = value
            args = args[1:]
        if not args:
            err.write("usage: sudo command\n")
            return 1
        command = self.resolve_command(shell, args[0])
        if command is None:
            err.write(f"sudo: {args[0]}: command not found\n")
            return 1
        run_env = {**env, **assignments, "SUDO_USER": self.user, "__SANDBOX_ROOT": "1"}
        return command(shell, args, stdin, out, err, run_env)

    def cmd_apt(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        args = argv[1:]
        if env.get("__SANDBOX_ROOT") != "1":
            err.write(
                "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
            )
            err.write(
                "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?\n"
            )
            return 100
        action = next((a for a in args if not a.startswith("-")), "")
        assume_yes = any(a in ("-y", "--yes", "--assume-yes", "-qy", "-yq") for a in args)
        if action == "update":
            out.write(
                "Hit:1 http://us-central1.gce.archive.ubuntu.com/ubuntu jammy InRelease\nReading package lists... Done\n"
            )
            return 0
        if action in ("upgrade", "install", "dist-upgrade", "full-upgrade"):
            out.write("Reading package lists... Done\nBuilding dependency tree... Done\n")
            if not assume_yes and env.get("DEBIAN_FRONTEND") != "noninteractive":
                out.write("Do you want to continue? [Y/n] Abort.\n")
                return 1
            packages = [a for a in args if not a.startswith("-") and a != action]
            out.write(f"Setting up {', '.join(packages) or 'upgrades'} ...\n")
            return 0
        err.write(f"E: Invalid operation {action}\n")
        return 100

    def cmd_curl(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        urls = [a for a in argv[1:] if a.startswith(("http://", "https://"))]
        if not urls:
            err.write("curl: no URL specified!\n")
            return 2
        if UV_INSTALLER_URL_RE.match(urls[0]):
            out.write(f"#!/bin/sh\n# uv installer (sandbox)\n{INSTALL_UV_COMMAND}\n")
            return 0
        host = urls[0].split("/")[2]
        err.write(f"curl: (6) Could not resolve host: {host}\n")
        return 6

    def cmd_wget(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        err.write("Resolving failed: Temporary failure in name resolution.\n")
        return 4

    def cmd_gsutil(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        err.write("sandbox: gsutil is not simulated; use `gcloud storage`\n")
        return 1

    def can_write_gcs(self) -> bool:
        return bool({"cloud-platform", "storage-rw", "storage-full"} & set(self.scopes))

    def cmd_gcloud(
        self, shell: Shell, argv: list[str], stdin: str, out: Sink, err: Sink, env: dict[str, str]
    ) -> int:
        from tpu_rl_sandbox import fake_gcloud

        router = Router(
            GcsStore(
                self.services.gcs.api,
                identity=f"{self.project}-compute@developer.gserviceaccount.com",
                can_write=lambda bucket: self.can_write_gcs(),
                denied_detail="Access denied. Provided scope(s) are not authorized.",
            ),
            self.fs,
        )

        def absolute_path(path: str) -> str:
            return path if path.startswith("gs://") else absolute(shell, path)

        try:
            return fake_gcloud.run_on_vm(
                argv[1:],
                router=router,
                to_absolute=absolute_path,
                secret_access=self.vm_secret_access,
                default_project=self.project,
                stdout=out.write,
                stderr=err.write,
                stdin=stdin,
            )
        except GcloudUsageError as error:
            err.write(error.render())
            return 2

    def vm_secret_access(self, project: str, secret: str, version: str) -> tuple[str | None, str]:
        if "cloud-platform" not in self.scopes:
            return None, "PERMISSION_DENIED: Request had insufficient authentication scopes."
        return self.services.secret_access(project, secret, version)


def placeholder_token(sha256: str) -> str:
    """What a secret "contains" inside the sandbox: a stand-in derived from its hash."""
    return "hf_sandbox_" + hashlib.sha256(sha256.encode()).hexdigest()[:24]
