"""gcluster's job prerequisite check, kept between a worker's job sessions.

``gcluster job submit`` checks its prerequisites (cluster-toolkit ``cmd/job/prereq.go``: gcloud's
active account, Application Default Credentials and a token, ``kubectl``,
``gke-gcloud-auth-plugin``, the Docker credential helpers, ``gcloud services list`` for the
Artifact Registry API) unless ``$HOME/.gcluster/job_prereq_state.json`` says they passed for the
same project less than 24 hours ago. The hook gives every task's job session a fresh HOME, so each
submit paid for the whole check: several gcloud calls and a token fetch, seconds of worker time.

The state file gcluster wrote after a check that passed is kept here, under a key derived from
what the check reads in gcluster's environment (:func:`environment_key`: PATH, which finds the
tools; gcloud's config, account and impersonation; the ADC file; Docker's config; the proxy and CA
settings), and put into the next session's HOME when those are the same, for
:data:`REUSE_SECONDS` after the check. gcluster still reads it by its own rule
(project and age); preflight checks the same things once per run. Nothing secret is stored: the
file holds booleans, the project id and a timestamp, and the key is a digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

STATE_FILE = Path(".gcluster") / "job_prereq_state.json"  # cmd/job/prereq.go, relative to HOME
REUSE_SECONDS = 3600.0  # gcluster itself trusts a check for 24 h; a worker re-checks every hour
# What cmd/job/prereq.go's checks depend on: the tools PATH finds, gcloud's configuration (its
# account, project, impersonation), golang/oauth2's ADC search, Docker's credential config, and how
# the API calls reach Google (proxies, CA bundles).
_CHECKED_VARIABLES = frozenset(
    {
        "PATH",
        "DOCKER_CONFIG",
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "NO_PROXY",
        "https_proxy",
        "http_proxy",
        "no_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
_CHECKED_PREFIXES = ("CLOUDSDK_", "GOOGLE_", "GCE_METADATA_")


def store_dir() -> Path:
    """This user's folder of kept state files (in the temp folder, mode 0700)."""
    return Path(tempfile.gettempdir()) / f"tpu-rl-gcluster-prereqs-{os.getuid()}"


def environment_key(env: Mapping[str, str]) -> str:
    """A digest of the part of gcluster's environment its prerequisite check depends on."""
    stable = {
        name: value
        for name, value in env.items()
        if name in _CHECKED_VARIABLES or name.startswith(_CHECKED_PREFIXES)
    }
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:40]


def _own_store() -> Path | None:
    """The store, created if missing; ``None`` if it is not a folder owned by this user alone."""
    folder = store_dir()
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return folder


def seed(home: Path, env: Mapping[str, str], *, now: float | None = None) -> bool:
    """Put the kept state for ``env`` into ``home`` if it is recent and ``home`` has none yet."""
    target = home / STATE_FILE
    folder = _own_store()
    if folder is None or target.exists():
        return False
    kept = folder / f"{environment_key(env)}.json"
    try:
        if (time.time() if now is None else now) - kept.stat().st_mtime >= REUSE_SECONDS:
            return False
        content = kept.read_bytes()
    except OSError:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    return True


def keep(home: Path, env: Mapping[str, str]) -> bool:
    """Keep the state gcluster wrote in ``home`` for later sessions with ``env``; True if it was
    new (a check ran and passed), False if there was none or it is the one already kept."""
    written = home / STATE_FILE
    folder = _own_store()
    if folder is None:
        return False
    try:
        content = written.read_bytes()
    except OSError:
        return False
    kept = folder / f"{environment_key(env)}.json"
    with contextlib.suppress(OSError):
        if kept.read_bytes() == content:
            return False  # the seeded file, unchanged: its age stays that of the check
    fd, partial = tempfile.mkstemp(dir=folder, prefix=".state.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(partial, kept)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        return False
    return True


__all__ = ["REUSE_SECONDS", "STATE_FILE", "environment_key", "keep", "seed", "store_dir"]
