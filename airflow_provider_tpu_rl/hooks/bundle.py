"""Find or install the Cluster Toolkit release bundle (the ``gcluster`` binary and ``examples/``).

The release publishes ``gcluster_bundle_<linux|mac>_<amd64|arm64>.tgz`` per tag (README,
"Using the Pre-built Bundle"); the archive holds ``gcluster`` and ``examples/`` at its root. The
release has no checksum file to check against, so a download is verified against the SHA-256 the
connection gives, and refused without one. Installs are atomic and serialised across processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind

log = logging.getLogger(__name__)

RELEASE_BASE_URL = "https://github.com/GoogleCloudPlatform/cluster-toolkit/releases/download"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BundlePlatform:
    """The ``<os>_<arch>`` part of a bundle name."""

    os: str  # "linux" | "mac"
    arch: str  # "amd64" | "arm64"

    @property
    def key(self) -> str:
        return f"{self.os}_{self.arch}"

    @property
    def asset_name(self) -> str:
        return f"gcluster_bundle_{self.key}.tgz"


def current_platform(system: str | None = None, machine: str | None = None) -> BundlePlatform:
    """The bundle platform of this machine (like the German seed's ``uname`` switch)."""
    system = (system or sys.platform).lower()
    machine = (machine or platform.machine()).lower()
    if system.startswith("linux"):
        os_name = "linux"
    elif system in ("darwin", "mac", "macos"):
        os_name = "mac"
    else:
        raise ConfigurationError(f"Cluster Toolkit publishes no bundle for OS {system!r}; set gcluster_path")
    if machine in ("x86_64", "amd64"):
        arch = "amd64"
    elif machine in ("aarch64", "arm64"):
        arch = "arm64"
    else:
        raise ConfigurationError(
            f"Cluster Toolkit publishes no bundle for CPU {machine!r}; set gcluster_path"
        )
    return BundlePlatform(os_name, arch)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/airflow-provider-tpu-rl``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airflow-provider-tpu-rl"


def bundle_root(cache_dir: Path, version: str, plat: BundlePlatform) -> Path:
    """``<cache_dir>/cluster-toolkit/<version>/<os>_<arch>``: the extracted bundle."""
    return Path(cache_dir) / "cluster-toolkit" / version / plat.key


def expected_sha256(sha256: str | Mapping[str, str] | None, plat: BundlePlatform) -> str | None:
    """The checksum for ``plat``: a plain string, or a mapping keyed ``linux_amd64`` etc."""
    if sha256 is None:
        return None
    value = sha256.get(plat.key) if isinstance(sha256, Mapping) else sha256
    if not value:
        return None
    value = value.strip().lower().removeprefix("sha256:")
    if not _SHA256_RE.match(value):
        raise ConfigurationError(f"sha256 for {plat.asset_name} is not 64 hex digits: {value!r}")
    return value


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``path``, held for the block (blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_bundle(
    *,
    version: str,
    cache_dir: Path,
    sha256: str | Mapping[str, str] | None,
    base_url: str | None = None,
    plat: BundlePlatform | None = None,
    timeout: float = 300.0,
) -> Path:
    """The bundle root for ``version`` (holding ``gcluster`` and ``examples/``), downloading it once.

    Another process installing the same bundle is waited for (file lock), then its result is used.
    Raises :class:`ConfigurationError` when no checksum is configured, the checksum does not match,
    or the release cannot be reached (offline); a retryable :class:`CommandError` for an HTTP 429/5xx.
    """
    plat = plat or current_platform()
    root = bundle_root(cache_dir, version, plat)
    if (root / "gcluster").is_file():
        return root
    digest = expected_sha256(sha256, plat)
    url = f"{(base_url or RELEASE_BASE_URL).rstrip('/')}/{version}/{plat.asset_name}"
    if digest is None:
        raise ConfigurationError(
            f"refusing to download an unverified Cluster Toolkit bundle {url}: Cluster Toolkit publishes no "
            f"checksum file, so set the connection extra sha256 (the SHA-256 of {plat.asset_name}), "
            f"or set gcluster_path to an installed gcluster, or extract the bundle to {root}"
        )
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(
            f"cannot create the Cluster Toolkit cache folder {root.parent}: {err}; set cache_dir or gcluster_path"
        ) from err
    with _file_lock(root.parent / f".{plat.key}.lock"):
        if (root / "gcluster").is_file():  # installed by another process while we waited
            return root
        staging = Path(tempfile.mkdtemp(prefix=f".{plat.key}.partial-", dir=root.parent))
        try:
            archive = staging / plat.asset_name
            _download(url, archive, digest, version=version, root=root, timeout=timeout)
            extracted = _extract(archive, staging / "extract")
            if root.exists():  # a broken earlier install (no gcluster in it)
                shutil.rmtree(root)
            os.replace(extracted, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("Installed Cluster Toolkit %s (%s) into %s", version, plat.key, root)
    return root


def _download(url: str, target: Path, digest: str, *, version: str, root: Path, timeout: float) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("https", "http", "file"):
        raise ConfigurationError(f"unsupported bundle URL scheme {scheme!r} in {url}")
    hasher = hashlib.sha256()
    log.info("Downloading Cluster Toolkit %s from %s", version, url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(target, "wb") as out:  # noqa: S310
            while chunk := response.read(_CHUNK):
                hasher.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as err:
        if err.code == 429 or err.code >= 500:
            raise CommandError(
                f"cannot download Cluster Toolkit {version} from {url}: HTTP {err.code}",
                FailureKind.TRANSIENT,
            ) from err
        raise ConfigurationError(
            f"cannot download Cluster Toolkit {version} from {url}: HTTP {err.code} {err.reason}; "
            "check the version and download_base_url, or set gcluster_path"
        ) from err
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigurationError(
            f"cannot download Cluster Toolkit {version} from {url} ({reason}): this worker seems to be "
            f"offline; set gcluster_path in the gcluster connection to an installed gcluster (and "
            f"bundle_dir to its folder), or extract the bundle to {root}"
        ) from err
    actual = hasher.hexdigest()
    if actual != digest:
        raise ConfigurationError(
            f"checksum mismatch for {url}: expected sha256 {digest}, got {actual}; refusing the bundle"
        )


def _extract(archive: Path, dest: Path) -> Path:
    """Extract with tarfile's ``data`` filter (no absolute paths, ``..``, devices, links out)."""
    import tarfile

    dest.mkdir()
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise ConfigurationError(f"cannot extract Cluster Toolkit bundle {archive.name}: {err}") from err
    root = dest
    if not (root / "gcluster").is_file():
        children = [p for p in dest.iterdir() if p.is_dir()]
        if len(children) == 1 and (children[0] / "gcluster").is_file():
            root = children[0]
        else:
            raise ConfigurationError(f"bundle {archive.name} has no gcluster binary at its root")
    binary = root / "gcluster"
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IRUSR)
    if not (root / "examples").is_dir():
        log.warning("Cluster Toolkit bundle %s has no examples/ folder", archive.name)
    return root
