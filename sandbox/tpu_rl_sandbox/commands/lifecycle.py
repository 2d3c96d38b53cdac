"""``tpu-rl-sandbox up|down|env``: create, stop and describe a local sandbox folder.

Library use::

    from tpu_rl_sandbox.commands.lifecycle import sandbox_up, sandbox_down, sandbox_env
    info = sandbox_up(Path(".sandbox"))      # starts fake-gcs-server, writes shims, tool stubs, bundle
    env = sandbox_env(info.root)             # variables a process needs to use the sandbox
    sandbox_down(info.root, wipe=False)      # stops the emulator and job workers, keeps data

The ``google_cloud_default`` connection holds the sandbox's service-account key
(:mod:`tpu_rl_sandbox.apis.oauth`); its ``token_uri`` is the API server's ``/token``, which also serves
GKE's ``clusters.get`` (``AIRFLOW__TPU_RL__CONTAINER_ENDPOINT``) pointing at each cluster's fake
Kubernetes API (:mod:`tpu_rl_sandbox.apis.kube_api`, HTTPS with the CA of :mod:`tpu_rl_sandbox.apis.tls`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import tpu_rl_sandbox
from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS
from tpu_rl_sandbox.apis import api_server, gcs_emulator, oauth
from tpu_rl_sandbox.apis.tls import ensure_tls
from tpu_rl_sandbox.clis import call_server
from tpu_rl_sandbox.clis.gcluster import adc
from tpu_rl_sandbox.clis.gcluster.jobs import kill_all_workers
from tpu_rl_sandbox.clis.tool_stubs import write_tool_stubs
from tpu_rl_sandbox.world.calls import CALL_START_ENV
from tpu_rl_sandbox.world.layout import SANDBOX_DIR_ENV, SandboxLayout, default_root

SANDBOX_PROJECT = "sandbox-project"
HF_SANDBOX_TOKEN = "hf_sandbox_not_a_real_token"
BLUEPRINT_RELATIVE = Path("examples/gke-tpu-v6e/gke-tpu-v6e-advanced.yaml")
SHIMS = {"gcluster": "clis.gcluster", "gcloud": "clis.gcloud"}
# The trigger forms' per-environment defaults (the provider's `[tpu_rl] default_*` options), so the
# untouched forms run here: the sandbox's project, a bucket, its zone and the v6e-8 reservation the
# fake project defines (settings.DEFAULT_RESERVATIONS). The GKE form keeps its own default, no
# reservation (on-demand capacity, which the fake project always has).
SANDBOX_FORM_DEFAULTS = {
    "default_project": SANDBOX_PROJECT,
    "default_region": "us-east5",
    "default_zone": "us-east5-b",
    "default_bucket": "tpu-rl-sandbox-bucket",
    "default_tpu_vm_reservation": "res-8",
}


def sandbox_form_defaults(kind: str) -> dict[str, str]:
    """The conf values the sandbox's environment prefills on pipeline ``kind``'s form."""
    return {
        key: SANDBOX_FORM_DEFAULTS[option]
        for key, option in ENVIRONMENT_OPTIONS[kind].items()
        if option in SANDBOX_FORM_DEFAULTS
    }


@dataclass(frozen=True)
class SandboxInfo:
    """A running sandbox."""

    root: Path
    emulator_url: str
    emulator_pid: int
    bin_dir: Path
    bundle_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def gcluster(self) -> Path:
        return self.bin_dir / "gcluster"

    @property
    def gcloud(self) -> Path:
        return self.bin_dir / "gcloud"

    @property
    def blueprint(self) -> Path:
        return self.bundle_dir / BLUEPRINT_RELATIVE


def _shim_text(root: Path, tool: str, module: str) -> str:
    package_parent = Path(tpu_rl_sandbox.__file__).resolve().parents[1]
    return (
        "#!/bin/sh\n"
        "# Sandbox shim written by `tpu-rl-sandbox up`.\n"
        f"{SANDBOX_DIR_ENV}={shlex.quote(str(root))}\n"
        f"export {SANDBOX_DIR_ENV}\n"
        f"PYTHONPATH={shlex.quote(str(package_parent))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        # When the caller started this call, so calls.jsonl times include the interpreter's start-up.
        f"{CALL_START_ENV}=$(date +%s.%N)\n"
        f"export {CALL_START_ENV}\n"
        + (
            call_server.shim_command(SandboxLayout(root), tool)
            if tool in call_server.SERVED
            else f'exec {shlex.quote(sys.executable)} -m tpu_rl_sandbox.{module} "$@"\n'
        )
    )


def _write_shims(layout: SandboxLayout) -> None:
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    for name, module in SHIMS.items():
        shim = layout.bin_dir / name
        shim.write_text(_shim_text(layout.root, name, module))
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _copy_tree(source: Traversable, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        if child.is_dir():
            _copy_tree(child, target / child.name)
        elif child.is_file():
            (target / child.name).write_bytes(child.read_bytes())


def _write_bundle(layout: SandboxLayout) -> None:
    """The stand-in bundle's whole example folder (blueprints and the files they ``ghpc_stage``)."""
    example = BLUEPRINT_RELATIVE.parent
    source = resources.files("tpu_rl_sandbox").joinpath("bundle").joinpath(str(example))
    target = layout.bundle_dir / example
    if target.is_dir():
        shutil.rmtree(target)
    _copy_tree(source, target)


