"""The pinned, verified toolchain: PATH rules, verified installs from a local server, tamper checks,
and the hook refusing a gcluster command (in one line, before any process) when a tool is missing."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.hooks.gcluster import GclusterConfig, GclusterHook, command_purpose
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.toolchain import tools as tc
from airflow_provider_tpu_rl.toolchain.process import prepare_process
from tests.support.toolpath import path_without
from tests.toolchain.test_bundle import _CountingServer
from tpu_rl_sandbox.clis.tool_stubs import stub_script, write_tool_stubs

PLAT = tc.hashicorp_platform()
GUARD = 30.0


def make_zip(path: Path, tool: str, version: str) -> str:
    """A HashiCorp-shaped release zip (the executable + LICENSE.txt) holding a sandbox stub."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        info = zipfile.ZipInfo(tool)
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(info, stub_script(tool, terraform_version=version, packer_version=version))
        zf.writestr("LICENSE.txt", "license\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """``<base>/<tool>/<version>/<tool>_<version>_<os>_<arch>.zip`` for terraform and packer."""
    base = tmp_path / "hashicorp"
    digests = {}
    for tool, version in (("terraform", tc.TERRAFORM_VERSION), ("packer", tc.PACKER_VERSION)):
        digests[tool] = make_zip(base / tool / version / f"{tool}_{version}_{PLAT}.zip", tool, version)
    return base, digests


@pytest.fixture
def served(release: tuple[Path, dict[str, str]]) -> Iterator[tuple[_CountingServer, dict[str, str]]]:
    base, digests = release
    with _CountingServer(base) as server:
        yield server, digests


def stub_path(tmp_path: Path, *, hide: tuple[str, ...] = (), **versions: str) -> str:
    """A PATH: sandbox stubs (minus ``hide``) first, then the host's PATH with ``hide`` and the
    stubbed tools removed (the host has a real terraform 1.11.4, kubectl, the auth plugin)."""
    stubs = tmp_path / "stubs"
    tools = [t for t in ("terraform", "packer", "kubectl", "gke-gcloud-auth-plugin") if t not in hide]
    write_tool_stubs(stubs, tools=tools, **versions)
    rest = path_without(
        ["terraform", "packer", "kubectl", "gke-gcloud-auth-plugin", *hide], tmp_path / "hidden"
    )
    return f"{stubs}{os.pathsep}{rest}"


def fake_gcluster(install: bool) -> tuple[str, str]:
    return "/opt/gcluster", "connection"


def resolve(purpose: str, tmp_path: Path, path: str, **kw: Any) -> tc.Toolchain:
    kw.setdefault("install", False)
    return tc.resolve_toolchain(
        purpose, cache_dir=tmp_path / "cache", gcluster=fake_gcluster, path=path, probe=False, **kw
    )


# ----------------------------------------------------------------------------------- version rules
@pytest.mark.parametrize(
    ("found", "minimum", "ok"),
    [
        ("1.12.2", "1.12.2", True),
        ("1.13.0", "1.12.2", True),
        ("v1.12.10", "1.12.2", True),
        ("1.11.4", "1.12.2", False),
        ("1.12.2-beta1", "1.12.2", False),
        ("1.12", "1.12.0", True),
        ("garbage", "1.12.2", False),
    ],
)
def test_version_rule_is_gclusters(found: str, minimum: str, ok: bool) -> None:
    assert tc.version_at_least(found, minimum) is ok


def test_old_terraform_on_path_is_refused(tmp_path: Path) -> None:
    chain = resolve("deploy", tmp_path, stub_path(tmp_path, terraform_version="1.11.4"))
    status = chain.status("terraform")
    assert not status.ok
    assert status.version == "1.11.4"
    assert status.source == "missing"
    assert not chain.ok
    line = chain.problem_line()
    assert line.startswith("deploy needs terraform >= 1.12.2 (")
    assert "1.11.4, older" in line
    assert "install_tools" in line
    assert "packer" not in line  # the packer stub is there


@pytest.mark.parametrize("version", ["1.12.2", "1.13.1"])
def test_good_terraform_is_taken_from_path(tmp_path: Path, version: str) -> None:
    path = stub_path(tmp_path, terraform_version=version)
    chain = resolve("deploy", tmp_path, path)
    status = chain.status("terraform")
    assert (status.ok, status.source, status.version) == (True, "PATH", version)
    assert status.path == str(tmp_path / "stubs" / "terraform")
    assert chain.ok, chain.problem_line()
    assert chain.bin_dirs == ()  # nothing from the cache: PATH is left as it is
    assert chain.env["TF_PLUGIN_CACHE_DIR"] == str(tmp_path / "cache" / "terraform-plugins")
    assert (tmp_path / "cache" / "terraform-plugins").is_dir()


def test_a_gcloud_path_off_path_puts_its_folder_first(tmp_path: Path) -> None:
    """gcluster runs `gcloud` by name: the configured one's folder is searched (and prepended)."""
    sdk = tmp_path / "sdk" / "bin"
    write_tool_stubs(sdk, tools=["kubectl", "gke-gcloud-auth-plugin"])
    gcloud = sdk / "gcloud"
    gcloud.write_text('#!/bin/sh\necho \'{"Google Cloud SDK": "528.0.0"}\'\n')
    gcloud.chmod(0o755)
    path = path_without(["gcloud", "kubectl", "gke-gcloud-auth-plugin"], tmp_path / "bare")
    chain = resolve("jobs", tmp_path, path, gcloud_path=str(gcloud))
    assert chain.ok, chain.problem_line()
    assert chain.status("gcloud").source == "connection"
    assert chain.status("kubectl").path == str(sdk / "kubectl")
    assert chain.bin_dirs == (str(sdk),)
    # The same gcloud reachable on PATH: nothing to prepend.
    on_path = resolve("jobs", tmp_path, f"{sdk}{os.pathsep}{path}", gcloud_path=str(gcloud))
    assert on_path.status("gcloud").source == "PATH"
    assert on_path.bin_dirs == ()


def test_packer_on_path_is_enough_like_gcluster(tmp_path: Path) -> None:
    chain = resolve("deploy", tmp_path, stub_path(tmp_path, packer_version="1.9.0"))
    assert chain.status("packer").ok
    assert chain.status("packer").version == "1.9.0"


def test_problem_line_names_every_missing_tool_in_one_line(tmp_path: Path) -> None:
    path = stub_path(tmp_path, hide=("packer", "kubectl"))
    deploy = resolve("deploy", tmp_path, path)
    assert deploy.problem_line() == (
        "deploy needs packer (not on PATH; set install_tools=true or add packer to PATH)"
    )
    jobs = resolve("jobs", tmp_path, path)
    assert "\n" not in jobs.problem_line()
    assert jobs.problem_line().startswith("jobs needs kubectl (not on PATH; install kubectl")
    assert resolve("tpu_vm", tmp_path, path).problem_line() == ""


def test_a_failing_version_query_is_a_missing_tool(tmp_path: Path) -> None:
    path = stub_path(tmp_path)
    broken = tmp_path / "stubs" / "gke-gcloud-auth-plugin"
    broken.write_text("#!/bin/sh\necho 'plugin broken' >&2\nexit 3\n")
    chain = resolve("jobs", tmp_path, path)
    status = chain.status("gke-gcloud-auth-plugin")
    assert not status.ok
    assert "exited 3: plugin broken" in status.advice


# ------------------------------------------------------------------------------ verified installs
def test_download_from_a_server_is_verified_cached_and_reused(tmp_path: Path, served: Any) -> None:
    server, digests = served
    path = stub_path(tmp_path, terraform_version="1.11.4", hide=("packer",))
    kw = {"install": True, "base_url": server.url, "terraform_sha256": digests["terraform"]}
    kw["packer_sha256"] = {PLAT: digests["packer"]}
    chain = resolve("deploy", tmp_path, path, **kw)
    assert chain.ok, chain.problem_line()
    folder = tmp_path / "cache" / "tools" / f"terraform-{tc.TERRAFORM_VERSION}" / PLAT
    terraform = chain.status("terraform")
    assert (terraform.source, terraform.version, terraform.path) == (
        "downloaded",
        "1.12.2",
        str(folder / "terraform"),
    )
    assert (folder / f"terraform_{tc.TERRAFORM_VERSION}_{PLAT}.zip").is_file()  # the zip is kept
    assert os.access(folder / "terraform", os.X_OK)
    assert chain.status("packer").source == "downloaded"
    assert chain.bin_dirs == (str(folder), str(tmp_path / "cache" / "tools" / "packer-1.15.0" / PLAT))
    assert sorted(server.requests) == [
        f"/packer/1.15.0/packer_1.15.0_{PLAT}.zip",
        f"/terraform/1.12.2/terraform_1.12.2_{PLAT}.zip",
    ]
    again = resolve("deploy", tmp_path, path, **kw)
    assert again.status("terraform").source == "cache"
    assert again.ok
    assert len(server.requests) == 2  # no second download
    assert [p.name for p in folder.parent.iterdir() if "partial" in p.name] == []


def test_checksum_mismatch_is_refused_and_installs_nothing(tmp_path: Path, served: Any) -> None:
    server, _ = served
    path = stub_path(tmp_path, hide=("terraform",))
    chain = resolve("deploy", tmp_path, path, install=True, base_url=server.url, terraform_sha256="0" * 64)
    status = chain.status("terraform")
    assert not status.ok
    assert "checksum mismatch" in status.advice
    assert "checksum mismatch" in chain.problem_line()
    assert not (tmp_path / "cache" / "tools" / "terraform-1.12.2" / PLAT / "terraform").exists()


def test_the_default_pin_is_the_cluster_toolkit_checksum(tmp_path: Path, served: Any) -> None:
    """Our stand-in zip is not HashiCorp's: with the pinned default sha256 it must be refused."""
    server, _ = served
    chain = resolve(
        "deploy", tmp_path, stub_path(tmp_path, hide=("terraform",)), install=True, base_url=server.url
    )
    assert not chain.status("terraform").ok
    assert f"expected sha256 {tc.TERRAFORM_SHA256[PLAT]}" in chain.status("terraform").advice


def test_an_unpinned_version_needs_a_sha256(tmp_path: Path, served: Any) -> None:
    server, _ = served
    chain = resolve(
        "deploy", tmp_path, stub_path(tmp_path, hide=("terraform",)), install=True, base_url=server.url,
        terraform_version="1.14.0",
    )  # fmt: skip
    assert "set terraform_sha256" in chain.status("terraform").advice
    assert server.requests == []


def test_a_tampered_cached_binary_is_detected_and_repaired_from_its_zip(tmp_path: Path, served: Any) -> None:
    server, digests = served
    path = stub_path(tmp_path, hide=("terraform",))
    kw = {"base_url": server.url, "terraform_sha256": digests["terraform"]}
    chain = resolve("deploy", tmp_path, path, install=True, **kw)
    binary = Path(chain.status("terraform").path or "")
    original = binary.read_bytes()
    binary.write_text("#!/bin/sh\necho evil\n")
    assert tc.reverify(chain) is not None
    assert "differs" in (tc.reverify(chain) or "")
    repaired = resolve("deploy", tmp_path, path, install=False, **kw)
    assert repaired.status("terraform").ok
    assert binary.read_bytes() == original
    assert len(server.requests) == 1  # repaired from the kept, verified zip


def test_a_tampered_zip_is_refused_without_install_and_downloaded_again_with(
    tmp_path: Path, served: Any
) -> None:
    server, digests = served
    path = stub_path(tmp_path, hide=("terraform",))
    kw = {"base_url": server.url, "terraform_sha256": digests["terraform"]}
    chain = resolve("deploy", tmp_path, path, install=True, **kw)
    binary = Path(chain.status("terraform").path or "")
    archive = binary.parent / f"terraform_1.12.2_{PLAT}.zip"
    make_zip(archive, "terraform", "1.12.2-evil")
    binary.write_text("#!/bin/sh\necho evil\n")
    refused = resolve("deploy", tmp_path, path, install=False, **kw)
    assert not refused.status("terraform").ok
    assert refused.status("terraform").source == "missing"
    again = resolve("deploy", tmp_path, path, install=True, **kw)
    assert again.status("terraform").ok
    assert again.status("terraform").source == "downloaded"
    assert len(server.requests) == 2


def test_verify_installed_checks_the_zip_against_the_pin(tmp_path: Path) -> None:
    archive = tmp_path / "t.zip"
    digest = make_zip(archive, "terraform", "1.12.2")
    binary = tmp_path / "terraform"
    with zipfile.ZipFile(archive) as zf:
        binary.write_bytes(zf.read("terraform"))
    assert tc.verify_installed(binary, archive, digest) is None
    assert "expected" in (tc.verify_installed(binary, archive, "1" * 64) or "")


# -------------------------------------------------------------------------------------- doctor table
def test_format_table_lists_each_tool_once_with_its_purposes(tmp_path: Path) -> None:
    path = stub_path(tmp_path, hide=("packer",))
    memo: dict[str, tc.ToolStatus] = {}
    chains = [resolve(p, tmp_path, path, memo=memo) for p in ("deploy", "jobs", "tpu_vm")]
    text = tc.format_table(chains)
    lines = text.splitlines()
    assert lines[0].split() == ["TOOL", "NEEDED", "FOR", "WANTED", "FOUND", "FROM", "STATUS"]
    gcloud = next(line for line in lines if line.startswith("gcloud "))
    assert "deploy,jobs,tpu_vm" in gcloud
    assert gcloud.endswith("OK")
    assert any(line.startswith("terraform ") and "1.12.2" in line and line.endswith("OK") for line in lines)
    assert lines[-3:] == [
        "deploy needs packer (not on PATH; set install_tools=true or add packer to PATH)",
        "jobs: OK",
        "tpu_vm: OK",
    ]


# ---------------------------------------------------------------------------------- the hook's use
def test_command_purpose() -> None:
    assert command_purpose(Command(("gcluster", "deploy", "d", "--auto-approve"))) == "deploy"
    assert command_purpose(Command(("gcluster", "-w", "create", "bp.yaml"))) == "deploy"
    assert command_purpose(Command(("gcluster", "destroy", "d"))) == "deploy"
    assert command_purpose(Command(("gcluster", "export-outputs", "d"))) == "deploy"
    assert command_purpose(Command(("gcluster", "job", "list"))) == "jobs"
    assert command_purpose(Command(("gcluster", "--version"))) is None
    assert command_purpose(Command(("gcloud", "compute", "tpus"))) is None


def test_run_refuses_deploy_in_one_line_before_any_process_when_packer_is_missing(
    make_hook: Any, fake_tools: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", path_without(["packer"], tmp_path / "nopacker"))
    fake_tools.respond({"match": [], "steps": [["out", "ran"]]})
    hook = make_hook(install_tools="false")
    with pytest.raises(ConfigurationError) as info:
        hook.run(Command(("gcluster", "deploy", "dep", "--auto-approve")), timeout=GUARD)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "deploy needs packer (not on PATH; set install_tools=true or add packer to PATH)"
    )
    assert fake_tools.calls() == []  # no process started
    # gcluster job needs kubectl, not packer.
    fake_tools.respond({"match": ["job"], "steps": [["out", "listed"]]})
    assert hook.run(Command(("gcluster", "job", "list")), timeout=GUARD).ok
    monkeypatch.setenv("PATH", path_without(["packer", "kubectl"], tmp_path / "nokubectl"))
    with pytest.raises(ConfigurationError, match=r"^jobs needs kubectl \(not on PATH"):
        make_hook().run(Command(("gcluster", "job", "list")), timeout=GUARD)
    assert len(fake_tools.calls()) == 1


def test_run_refuses_when_the_download_fails(
    make_hook: Any, fake_tools: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PATH", path_without(["terraform"], tmp_path / "noterraform"))
    hook = make_hook(hashicorp_base_url="http://127.0.0.1:9", cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigurationError) as info:
        hook.run(Command(("gcluster", "destroy", "dep")), timeout=GUARD)
    assert str(info.value).startswith(
        "deploy needs terraform >= 1.12.2 (not on PATH; cannot download terraform"
    )
    assert "\n" not in str(info.value)
    assert fake_tools.calls() == []


def test_run_puts_the_toolchain_first_on_path_with_the_plugin_cache(
    make_hook: Any, fake_tools: Any, served: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, digests = served
    monkeypatch.setenv("PATH", path_without(["terraform"], tmp_path / "noterraform"))
    cache = tmp_path / "cache"
    hook = make_hook(
        cache_dir=str(cache), hashicorp_base_url=server.url, terraform_sha256=digests["terraform"]
    )
    fake_tools.respond({"match": ["deploy"], "steps": [["env", "PATH"], ["env", "TF_PLUGIN_CACHE_DIR"]]})
    result = hook.run(Command(("gcluster", "deploy", "dep", "--auto-approve")), timeout=GUARD)
    assert result.ok
    env = dict(line.split("=", 1) for line in result.output_lines)
    folder = cache / "tools" / "terraform-1.12.2" / PLAT
    assert env["PATH"].split(os.pathsep)[0] == str(folder)
    assert env["PATH"].split(os.pathsep)[1:] == os.environ["PATH"].split(os.pathsep)
    assert env["TF_PLUGIN_CACHE_DIR"] == str(cache / "terraform-plugins")
    assert (cache / "terraform-plugins").is_dir()
    # A second command re-verifies the cached terraform: tampering makes it re-resolve (repair).
    (folder / "terraform").write_text("#!/bin/sh\necho evil\n")
    hook.run(Command(("gcluster", "deploy", "dep", "--auto-approve")), timeout=GUARD)
    assert "evil" not in (folder / "terraform").read_text()
    assert len(server.requests) == 1


def test_gcloud_commands_need_no_toolchain(
    make_hook: Any, fake_tools: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PATH", path_without(["packer", "terraform", "kubectl"], tmp_path / "bare"))
    fake_tools.respond({"match": [], "steps": [["out", "ok"]]})
    assert make_hook().run(Command(("gcloud", "storage", "ls")), timeout=GUARD).ok


def test_prepare_process_path_prepend_and_extra_env(tmp_path: Path) -> None:
    prepared = prepare_process(
        ["x"],
        command_env={"A": "command"},
        stdin_payload=None,
        secrets=(),
        job_home=tmp_path / "home",
        cwd=None,
        base_env={"PATH": "/usr/bin:/first:/bin", "TF_PLUGIN_CACHE_DIR": "/theirs"},
        path_prepend=("/first", "/second"),
        extra_env={"TF_PLUGIN_CACHE_DIR": "/ours", "A": "extra"},
    )
    assert prepared.env["PATH"] == "/first:/second:/usr/bin:/bin"
    assert prepared.env["TF_PLUGIN_CACHE_DIR"] == "/ours"
    assert prepared.env["A"] == "command"


# ----------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(("text", "value"), [("true", True), ("False", False), (" 0 ", False), (True, True)])
def test_install_tools_accepts_form_text(text: Any, value: bool) -> None:
    assert GclusterConfig.from_extra({"install_tools": text}).install_tools is value


def test_install_tools_false_from_the_form_is_not_dropped() -> None:
    assert GclusterConfig.from_extra({"extra__gcluster__install_tools": False}).install_tools is False


def test_bad_install_tools_and_sha_json() -> None:
    with pytest.raises(ConfigurationError, match="install_tools must be true or false"):
        GclusterConfig(install_tools="maybe")  # type: ignore[arg-type]
    config = GclusterConfig.from_extra({"terraform_sha256": '{"linux_amd64": "' + "a" * 64 + '"}'})
    assert config.terraform_sha256 == {"linux_amd64": "a" * 64}
    with pytest.raises(ConfigurationError, match="not a JSON object"):
        GclusterConfig.from_extra({"packer_sha256": "{oops"})


def test_defaults_and_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = GclusterConfig()
    assert (config.terraform_version, config.packer_version, config.install_tools) == (
        "1.12.2",
        "1.15.0",
        True,
    )
    assert config.hashicorp_base_url is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert GclusterHook(config=config).cache_dir() == tmp_path / "xdg" / "airflow-provider-tpu-rl"
    assert GclusterHook(config=GclusterConfig(cache_dir=str(tmp_path / "c"))).cache_dir() == tmp_path / "c"


def test_ssh_key_file_is_per_connection_in_a_private_folder(tmp_path: Path) -> None:
    hook = GclusterHook("my_conn", config=GclusterConfig(cache_dir=str(tmp_path / "c")))
    key = hook.ssh_key_file()
    assert key == tmp_path / "c" / "ssh" / "my_conn" / "google_compute_engine"
    assert key.parent.is_dir()
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert not key.exists()  # gcloud generates it on first use
    assert hook.ssh_key_file() == key


def test_unknown_purpose(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown toolchain purpose"):
        GclusterHook(config=GclusterConfig(cache_dir=str(tmp_path))).toolchain("build")
