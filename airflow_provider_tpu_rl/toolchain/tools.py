"""The tools ``gcluster`` needs, found on PATH or installed (pinned, verified) into the cache.

gcluster checks its own dependencies before ``deploy``/``destroy``/``export-outputs``
(cluster-toolkit ``cmd/dependencies.go``, ``pkg/dependencies/resolver.go``): ``terraform`` on PATH
whose ``terraform version --json`` is at least ``TerraformVersion`` (newer is accepted with a
warning, older or unreadable is "missing"), and ``packer`` merely present on PATH; a missing one
is downloaded only with ``--download-dependencies``, else asked for on stdin (``[y/N]``), which
without a TTY is a refusal. ``gcluster job`` commands need ``kubectl version --client
--output=json`` and ``gke-gcloud-auth-plugin --version`` to succeed (``cmd/job/prereq.go``).
Terraform fetches blueprint modules over git, so ``git`` must be on PATH too.

This module applies the same rules ahead of time: Terraform and Packer come from PATH when
gcluster would accept them, else from ``<cache>/tools/<tool>-<version>/<os>_<arch>/`` (downloaded
from HashiCorp, SHA-256 pinned, the zip kept so the binary is re-verified against the zip's member
before every use); ``git``, ``kubectl``, ``gke-gcloud-auth-plugin`` and ``gcloud`` are only checked.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError
from airflow_provider_tpu_rl.toolchain.bundle import (
    current_platform,
    download_verified,
    file_lock,
    normalise_sha256,
    sha256_file,
    sha256_of,
)
from airflow_provider_tpu_rl.toolchain.pins import (
    PACKER_DEFAULT_VERSION,
    PACKER_SHA256,
    TERRAFORM_DEFAULT_VERSION,
    TERRAFORM_SHA256,
)
from airflow_provider_tpu_rl.toolchain.process import minimal_env

log = logging.getLogger(__name__)

TERRAFORM_VERSION = TERRAFORM_DEFAULT_VERSION
PACKER_VERSION = PACKER_DEFAULT_VERSION
# pkg/dependencies/downloader.go: urlFormat "https://releases.hashicorp.com/%s/%s/%s_%s_%s.zip"
HASHICORP_BASE_URL = "https://releases.hashicorp.com"

PURPOSES: dict[str, tuple[str, ...]] = {
    "deploy": ("gcluster", "terraform", "packer", "git", "gcloud"),
    "jobs": ("gcluster", "gcloud", "kubectl", "gke-gcloud-auth-plugin"),
    "tpu_vm": ("gcloud",),
}
INSTALLABLE = ("terraform", "packer")
SOURCES = ("PATH", "cache", "downloaded", "connection", "missing")
VERSION_TIMEOUT = 60.0
DOWNLOAD_TIMEOUT = 300.0
PLUGIN_CACHE = "terraform-plugins"

# How each tool is asked for its version; exit 0 is what gcluster checks (cmd/job/prereq.go).
VERSION_ARGS: dict[str, tuple[str, ...]] = {
    "terraform": ("version", "-json"),
    "packer": ("version",),
    "git": ("--version",),
    "kubectl": ("version", "--client", "--output=json"),
    "gke-gcloud-auth-plugin": ("--version",),
    "gcloud": ("version", "--format=json"),
    "gcluster": ("--version",),
}
_VERSION_RE = re.compile(r"v?(\d+\.\d+(?:\.\d+)*(?:-[0-9A-Za-z.-]+)?)")
_HOW_TO_GET = {
    "git": "install git (Terraform fetches blueprint modules with it)",
    "kubectl": "install kubectl (gcloud components install kubectl)",
    "gke-gcloud-auth-plugin": "install gke-gcloud-auth-plugin (gcloud components install gke-gcloud-auth-plugin)",
    "gcloud": "install the Google Cloud CLI or set gcloud_path in the gcluster connection",
}


@dataclass(frozen=True)
class ToolStatus:
    """One tool: what is wanted, what was found where, and what to do when it is not OK."""

    tool: str
    wanted: str
    version: str | None
    path: str | None
    source: str  # one of SOURCES
    ok: bool
    advice: str = ""
    archive: str | None = field(default=None, compare=False)  # the kept zip a cached binary came from
    archive_sha256: str | None = field(default=None, compare=False)

    @property
    def problem(self) -> str:
        """``<tool> <wanted> (<advice>)``; empty when OK."""
        if self.ok:
            return ""
        wanted = f" {self.wanted}" if self.wanted and self.wanted != "any" else ""
        return f"{self.tool}{wanted} ({self.advice})"


@dataclass(frozen=True)
class Toolchain:
    """The tools one purpose (``deploy``, ``jobs``, ``tpu_vm``) needs, and the env to run them."""

    purpose: str
    statuses: tuple[ToolStatus, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.statuses)

    @property
    def bin_dirs(self) -> tuple[str, ...]:
        """Folders to put first on PATH (tools not found on PATH itself), in order, once each."""
        dirs: list[str] = []
        for s in self.statuses:
            if s.ok and s.path and s.source in ("cache", "downloaded", "connection") and s.tool != "gcluster":
                folder = str(Path(s.path).parent)
                if folder not in dirs:
                    dirs.append(folder)
        return tuple(dirs)

    def status(self, tool: str) -> ToolStatus:
        for s in self.statuses:
            if s.tool == tool:
                return s
        raise KeyError(f"{self.purpose} does not use {tool!r}")

    def problem_line(self) -> str:
        """One line naming every tool that is not OK and what to do; empty when all are."""
        problems = [s.problem for s in self.statuses if not s.ok]
        if not problems:
            return ""
        return f"{self.purpose} needs " + "; ".join(problems)


# ---------------------------------------------------------------------------------------- helpers
def hashicorp_platform(system: str | None = None, machine: str | None = None) -> str:
    """``linux_amd64`` / ``darwin_arm64`` …: the ``<os>_<arch>`` of HashiCorp's release names."""
    plat = current_platform(system, machine)
    return f"{'darwin' if plat.os == 'mac' else plat.os}_{plat.arch}"