def _gcp_extra(layout: SandboxLayout, api_url: str | None) -> dict[str, object]:
    """The sandbox service account's key, its ``token_uri`` the API server's ``/token``."""
    if api_url is None:  # no token endpoint to refresh against
        return {"is_anonymous": True, "project": SANDBOX_PROJECT}
    return {"keyfile_dict": oauth.keyfile_dict(layout, api_url, SANDBOX_PROJECT), "project": SANDBOX_PROJECT}


def _connection_env(layout: SandboxLayout, api_url: str | None) -> dict[str, str]:
    return {
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
            {"conn_type": "google_cloud_platform", "extra": _gcp_extra(layout, api_url)}
        ),
        "AIRFLOW_CONN_GCLUSTER_DEFAULT": json.dumps(
            {
                "conn_type": "gcluster",
                "extra": {
                    "gcluster_path": str(layout.bin_dir / "gcluster"),
                    "gcloud_path": str(layout.bin_dir / "gcloud"),
                    "bundle_dir": str(layout.bundle_dir),
                    # the hook's toolchain cache stays inside the sandbox, never in the real ~/.cache
                    "cache_dir": str(layout.root / "cache"),
                    # fault injection and timing knobs reach the fakes through the hook's env
                    "inherit_env": ["TPU_RL_SANDBOX_*"],
                },
            }
        ),
        "AIRFLOW_CONN_HUGGINGFACE_DEFAULT": json.dumps(
            {"conn_type": "generic", "password": HF_SANDBOX_TOKEN}
        ),
    }


def sandbox_env(root: Path) -> dict[str, str]:
    """Environment for a process that should use the sandbox (requires a running emulator)."""
    layout = SandboxLayout(Path(root).resolve())
    info = gcs_emulator.read_info(layout)
    if info is None:
        raise gcs_emulator.EmulatorError(f"no sandbox running in {layout.root}; run `tpu-rl-sandbox up`")
    env = {
        "PATH": f"{layout.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "STORAGE_EMULATOR_HOST": info.url,
        SANDBOX_DIR_ENV: str(layout.root),
    }
    api_url = api_server.api_server_url(layout)
    if api_url is not None:
        # preflight's testIamPermissions and the GKE clusters.get go to the fake API
        env["AIRFLOW__TPU_RL__RESOURCE_MANAGER_ENDPOINT"] = api_url
        env["AIRFLOW__TPU_RL__CONTAINER_ENDPOINT"] = api_url
        # Application Default Credentials for gcluster (cmd/job/prereq.go getADCSetupCommand) and
        # any google-auth client: the sandbox's key, its token_uri the API server.
        env[adc.ADC_ENV] = str(adc.write_adc_key(layout, api_url, SANDBOX_PROJECT))
    env.update(_connection_env(layout, api_url))
    env.update(
        {f"AIRFLOW__TPU_RL__{option.upper()}": value for option, value in SANDBOX_FORM_DEFAULTS.items()}
    )
    return env


def sandbox_up(root: Path) -> SandboxInfo:
    """Create the sandbox folder (idempotent), start the emulator, write shims, stub tools and the bundle."""
    layout = SandboxLayout(Path(root).resolve())
    layout.root.mkdir(parents=True, exist_ok=True)
    for directory in (layout.state_dir, layout.vms_dir, layout.jobs_dir):
        directory.mkdir(parents=True, exist_ok=True)
    info = gcs_emulator.start(layout)
    oauth.ensure_service_account(layout, SANDBOX_PROJECT)
    ensure_tls(layout)
    api_server.start_api_server(layout)
    _write_shims(layout)
    call_server.start_call_server(layout)
    write_tool_stubs(layout.bin_dir)
    _write_bundle(layout)
    return SandboxInfo(
        root=layout.root,
        emulator_url=info.url,
        emulator_pid=info.pid,
        bin_dir=layout.bin_dir,
        bundle_dir=layout.bundle_dir,
        env=sandbox_env(layout.root),
    )


def sandbox_down(root: Path, wipe: bool = False) -> bool:
    """Stop the emulator and job workers. ``wipe`` also deletes the folder. True if it was up."""
    layout = SandboxLayout(Path(root).resolve())
    if not layout.root.exists():
        return False
    if layout.state_dir.is_dir():
        kill_all_workers(layout)
    call_server.stop_call_server(layout)
    api_server.stop_api_server(layout)
    was_running = gcs_emulator.stop(layout)
    if wipe:
        looks_like_sandbox = layout.state_dir.is_dir() or (layout.bin_dir / "gcluster").is_file()
        if not looks_like_sandbox:
            raise RuntimeError(f"refusing to wipe {layout.root}: it does not look like a sandbox folder")
        shutil.rmtree(layout.root)
    return was_running


