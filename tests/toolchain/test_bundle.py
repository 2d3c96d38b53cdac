"""Cluster Toolkit bundle install: verified download (file:// and a local HTTP server), once, safely."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook
from airflow_provider_tpu_rl.toolchain.bundle import (
    BundlePlatform,
    bundle_root,
    current_platform,
    ensure_bundle,
    verify_bundle,
)

VERSION = "v1.103.0"
PLAT = BundlePlatform("linux", "amd64")


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def build_bundle(path: Path, *, prefix: str = "", extra: tuple[tuple[str, bytes], ...] = ()) -> str:
    """A tgz shaped like the release bundle; returns its SHA-256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        _add(tar, f"{prefix}gcluster", b"#!/bin/sh\necho gcluster version v1.103.0\n", 0o755)
        _add(tar, f"{prefix}examples/gke-tpu-v6e/gke-tpu-v6e-advanced.yaml", b"blueprint_name: x\n")
        for name, data in extra:
            _add(tar, name, data)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, str]:
    """A release folder laid out as <base>/<version>/<asset>; returns (base, sha256)."""
    asset_dir = tmp_path / "release" / VERSION
    asset_dir.mkdir(parents=True)
    digest = build_bundle(asset_dir / PLAT.asset_name)
    return tmp_path / "release", digest


class _CountingServer:
    def __init__(self, root: Path, status: int = 200) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self):
                outer.requests.append(self.path)
                if status != 200:
                    self.send_error(status)
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> _CountingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served(release) -> Iterator[tuple[_CountingServer, str]]:
    base, digest = release
    with _CountingServer(base) as server:
        yield server, digest


def test_install_from_file_url(tmp_path, release):
    base, digest = release
    root = ensure_bundle(
        version=VERSION, cache_dir=tmp_path / "cache", sha256=digest, base_url=base.as_uri(), plat=PLAT
    )
    assert root == bundle_root(tmp_path / "cache", VERSION, PLAT)
    assert root == tmp_path / "cache" / "cluster-toolkit" / VERSION / "linux_amd64"
    assert (root / "gcluster").stat().st_mode & 0o100
    assert (root / "examples" / "gke-tpu-v6e" / "gke-tpu-v6e-advanced.yaml").is_file()
    assert [p.name for p in root.parent.iterdir() if "partial" in p.name] == []


def test_download_happens_once_even_with_concurrent_installs(tmp_path, served):
    server, digest = served
    cache = tmp_path / "cache"
    results: list[Path] = []
    errors: list[BaseException] = []

    def install() -> None:
        try:
            results.append(
                ensure_bundle(version=VERSION, cache_dir=cache, sha256=digest, base_url=server.url, plat=PLAT)
            )
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=install) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(results) == 4
    assert len(set(results)) == 1
    assert server.requests == [f"/{VERSION}/{PLAT.asset_name}"]
    # And a later call uses the cache without the network.
    ensure_bundle(version=VERSION, cache_dir=cache, sha256=None, base_url="http://127.0.0.1:9/", plat=PLAT)
    assert len(server.requests) == 1


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path, served):
    server, _ = served
    with pytest.raises(ConfigurationError, match="checksum mismatch"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "cache", sha256="0" * 64, base_url=server.url, plat=PLAT
        )
    version_dir = tmp_path / "cache" / "cluster-toolkit" / VERSION
    assert sorted(p.name for p in version_dir.iterdir()) == [".linux_amd64.lock"]


def test_no_checksum_means_no_download(tmp_path, served):
    server, _ = served
    with pytest.raises(ConfigurationError, match="unverified") as info:
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "cache", sha256=None, base_url=server.url, plat=PLAT
        )
    assert "sha256" in str(info.value)
    assert server.requests == []


def test_per_platform_checksums(tmp_path, release):
    base, digest = release
    root = ensure_bundle(
        version=VERSION,
        cache_dir=tmp_path / "cache",
        sha256={"linux_amd64": digest, "mac_arm64": "f" * 64},
        base_url=base.as_uri(),
        plat=PLAT,
    )
    assert (root / "gcluster").is_file()