def parse_version(text: str) -> tuple[tuple[int, ...], bool] | None:
    """``(numbers, is_release)`` of a version like ``1.12.2`` / ``v1.13.0-beta1`` (go-version order)."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?", text.strip())
    if not match:
        return None
    numbers = tuple(int(n) for n in match.group(1).split("."))
    numbers = numbers + (0,) * (3 - len(numbers)) if len(numbers) < 3 else numbers
    return numbers, match.group(2) is None


def version_at_least(found: str, minimum: str) -> bool:
    """``found >= minimum`` as hashicorp/go-version compares them (a pre-release sorts first)."""
    a, b = parse_version(found), parse_version(minimum)
    if a is None or b is None:
        return False
    return a >= b


def _query_env(path: str, base: Mapping[str, str] | None) -> dict[str, str]:
    """``base`` (default: the minimal env of this process) with ``path`` as PATH, no update checks."""
    env = dict(base) if base is not None else minimal_env()
    env["PATH"] = path
    if "HOME" not in env and os.environ.get("HOME"):
        env["HOME"] = os.environ["HOME"]
    env["CHECKPOINT_DISABLE"] = "1"  # terraform/packer: no version check against checkpoint-api
    env["CLOUDSDK_CORE_DISABLE_PROMPTS"] = "1"
    env["CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK"] = "1"
    return env


def query_version(
    tool: str,
    executable: str,
    *,
    path: str,
    base_env: Mapping[str, str] | None = None,
    timeout: float = VERSION_TIMEOUT,
) -> tuple[bool, str | None, str]:
    """Run the tool's version query: ``(exit 0, version or None, first error line)``."""
    try:
        proc = subprocess.run(
            [executable, *VERSION_ARGS[tool]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=_query_env(path, base_env),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, None, f"`{tool} {' '.join(VERSION_ARGS[tool])}` timed out after {timeout:g}s"
    except OSError as err:
        return False, None, f"cannot run {executable}: {err.strerror}"
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr + "\n" + proc.stdout).splitlines() if line.strip()]
        first = lines[0] if lines else ""
        return False, None, f"`{tool} {' '.join(VERSION_ARGS[tool])}` exited {proc.returncode}: {first}"[:300]
    return True, _version_from_output(tool, proc.stdout), ""


