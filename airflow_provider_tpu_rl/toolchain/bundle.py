"""Find or install the Cluster Toolkit release bundle (the ``gcluster`` binary and ``examples/``).

The release publishes ``gcluster_bundle_<linux|mac>_<amd64|arm64>.tgz`` per tag (README,
"Using the Pre-built Bundle"); the archive holds ``gcluster`` and ``examples/`` at its root. The
release has no checksum file to check against, so a download is verified against the SHA-256 the
connection gives, and refused without one. Installs are atomic and serialised across processes.

The downloaded archive is kept in ``<root>/.install/`` with a record of its SHA-256; before every
use the kept archive is checked against that SHA-256 (and the configured one) and the cached
``gcluster`` against the archive's own member, so a tampered or corrupted binary is repaired from
the archive (or refused), never run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind

log = logging.getLogger(__name__)

RELEASE_BASE_URL = "https://github.com/GoogleCloudPlatform/cluster-toolkit/releases/download"
INSTALL_DIR = ".install"
INSTALL_RECORD = "install.json"
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


def normalise_sha256(sha256: str | Mapping[str, str] | None, key: str, what: str) -> str | None:
    """The checksum for platform ``key``: a plain string, or a mapping keyed ``linux_amd64`` etc."""
    if sha256 is None:
        return None
    value = sha256.get(key) if isinstance(sha256, Mapping) else sha256
    if not value:
        return None
    value = str(value).strip().lower().removeprefix("sha256:")
    if not _SHA256_RE.match(value):
        raise ConfigurationError(f"sha256 for {what} is not 64 hex digits: {value!r}")
    return value


def expected_sha256(sha256: str | Mapping[str, str] | None, plat: BundlePlatform) -> str | None:
    """The bundle checksum for ``plat`` (see :func:`normalise_sha256`)."""
    return normalise_sha256(sha256, plat.key, plat.asset_name)


def sha256_of(handle: IO[bytes]) -> str:
    """The SHA-256 of everything left in ``handle``."""
    hasher = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        hasher.update(chunk)
    return hasher.hexdigest()


def sha256_file(path: Path) -> str:
    """The SHA-256 of the file at ``path``."""
    with open(path, "rb") as handle:
        return sha256_of(handle)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``path``, held for the block (blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def download_verified(
    url: str,
    target: Path,
    digest: str,
    *,
    what: str,
    advice: str,
    timeout: float,
) -> None:
    """Download ``url`` to ``target`` and check its SHA-256 against ``digest``.

    ``what`` names the download in messages ("Cluster Toolkit v1.103.0"), ``advice`` says what to
    do when it cannot be fetched. A 429/5xx is a transient :class:`CommandError`; anything else
    (offline, 404, checksum mismatch) a :class:`ConfigurationError`.
    """
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("https", "http", "file"):
        raise ConfigurationError(f"unsupported download URL scheme {scheme!r} in {url}")
    hasher = hashlib.sha256()
    log.info("Downloading %s from %s", what, url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(target, "wb") as out:  # noqa: S310
            while chunk := response.read(_CHUNK):
                hasher.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as err:
        if err.code == 429 or err.code >= 500:
            raise CommandError(
                f"cannot download {what} from {url}: HTTP {err.code}", FailureKind.TRANSIENT
            ) from err
        raise ConfigurationError(
            f"cannot download {what} from {url}: HTTP {err.code} {err.reason}; {advice}"
        ) from err
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise ConfigurationError(
            f"cannot download {what} from {url} ({reason}): this worker seems to be offline; {advice}"
        ) from err
    actual = hasher.hexdigest()
    if actual != digest:
        raise ConfigurationError(
            f"checksum mismatch for {url}: expected sha256 {digest}, got {actual}; refusing {what}"
        )


def _record_path(root: Path) -> Path:
    return root / INSTALL_DIR / INSTALL_RECORD


def _read_record(root: Path) -> dict[str, str] | None:
    try:
        record = json.loads(_record_path(root).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not all(
        isinstance(record.get(k), str) for k in ("archive", "archive_sha256", "member")
    ):
        return None
    return record


def _member_sha256(archive: Path, member: str) -> str | None:
    """The SHA-256 of ``member`` inside the tar ``archive`` (``None`` when it has none)."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            info = tar.getmember(member)
            handle = tar.extractfile(info)
            if handle is None:
                return None
            with handle:
                return sha256_of(handle)
    except (KeyError, tarfile.TarError, OSError):
        return None