def test_offline_gives_a_clear_failure(tmp_path):
    with socket.socket() as sock:  # a port on which nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigurationError) as info:
        ensure_bundle(
            version=VERSION,
            cache_dir=tmp_path / "c",
            sha256="a" * 64,
            base_url=f"http://127.0.0.1:{port}",
            plat=PLAT,
        )
    message = str(info.value)
    assert not isinstance(info.value, AirflowFailException)
    assert "cannot download Cluster Toolkit v1.103.0" in message
    assert "gcluster_path" in message


def test_http_5xx_is_transient_and_404_is_a_configuration_error(tmp_path, release):
    base, digest = release
    with _CountingServer(base, status=503) as server, pytest.raises(CommandError) as info:
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "c", sha256=digest, base_url=server.url, plat=PLAT
        )
    assert info.value.kind is FailureKind.TRANSIENT
    assert info.value.retryable
    with _CountingServer(base, status=404) as server, pytest.raises(ConfigurationError, match="HTTP 404"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "c", sha256=digest, base_url=server.url, plat=PLAT
        )


def test_tar_members_escaping_the_folder_are_refused(tmp_path):
    asset_dir = tmp_path / "rel" / VERSION
    asset_dir.mkdir(parents=True)
    digest = build_bundle(asset_dir / PLAT.asset_name, extra=(("../../evil.txt", b"pwned"),))
    with pytest.raises(ConfigurationError, match="cannot extract"):
        ensure_bundle(
            version=VERSION,
            cache_dir=tmp_path / "cache",
            sha256=digest,
            base_url=(tmp_path / "rel").as_uri(),
            plat=PLAT,
        )
    assert not any(p.name == "evil.txt" for p in tmp_path.rglob("evil.txt"))
    assert not (bundle_root(tmp_path / "cache", VERSION, PLAT) / "gcluster").exists()


def test_bundle_with_a_top_level_folder(tmp_path):
    asset_dir = tmp_path / "rel" / VERSION
    asset_dir.mkdir(parents=True)
    digest = build_bundle(asset_dir / PLAT.asset_name, prefix="cluster-toolkit/")
    root = ensure_bundle(
        version=VERSION,
        cache_dir=tmp_path / "cache",
        sha256=digest,
        base_url=(tmp_path / "rel").as_uri(),
        plat=PLAT,
    )
    assert (root / "gcluster").is_file()
    assert (root / "examples").is_dir()


def test_bad_checksum_format(tmp_path):
    with pytest.raises(ConfigurationError, match="64 hex"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path, sha256="abc", base_url="file:///nowhere", plat=PLAT
        )


@pytest.mark.parametrize(
    ("system", "machine", "key"),
    [
        ("linux", "x86_64", "linux_amd64"),
        ("linux", "aarch64", "linux_arm64"),
        ("darwin", "arm64", "mac_arm64"),
        ("darwin", "x86_64", "mac_amd64"),
    ],
)
def test_current_platform(system, machine, key):
    assert current_platform(system, machine).key == key
    assert current_platform(system, machine).asset_name == f"gcluster_bundle_{key}.tgz"


@pytest.mark.parametrize(("system", "machine"), [("win32", "x86_64"), ("linux", "riscv64")])
def test_unsupported_platform(system, machine):
    with pytest.raises(ConfigurationError, match="set gcluster_path"):
        current_platform(system, machine)


def test_hook_resolves_gcluster_and_bundle_dir_from_the_cache(tmp_path, release, monkeypatch):
    base, digest = release
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.bundle.current_platform", lambda: PLAT)
    hook = GclusterHook(
        config=GclusterConfig(
            cache_dir=str(tmp_path / "cache"), sha256=digest, download_base_url=base.as_uri()
        )
    )
    root = bundle_root(tmp_path / "cache", VERSION, PLAT)
    assert hook.tool_path("gcluster") == str(root / "gcluster")
    assert hook.bundle_dir() == root