def _version_from_output(tool: str, stdout: str) -> str | None:
    if tool in ("terraform", "kubectl", "gcloud"):
        try:
            data = json.loads(stdout)
        except ValueError:
            data = None
        if isinstance(data, dict):
            value = {
                "terraform": data.get("terraform_version"),
                "kubectl": (data.get("clientVersion") or {}).get("gitVersion"),
                "gcloud": data.get("Google Cloud SDK"),
            }[tool]
            if isinstance(value, str) and value:
                return value.removeprefix("v")
        if tool == "terraform":
            return None  # gcluster reads only the JSON: anything else is "could not determine"
    match = _VERSION_RE.search(stdout)
    return match.group(1) if match else None


# ------------------------------------------------------------------------- the HashiCorp installs
class NotInstalled(ConfigurationError):
    """The tool is not in the cache and this call may not download it."""


@dataclass(frozen=True)
class ToolPin:
    """What to install for one HashiCorp tool."""

    tool: str
    version: str
    sha256: str | None  # of the zip for this platform; None: not pinned, no download


def tool_dir(cache_dir: Path, tool: str, version: str, plat: str) -> Path:
    """``<cache>/tools/<tool>-<version>/<os>_<arch>``: the installed binary and its kept zip."""
    return Path(cache_dir) / "tools" / f"{tool}-{version}" / plat


def _zip_name(pin: ToolPin, plat: str) -> str:
    return f"{pin.tool}_{pin.version}_{plat}.zip"


def _zip_member_sha256(archive: Path, member: str) -> str | None:
    try:
        with zipfile.ZipFile(archive) as zf, zf.open(member) as handle:
            return sha256_of(handle)
    except (KeyError, zipfile.BadZipFile, OSError):
        return None


def verify_installed(binary: Path, archive: Path, digest: str) -> str | None:
    """Why ``binary`` cannot be trusted (its zip is not ``digest``, or it differs from the zip's
    member), or ``None`` when it checks out."""
    try:
        actual = sha256_file(archive)
    except OSError as err:
        return f"its kept zip {archive} cannot be read ({err.strerror})"
    if actual != digest:
        return f"its kept zip {archive.name} has sha256 {actual}, expected {digest}"
    wanted = _zip_member_sha256(archive, binary.name)
    try:
        have = sha256_file(binary)
    except OSError as err:
        return f"{binary} cannot be read ({err.strerror})"
    if wanted is None or have != wanted:
        return f"{binary} differs from the {binary.name} in its verified zip (tampered or corrupted)"
    return None


