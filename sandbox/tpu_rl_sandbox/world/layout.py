"""Where things live inside a sandbox folder."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SANDBOX_DIR_ENV = "TPU_RL_SANDBOX_DIR"
DEFAULT_SANDBOX_DIRNAME = ".sandbox"


class SandboxNotConfiguredError(RuntimeError):
    """The fakes were started without a sandbox folder."""


@dataclass(frozen=True)
class SandboxLayout:
    """Paths of one sandbox folder."""

    root: Path

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def bundle_dir(self) -> Path:
        return self.root / "bundle"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def gcs_dir(self) -> Path:
        return self.root / "gcs"

    @property
    def vms_dir(self) -> Path:
        return self.root / "vms"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def calls_file(self) -> Path:
        return self.root / "calls.jsonl"

    @property
    def emulator_file(self) -> Path:
        return self.root / "emulator.json"

    @property
    def emulator_log(self) -> Path:
        return self.root / "emulator.log"

    def vm_dir(self, vm_name: str) -> Path:
        """Host folder that stands for the root file system of a fake VM."""
        return self.vms_dir / vm_name


def default_root(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """``$TPU_RL_SANDBOX_DIR`` if set, else ``<cwd>/.sandbox``."""
    env = os.environ if env is None else env
    configured = env.get(SANDBOX_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return ((cwd or Path.cwd()) / DEFAULT_SANDBOX_DIRNAME).resolve()


def layout_from_env(env: Mapping[str, str] | None = None) -> SandboxLayout:
    """The layout the fakes use; they refuse to run without ``TPU_RL_SANDBOX_DIR``."""
    env = os.environ if env is None else env
    configured = env.get(SANDBOX_DIR_ENV)
    if not configured:
        raise SandboxNotConfiguredError(
            f"{SANDBOX_DIR_ENV} is not set: run `tpu-rl-sandbox up` and use the shims in <root>/bin"
        )
    return SandboxLayout(Path(configured).expanduser().resolve())