def verify_bundle(root: Path, digest: str | None) -> str | None:
    """Why the cached bundle at ``root`` cannot be trusted, or ``None`` when it checks out.

    The kept archive must match ``digest`` (the configured SHA-256; else the one recorded at
    install) and ``gcluster`` must be byte-identical to the archive's member.
    """
    record = _read_record(root)
    if record is None:
        return f"no install record in {root / INSTALL_DIR}"
    if digest is not None and record["archive_sha256"] != digest:
        return f"it was installed from an archive with sha256 {record['archive_sha256']}, not {digest}"
    archive = root / INSTALL_DIR / Path(record["archive"]).name
    try:
        actual = sha256_file(archive)
    except OSError as err:
        return f"its kept archive {archive} cannot be read ({err.strerror})"
    if actual != record["archive_sha256"]:
        return f"its kept archive {archive.name} has sha256 {actual}, expected {record['archive_sha256']}"
    wanted = _member_sha256(archive, record["member"])
    try:
        have = sha256_file(root / "gcluster")
    except OSError as err:
        return f"{root / 'gcluster'} cannot be read ({err.strerror})"
    if wanted is None or have != wanted:
        return f"{root / 'gcluster'} (sha256 {have}) differs from the gcluster in its verified archive"
    return None


def ensure_bundle(
    *,
    version: str,
    cache_dir: Path,
    sha256: str | Mapping[str, str] | None,
    base_url: str | None = None,
    plat: BundlePlatform | None = None,
    timeout: float = 300.0,
    download: bool = True,
) -> Path:
    """The bundle root for ``version`` (holding ``gcluster`` and ``examples/``), downloading it once.

    A cached bundle is re-verified first (:func:`verify_bundle`): a tampered ``gcluster`` is
    re-extracted from the verified kept archive, or downloaded again, or refused. Another process
    installing the same bundle is waited for (file lock). ``download=False`` (the triggerer) never
    touches the network. Raises :class:`ConfigurationError` when no checksum is configured, the
    checksum does not match, or the release cannot be reached (offline); a retryable
    :class:`CommandError` for an HTTP 429/5xx.
    """
    plat = plat or current_platform()
    root = bundle_root(cache_dir, version, plat)
    digest = expected_sha256(sha256, plat)
    if (root / "gcluster").is_file():
        problem = verify_bundle(root, digest)
        if problem is None:
            return root
        if _read_record(root) is None and (digest is None or not download):
            # Extracted by hand (or by an older provider): nothing to verify against.
            log.warning("Using the Cluster Toolkit bundle in %s unverified: %s", root, problem)
            return root
        log.warning("The cached Cluster Toolkit bundle in %s is not trusted: %s", root, problem)
    url = f"{(base_url or RELEASE_BASE_URL).rstrip('/')}/{version}/{plat.asset_name}"
    if not download and not root.exists():
        raise ConfigurationError(_not_cached(version, root))
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(
            f"cannot create the Cluster Toolkit cache folder {root.parent}: {err}; set cache_dir or gcluster_path"
        ) from err
    with file_lock(root.parent / f".{plat.key}.lock"):
        installed = (root / "gcluster").is_file()
        problem = verify_bundle(root, digest) if installed else None
        if installed and problem is None:  # installed (or repaired) by another process while we waited
            return root
        if _repair_from_kept_archive(root, digest, plat):
            return root
        if not download:
            if installed:
                raise ConfigurationError(
                    f"refusing the cached Cluster Toolkit {version} in {root}: {problem}; this process does "
                    "not download (the triggerer never does): run any gcluster task on a worker to "
                    "reinstall it, or set gcluster_path"
                )
            raise ConfigurationError(_not_cached(version, root))
        if digest is None:
            why = f"the cached bundle in {root} failed verification ({problem}); " if installed else ""
            raise ConfigurationError(
                f"refusing to download an unverified Cluster Toolkit bundle {url}: {why}Cluster Toolkit "
                f"publishes no checksum file, so set the connection extra sha256 (the SHA-256 of "
                f"{plat.asset_name}), or set gcluster_path to an installed gcluster, or extract the bundle to {root}"
            )
        staging = Path(tempfile.mkdtemp(prefix=f".{plat.key}.partial-", dir=root.parent))
        try:
            archive = staging / plat.asset_name
            download_verified(
                url,
                archive,
                digest,
                what=f"Cluster Toolkit {version}",
                advice=(
                    f"check the version and download_base_url, or set gcluster_path in the gcluster connection "
                    f"to an installed gcluster (and bundle_dir to its folder), or extract the bundle to {root}"
                ),
                timeout=timeout,
            )
            _install_archive(archive, digest, staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("Installed Cluster Toolkit %s (%s) into %s", version, plat.key, root)
    return root


def _not_cached(version: str, root: Path) -> str:
    return (
        f"Cluster Toolkit {version} is not in the cache ({root}) and this call may not download it "
        "(`tpu-rl doctor --no-install` never does): run `tpu-rl doctor` on this "
        "worker, or set gcluster_path"
    )


def _repair_from_kept_archive(root: Path, digest: str | None, plat: BundlePlatform) -> bool:
    """Re-extract the bundle from its kept archive when that archive still verifies (no download)."""
    record = _read_record(root)
    if record is None or (digest is not None and record["archive_sha256"] != digest):
        return False
    kept = root / INSTALL_DIR / Path(record["archive"]).name
    try:
        if sha256_file(kept) != record["archive_sha256"]:
            return False
    except OSError:
        return False
    staging = Path(tempfile.mkdtemp(prefix=f".{plat.key}.partial-", dir=root.parent))
    try:
        archive = Path(shutil.copy2(kept, staging / kept.name))
        _install_archive(archive, record["archive_sha256"], staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.warning("Re-extracted the Cluster Toolkit bundle into %s from its verified archive", root)
    return verify_bundle(root, digest) is None


def _install_archive(archive: Path, digest: str, staging: Path, root: Path) -> None:
    """Extract the verified ``archive`` in ``staging``, keep it in ``.install/``, swap it into ``root``."""
    extracted, member = _extract(archive, staging / "extract")
    keep = extracted / INSTALL_DIR
    keep.mkdir(exist_ok=True)
    os.replace(archive, keep / archive.name)
    (keep / INSTALL_RECORD).write_text(
        json.dumps({"archive": archive.name, "archive_sha256": digest, "member": member})
    )
    if root.exists():  # a broken or tampered earlier install
        shutil.rmtree(root)
    os.replace(extracted, root)


def _extract(archive: Path, dest: Path) -> tuple[Path, str]:
    """Extract with tarfile's ``data`` filter (no absolute paths, ``..``, devices, links out).

    Returns the bundle root and the archive member name of its ``gcluster``.
    """
    dest.mkdir()
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as err:
        raise ConfigurationError(f"cannot extract Cluster Toolkit bundle {archive.name}: {err}") from err
    root = dest
    member = "gcluster"
    if not (root / "gcluster").is_file():
        children = [p for p in dest.iterdir() if p.is_dir()]
        if len(children) == 1 and (children[0] / "gcluster").is_file():
            root = children[0]
            member = f"{root.name}/gcluster"
        else:
            raise ConfigurationError(f"bundle {archive.name} has no gcluster binary at its root")
    if _member_sha256(archive, member) is None:  # e.g. stored as "./gcluster"
        with tarfile.open(archive, "r:*") as tar:
            names = [n for n in tar.getnames() if n.removeprefix("./") == member]
        member = names[0] if names else member
    binary = root / "gcluster"
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IRUSR)
    if not (root / "examples").is_dir():
        log.warning("Cluster Toolkit bundle %s has no examples/ folder", archive.name)
    return root, member