def test_hook_bundle_dir_next_to_gcluster_path(tmp_path):
    (tmp_path / "examples").mkdir()
    binary = tmp_path / "gcluster"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert GclusterHook(config=GclusterConfig(gcluster_path=str(binary))).bundle_dir() == tmp_path
    assert GclusterHook(
        config=GclusterConfig(gcluster_path=str(binary), bundle_dir="/b")
    ).bundle_dir() == Path("/b")


def test_unwritable_cache_is_a_clear_failure(tmp_path):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="cannot create the Cluster Toolkit cache folder"):
        ensure_bundle(version=VERSION, cache_dir=blocker, sha256="a" * 64, base_url="file:///x", plat=PLAT)


# ------------------------------------------------------------------ re-verification before each use
def _install(tmp_path: Path, server: _CountingServer, digest: str) -> Path:
    return ensure_bundle(
        version=VERSION, cache_dir=tmp_path / "cache", sha256=digest, base_url=server.url, plat=PLAT
    )


def test_the_archive_is_kept_with_a_record(tmp_path, served):
    server, digest = served
    root = _install(tmp_path, server, digest)
    kept = root / ".install" / PLAT.asset_name
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == digest
    assert verify_bundle(root, digest) is None
    assert verify_bundle(root, "1" * 64) is not None  # the configured checksum changed


def test_a_tampered_cached_gcluster_is_repaired_from_the_kept_archive(tmp_path, served):
    server, digest = served
    root = _install(tmp_path, server, digest)
    original = (root / "gcluster").read_bytes()
    (root / "gcluster").write_text("#!/bin/sh\necho evil\n")
    assert "differs" in (verify_bundle(root, digest) or "")
    again = ensure_bundle(
        version=VERSION, cache_dir=tmp_path / "cache", sha256=None, base_url="http://127.0.0.1:9/", plat=PLAT
    )
    assert again == root
    assert (root / "gcluster").read_bytes() == original
    assert len(server.requests) == 1  # no download: the kept archive still verifies


def test_a_tampered_archive_is_refused_offline_and_downloaded_again_online(tmp_path, served):
    server, digest = served
    root = _install(tmp_path, server, digest)
    build_bundle(root / ".install" / PLAT.asset_name, extra=(("evil", b"x"),))
    (root / "gcluster").write_text("#!/bin/sh\necho evil\n")
    with pytest.raises(ConfigurationError, match="refusing the cached Cluster Toolkit"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "cache", sha256=digest, base_url=server.url, plat=PLAT,
            download=False,
        )  # fmt: skip
    assert len(server.requests) == 1
    with pytest.raises(ConfigurationError, match="refusing to download an unverified"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "cache", sha256=None, base_url=server.url, plat=PLAT
        )
    root = _install(tmp_path, server, digest)
    assert len(server.requests) == 2
    assert b"evil" not in (root / "gcluster").read_bytes()
    assert verify_bundle(root, digest) is None


def test_the_hook_re_verifies_the_cached_gcluster_on_every_use(tmp_path, served, monkeypatch):
    server, digest = served
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.bundle.current_platform", lambda: PLAT)
    hook = GclusterHook(
        config=GclusterConfig(cache_dir=str(tmp_path / "cache"), sha256=digest, download_base_url=server.url)
    )
    path = Path(hook.tool_path("gcluster"))
    original = path.read_bytes()
    path.write_text("#!/bin/sh\necho evil\n")
    assert hook.tool_path("gcluster") == str(path)
    assert path.read_bytes() == original
    assert len(server.requests) == 1


def test_a_hand_extracted_bundle_without_a_checksum_is_used_unverified(tmp_path):
    root = bundle_root(tmp_path / "cache", VERSION, PLAT)
    root.mkdir(parents=True)
    (root / "gcluster").write_text("#!/bin/sh\n")
    assert ensure_bundle(version=VERSION, cache_dir=tmp_path / "cache", sha256=None, plat=PLAT) == root


def test_not_cached_and_no_download_is_refused(tmp_path, served):
    server, digest = served
    with pytest.raises(ConfigurationError, match="may not download"):
        ensure_bundle(
            version=VERSION, cache_dir=tmp_path / "cache", sha256=digest, base_url=server.url, plat=PLAT,
            download=False,
        )  # fmt: skip
    assert server.requests == []