# ======================================================================================= CLI
def _root_from_args(args: argparse.Namespace) -> Path:
    return Path(args.dir).resolve() if getattr(args, "dir", None) else default_root()


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        info = sandbox_up(_root_from_args(args))
    except gcs_emulator.EmulatorError as error:
        print(f"tpu-rl-sandbox up: {error}", file=sys.stderr)
        return 1
    print(f"sandbox up in {info.root}")
    print(f"  fake-gcs-server: {info.emulator_url} (pid {info.emulator_pid})")
    print(f"  gcluster shim:   {info.gcluster}")
    print(f"  gcloud shim:     {info.gcloud}")
    print(f"  blueprint:       {info.blueprint}")
    print(f'run: eval "$(tpu-rl-sandbox env{" --dir " + shlex.quote(str(info.root)) if args.dir else ""})"')
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    root = _root_from_args(args)
    was_running = sandbox_down(root, wipe=args.wipe)
    state = "stopped" if was_running else "was not running"
    print(f"sandbox {state}; {'deleted ' + str(root) if args.wipe else 'data kept in ' + str(root)}")
    return 0


def _cmd_env(args: argparse.Namespace) -> int:
    """Print ``export K=V`` lines: stdout carries nothing else (it is ``eval``-ed by a shell)."""
    exports = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            env = sandbox_env(_root_from_args(args))
    except gcs_emulator.EmulatorError as error:
        print(f"tpu-rl-sandbox env: {error}", file=sys.stderr)
        return 1
    for key, value in sorted(env.items()):
        print(f"export {key}={shlex.quote(value)}", file=exports)
    return 0


def add_sandbox_subcommands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``up``, ``down`` and ``env`` to the ``tpu-rl-sandbox`` parser (each sets ``func``)."""
    help_dir = f"sandbox folder (default: ${SANDBOX_DIR_ENV} or ./.sandbox)"
    up = subparsers.add_parser("up", help="start the sandbox (reuses a running one)")
    up.add_argument("--dir", help=help_dir)
    up.set_defaults(func=_cmd_up)
    down = subparsers.add_parser("down", help="stop the sandbox (keeps its data unless --wipe)")
    down.add_argument("--dir", help=help_dir)
    down.add_argument("--wipe", action="store_true", help="also delete the sandbox folder")
    down.set_defaults(func=_cmd_down)
    env = subparsers.add_parser("env", help="print `export K=V` lines for the sandbox")
    env.add_argument("--dir", help=help_dir)
    env.set_defaults(func=_cmd_env)


def provider_on_the_scale(minute_seconds: float) -> dict[str, str]:
    """The provider's own real-time waits that section 4 plays on its time scale: the wait for a
    booting guest's sshd, 5 real minutes polled every 5 real seconds (``[tpu_rl]
    ssh_boot_wait_minutes``, ``ssh_boot_poll_seconds``), so its polls do not bill whole minutes."""
    return {
        "AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES": str(5.0 * minute_seconds / 60.0),
        "AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS": str(5.0 * minute_seconds / 60.0),
    }


def migrated_airflow(
    root: Path, home: Path, dags_dir: Path, step_seconds: float
) -> tuple[str, dict[str, str]]:
    """The ``airflow`` executable and the environment of a run against the sandbox at ``root``, with
    a fresh Airflow home ``home`` (migrated here) and fast polls."""
    env = {
        **os.environ,
        **sandbox_env(root),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_dir),
        "AIRFLOW__TPU_RL__POLL_INTERVAL": "1",
        "TPU_RL_SANDBOX_STEP_SECONDS": str(step_seconds),
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, check=True)
    return airflow, env


def dags_test(
    airflow: str, dag_id: str, dag_file: Path, env: dict[str, str], conf: dict[str, Any] | None = None
) -> tuple[float, list[str]]:
    """Run ``airflow dags test`` on the one file ``dag_file`` (nothing else in the folder is parsed)
    and return its wall time and log lines; raise if the run failed."""
    argv = [airflow, "dags", "test", dag_id, "--dagfile-path", str(dag_file)]
    env = {**env, "AIRFLOW__CORE__DAGS_FOLDER": str(dag_file.parent)}  # the file's own bundle
    if conf is not None:
        argv += ["-c", json.dumps(conf)]
    started = time.monotonic()
    run = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    log = (run.stdout + run.stderr).splitlines()
    if run.returncode != 0:
        raise RuntimeError(f"{dag_id} failed:\n" + "\n".join(log[-40:]))
    return wall, log