def _extract_member(archive: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as zf, zf.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
    except KeyError as err:
        raise ConfigurationError(f"{archive.name} holds no {member!r} executable") from err
    except (zipfile.BadZipFile, OSError) as err:
        raise ConfigurationError(f"cannot extract {member} from {archive.name}: {err}") from err
    dest.chmod(0o755)


def ensure_tool(
    pin: ToolPin,
    *,
    cache_dir: Path,
    plat: str,
    base_url: str | None = None,
    download: bool = True,
    timeout: float = DOWNLOAD_TIMEOUT,
) -> tuple[Path, str, Path]:
    """The verified cached binary ``(path, "cache"|"downloaded", kept zip)``, installing it once.

    A cached binary is checked against its kept zip (which is checked against ``pin.sha256``); a
    bad binary is re-extracted from a good zip, a bad zip downloaded again (``download``) or
    refused. Installs are atomic and serialised by a file lock. Raises :class:`ConfigurationError`.
    """
    folder = tool_dir(cache_dir, pin.tool, pin.version, plat)
    binary = folder / pin.tool
    archive = folder / _zip_name(pin, plat)
    if pin.sha256 is None:
        raise ConfigurationError(
            f"no pinned sha256 for {pin.tool} {pin.version} ({plat}); set {pin.tool}_sha256 in the gcluster "
            "connection"
        )
    if binary.is_file() and verify_installed(binary, archive, pin.sha256) is None:
        return binary, "cache", archive
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(
            f"cannot create the tools cache folder {folder.parent}: {err}; set cache_dir"
        ) from err
    with file_lock(folder.parent / f".{plat}.lock"):
        problem = verify_installed(binary, archive, pin.sha256) if binary.exists() else "not installed"
        if problem is None:  # installed by another process while we waited
            return binary, "cache", archive
        if archive.is_file() and sha256_file(archive) == pin.sha256:
            log.warning("Re-extracting %s from its verified zip %s: %s", pin.tool, archive, problem)
            staged = folder / f".{pin.tool}.partial"
            _extract_member(archive, pin.tool, staged)
            os.replace(staged, binary)
            return binary, "cache", archive
        if not download:
            raise NotInstalled(
                f"{pin.tool} {pin.version} is not installed (or not verified) in {folder} ({problem}) and this "
                "process does not download"
            )
        url = (
            f"{(base_url or HASHICORP_BASE_URL).rstrip('/')}/{pin.tool}/{pin.version}/{_zip_name(pin, plat)}"
        )
        staging = Path(tempfile.mkdtemp(prefix=f".{plat}.partial-", dir=folder.parent))
        try:
            new = staging / plat
            new.mkdir()
            download_verified(
                url,
                new / archive.name,
                pin.sha256,
                what=f"{pin.tool} {pin.version}",
                advice=f"check hashicorp_base_url (a mirror), or install {pin.tool} on PATH yourself",
                timeout=timeout,
            )
            _extract_member(new / archive.name, pin.tool, new / pin.tool)
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(new, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("Installed %s %s (%s) into %s", pin.tool, pin.version, plat, folder)
    return binary, "downloaded", archive


# ----------------------------------------------------------------------------- resolving a purpose
def _which(tool: str, path: str) -> str | None:
    return shutil.which(tool, path=path)


GclusterResolver = Callable[[bool], tuple[str, str]]


def _check_only(
    tool: str,
    path: str,
    base_env: Mapping[str, str] | None,
    timeout: float,
    executable: str | None = None,
    source: str = "PATH",
    probe: bool = True,
) -> ToolStatus:
    found = executable or _which(tool, path)
    if found is None:
        return ToolStatus(tool, "any", None, None, "missing", False, f"not on PATH; {_HOW_TO_GET[tool]}")
    if tool == "gcloud":  # the hook runs gcloud itself and reports its failures with their output
        version = None
        if probe:
            _, version, _ = query_version(tool, found, path=path, base_env=base_env, timeout=timeout)
        return ToolStatus(tool, "any", version, found, source, True)
    ran, version, error = query_version(tool, found, path=path, base_env=base_env, timeout=timeout)
    if not ran:
        return ToolStatus(tool, "any", None, found, source, False, f"{error}; {_HOW_TO_GET[tool]}")
    return ToolStatus(tool, "any", version, found, source, True)


def _hashicorp(
    pin: ToolPin,
    *,
    path: str,
    base_env: Mapping[str, str] | None,
    timeout: float,
    cache_dir: Path,
    plat: str,
    base_url: str | None,
    install: bool,
) -> ToolStatus:
    # terraform: gcluster's rule is version >= TerraformVersion; packer: merely on PATH.
    wanted = f">= {pin.version}" if pin.tool == "terraform" else "any"
    found = _which(pin.tool, path)
    found_version: str | None = None
    why = "not on PATH"
    if found is not None:
        ran, version, error = query_version(pin.tool, found, path=path, base_env=base_env, timeout=timeout)
        if pin.tool == "packer":
            return ToolStatus(pin.tool, wanted, version, found, "PATH", True)
        if version is not None and version_at_least(version, pin.version):
            return ToolStatus(pin.tool, wanted, version, found, "PATH", True)
        found_version = version
        why = (
            f"{found} is {version}, older"
            if version
            else f"cannot read the version of {found} ({error or 'no JSON from `terraform version -json`'})"
        )
    try:
        binary, source, archive = ensure_tool(
            pin, cache_dir=cache_dir, plat=plat, base_url=base_url, download=install, timeout=DOWNLOAD_TIMEOUT
        )
    except NotInstalled:
        advice = f"{why}; set install_tools=true or add {pin.tool} {wanted.removeprefix('any')} to PATH"
        return ToolStatus(pin.tool, wanted, found_version, found, "missing", False, " ".join(advice.split()))
    except (ConfigurationError, CommandError) as err:
        advice = f"{why}; {err}"
        return ToolStatus(pin.tool, wanted, found_version, found, "missing", False, advice)
    ran, version, error = query_version(pin.tool, str(binary), path=path, base_env=base_env, timeout=timeout)
    if not ran or version != pin.version:
        detail = error or f"it reports version {version}"
        return ToolStatus(
            pin.tool,
            wanted,
            version,
            str(binary),
            source,
            False,
            f"the installed {binary} does not run: {detail}",
        )
    return ToolStatus(
        pin.tool, wanted, version, str(binary), source, True, archive=str(archive), archive_sha256=pin.sha256
    )


def _gcluster(
    resolver: GclusterResolver | None,
    *,
    path: str,
    base_env: Mapping[str, str] | None,
    timeout: float,
    install: bool,
    probe: bool = True,
    wanted: str = "any",
) -> ToolStatus:
    if resolver is None:
        found = _which("gcluster", path)
        if found is None:
            return ToolStatus("gcluster", wanted, None, None, "missing", False, "not on PATH")
        executable, source = found, "PATH"
    else:
        try:
            executable, source = resolver(install)
        except (ConfigurationError, CommandError) as err:
            return ToolStatus("gcluster", wanted, None, None, "missing", False, str(err))
    version = None
    if probe:
        _, version, _ = query_version("gcluster", executable, path=path, base_env=base_env, timeout=timeout)
    return ToolStatus(
        "gcluster", "any" if source == "connection" else wanted, version, executable, source, True
    )


def resolve_toolchain(
    purpose: str,
    *,
    cache_dir: Path,
    install: bool = True,
    terraform_version: str = TERRAFORM_VERSION,
    terraform_sha256: str | Mapping[str, str] | None = None,
    packer_version: str = PACKER_VERSION,
    packer_sha256: str | Mapping[str, str] | None = None,
    base_url: str | None = None,
    gcluster: GclusterResolver | None = None,
    gcloud_path: str | None = None,
    path: str | None = None,
    base_env: Mapping[str, str] | None = None,
    plat: str | None = None,
    timeout: float = VERSION_TIMEOUT,
    memo: dict[str, ToolStatus] | None = None,
    probe: bool = True,
    gcluster_version: str = "any",
) -> Toolchain:
    """Find (and with ``install``, download) every tool ``purpose`` needs.

    ``gcluster`` resolves the gcluster binary: called with ``install``, returns ``(path, source)``
    or raises :class:`ConfigurationError`. ``path`` is the PATH searched (default the worker's);
    ``memo`` shares statuses between purposes (``doctor --for all``). ``probe=False`` skips the
    version queries of gcluster and gcloud (the hook's own tools, run right after). Never raises for a missing
    tool: see :attr:`Toolchain.ok` and :meth:`Toolchain.problem_line`.
    """
    if purpose not in PURPOSES:
        raise ConfigurationError(
            f"unknown toolchain purpose {purpose!r}; choose one of {', '.join(PURPOSES)}"
        )
    source_env = os.environ if base_env is None else base_env
    search = path if path is not None else source_env.get("PATH", os.defpath)
    gcloud_source = "PATH"
    if gcloud_path and os.sep in gcloud_path:
        configured = os.path.realpath(os.path.expanduser(gcloud_path))
        on_path = shutil.which("gcloud", path=search)
        if on_path is None or os.path.realpath(on_path) != configured:
            # gcluster runs `gcloud` by name: the configured one's folder goes first on PATH, and
            # every tool is looked up as gcluster will then find it (e.g. the SDK's own kubectl).
            search = str(Path(os.path.expanduser(gcloud_path)).parent) + os.pathsep + search
            gcloud_source = "connection"
    memo = {} if memo is None else memo
    statuses: list[ToolStatus] = []
    env: dict[str, str] = {}
    for tool in PURPOSES[purpose]:
        if tool not in memo:
            memo[tool] = _resolve_one(
                tool,
                cache_dir=Path(cache_dir),
                install=install,
                pins={
                    "terraform": (terraform_version, terraform_sha256, TERRAFORM_VERSION, TERRAFORM_SHA256),
                    "packer": (packer_version, packer_sha256, PACKER_VERSION, PACKER_SHA256),
                },
                base_url=base_url,
                gcluster=gcluster,
                gcloud_path=gcloud_path,
                path=search,
                base_env=base_env,
                plat=plat,
                timeout=timeout,
                probe=probe,
                gcluster_version=gcluster_version,
                gcloud_source=gcloud_source,
            )
        statuses.append(memo[tool])
        if tool == "terraform":
            plugins = Path(cache_dir) / PLUGIN_CACHE
            try:
                plugins.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                log.warning("Cannot create the Terraform plugin cache %s: %s", plugins, err)
            else:
                env["TF_PLUGIN_CACHE_DIR"] = str(plugins)
    return Toolchain(purpose, tuple(statuses), env)


def _resolve_one(
    tool: str,
    *,
    cache_dir: Path,
    install: bool,
    pins: Mapping[str, tuple[str, str | Mapping[str, str] | None, str, Mapping[str, str]]],
    base_url: str | None,
    gcluster: GclusterResolver | None,
    gcloud_path: str | None,
    path: str,
    base_env: Mapping[str, str] | None,
    plat: str | None,
    timeout: float,
    probe: bool,
    gcluster_version: str,
    gcloud_source: str,
) -> ToolStatus:
    if tool == "gcluster":
        return _gcluster(
            gcluster,
            path=path,
            base_env=base_env,
            timeout=timeout,
            install=install,
            probe=probe,
            wanted=gcluster_version,
        )
    if tool == "gcloud" and gcloud_path:
        configured = shutil.which(os.path.expanduser(gcloud_path), path=path)
        if configured is None:
            return ToolStatus(
                "gcloud",
                "any",
                None,
                None,
                "missing",
                False,
                f"gcloud_path {gcloud_path!r} is not an executable",
            )
        return _check_only(
            "gcloud", path, base_env, timeout, executable=configured, source=gcloud_source, probe=probe
        )
    if tool in INSTALLABLE:
        version, configured_sha, default_version, default_sha = pins[tool]
        try:
            key = plat or hashicorp_platform()
        except ConfigurationError as err:
            return ToolStatus(tool, f">= {version}", None, None, "missing", False, str(err))
        try:
            digest = normalise_sha256(configured_sha, key, f"{tool} {version} ({key})")
        except ConfigurationError as err:
            return ToolStatus(tool, f">= {version}", None, None, "missing", False, str(err))
        if digest is None and version == default_version:
            digest = default_sha.get(key)
        return _hashicorp(
            ToolPin(tool, version, digest),
            path=path,
            base_env=base_env,
            timeout=timeout,
            cache_dir=cache_dir,
            plat=key,
            base_url=base_url,
            install=install,
        )
    return _check_only(tool, path, base_env, timeout, probe=probe)


def reverify(toolchain: Toolchain) -> str | None:
    """Re-check every cached binary of ``toolchain`` against its kept zip; the first problem or ``None``."""
    for s in toolchain.statuses:
        if s.archive and s.archive_sha256 and s.path:
            problem = verify_installed(Path(s.path), Path(s.archive), s.archive_sha256)
            if problem is not None:
                return f"{s.tool}: {problem}"
    return None


# --------------------------------------------------------------------------------------- doctor
def format_table(toolchains: Sequence[Toolchain], problems: Mapping[str, Sequence[str]] | None = None) -> str:
    """The ``tpu-rl doctor`` table: one row per tool (with the purposes needing it), then each
    purpose's verdict line; ``problems`` (purpose -> lines) fails a purpose whose tools are all OK
    (gcluster's own dependency check, gcloud's account, ADC), one ``purpose: line`` each."""
    rows: dict[str, tuple[ToolStatus, list[str]]] = {}
    for chain in toolchains:
        for s in chain.statuses:
            if s.tool in rows:
                rows[s.tool][1].append(chain.purpose)
            else:
                rows[s.tool] = (s, [chain.purpose])
    header = ("TOOL", "NEEDED FOR", "WANTED", "FOUND", "FROM", "STATUS")
    table: list[tuple[str, ...]] = [header]
    for tool, (s, purposes) in rows.items():
        where = s.source if s.source == "missing" or not s.path else f"{s.source} ({s.path})"
        table.append(
            (tool, ",".join(purposes), s.wanted, s.version or "-", where, "OK" if s.ok else s.advice)
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in table
    ]
    lines.append("")
    problems = problems or {}
    for chain in toolchains:
        if not chain.ok:
            lines.append(chain.problem_line())
        elif problems.get(chain.purpose):
            lines.extend(f"{chain.purpose}: {line}" for line in problems[chain.purpose])
        else:
            lines.append(f"{chain.purpose}: OK")
    return "\n".join(line.rstrip() for line in lines)


def purposes_for(choice: str) -> tuple[str, ...]:
    """``all`` → every purpose; else the one named."""
    if choice == "all":
        return tuple(PURPOSES)
    if choice not in PURPOSES:
        raise ConfigurationError(f"unknown purpose {choice!r}; choose one of {', '.join([*PURPOSES, 'all'])}")
    return (choice,)
