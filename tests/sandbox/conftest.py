"""Helpers for the sandbox tests: run the fakes in-process or through their shims."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.render.shell import hf_token_from_secret_manager
from tests.support.waiting import HANG_BOUND, wait_until
from tpu_rl_sandbox.apis.gcs_client import GcsApi
from tpu_rl_sandbox.apis.gcs_emulator import api_for
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError
from tpu_rl_sandbox.clis.gcluster.app import Gcluster
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.world.faults import reset_faults
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore

STEP_SECONDS = "0.01"


@dataclass
class Result:
    """Exit code and output of one fake call."""

    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def wait_for(predicate: Callable[[], Any], timeout: float = HANG_BOUND, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (a bound against hangs, not a timing assertion)."""
    return wait_until(predicate, what, timeout)


@dataclass
class Cli:
    """Runs the fakes for one test with its own HOME and working directory."""

    info: SandboxInfo
    env: dict[str, str]
    cwd: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def layout(self) -> SandboxLayout:
        return SandboxLayout(self.info.root)

    @property
    def api(self) -> GcsApi:
        return api_for(self.layout)

    def state(self, name: str) -> dict[str, Any]:
        return StateStore(self.layout).read(name)

    def _env(self, overrides: dict[str, str] | None) -> dict[str, str]:
        env = dict(self.env)
        env.update(self.extra)
        env.update(overrides or {})
        return env

    def gcluster(
        self, *argv: str, stdin: str | None = None, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Result:
        out: list[str] = []
        err: list[str] = []
        lines = iter((stdin or "").splitlines(keepends=True))
        app = Gcluster(
            self.layout,
            self._env(env),
            str(cwd or self.cwd),
            out.append,
            err.append,
            lambda: next(lines, None),
        )
        code = app.run(list(argv))
        return Result(code, "".join(out), "".join(err))

    def gcloud(self, *argv: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> Result:
        out: list[str] = []
        err: list[str] = []
        app = Gcloud(self.layout, self._env(env), lambda: stdin, out.append, err.append)
        try:
            code = app.run(list(argv))
        except GcloudUsageError as error:
            err.append(error.render())
            code = 2
        return Result(code, "".join(out), "".join(err))

    def shim(self, tool: str, *argv: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> Result:
        completed = subprocess.run(
            [str(self.info.bin_dir / tool), *argv],
            input=stdin,
            capture_output=True,
            env=self._env(env),
            cwd=self.cwd,
            check=False,
            timeout=120,
        )
        return Result(completed.returncode, completed.stdout.decode(), completed.stderr.decode())

    def job(self, project: str, location: str, cluster: str, name: str) -> dict[str, Any] | None:
        return self.state("jobs").get(f"{project}/{location}/{cluster}/{name}")

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        return sorted(info.name for info in self.api.iter_objects(bucket, prefix))


@pytest.fixture
def cli(sandbox: SandboxInfo, tmp_path: Path) -> Cli:
    """A CLI runner with a private HOME (so ``~/.gcluster`` and ``~/.docker`` are per test)."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_RL_SANDBOX", "CLOUDSDK_"))}
    env.pop("HF_TOKEN", None)
    env.update(sandbox.env)
    env.update({"HOME": str(home), "USER": "tester", "TPU_RL_SANDBOX_STEP_SECONDS": STEP_SECONDS})
    return Cli(sandbox, env, work)


@pytest.fixture
def names() -> dict[str, str]:
    """Unique project / cluster / bucket names for one test (the sandbox state is shared)."""
    suffix = uuid.uuid4().hex[:6]
    return {
        "project": f"proj-{suffix}",
        "cluster": f"c{suffix}",
        "bucket": f"bkt-{suffix}",
        "region": "us-east5",
        "zone": "us-east5-b",
    }


@pytest.fixture
def clean_faults(sandbox: SandboxInfo) -> Iterator[None]:
    """Transient faults fire once per sandbox: forget earlier firings around the test."""
    reset_faults(SandboxLayout(sandbox.root))
    yield
    reset_faults(SandboxLayout(sandbox.root))


def deploy_args(names: dict[str, str], *, backend: bool = True, extra_vars: str = "") -> list[str]:
    """``gcluster deploy`` argv like the seeds (comma-joined --vars), optionally with a GCS backend."""
    variables = (
        f"project_id={names['project']},deployment_name={names['cluster']},region={names['region']},"
        f"zone={names['zone']},num_slices=1,tpu_topology=4x8,authorized_cidr=0.0.0.0/0,reservation=res-1"
    )
    if extra_vars:
        variables += "," + extra_vars
    args = ["--vars", variables, "-l", "IGNORE", "--auto-approve", "-w"]
    if backend:
        args += ["--backend-config", f"bucket={names['bucket']}"]
    return args


@dataclass
class Cluster:
    """A deployed cluster ready for jobs (bucket, storage.admin and secretAccessor for the cluster's
    accounts, docker creds, context)."""

    names: dict[str, str]
    secret: str

    @property
    def project(self) -> str:
        return self.names["project"]

    @property
    def bucket(self) -> str:
        return self.names["bucket"]

    @property
    def name(self) -> str:
        return self.names["cluster"]

    @property
    def region(self) -> str:
        return self.names["region"]

    @property
    def secret_ref(self) -> str:
        return f"projects/{self.project}/secrets/{self.secret}/versions/latest"

    def token_export(self) -> str:
        """The Secret Manager read the renderer puts in front of MaxText (runs for real in the pod)."""
        return hf_token_from_secret_manager(self.secret_ref)


@pytest.fixture
def cluster(cli: Cli, names: dict[str, str]) -> Cluster:
    """Everything the seed does before the first ``gcluster job submit``."""
    return make_cluster(cli, names, cli.info.blueprint)


def make_cluster(cli: Cli, names: dict[str, str], blueprint: Path) -> Cluster:
    """The seed's set-up before the first ``gcluster job submit``, deploying ``blueprint``."""
    assert (
        cli.gcloud(
            "storage",
            "buckets",
            "create",
            f"gs://{names['bucket']}",
            f"--project={names['project']}",
            f"--location={names['region']}",
        ).code
        == 0
    )
    result = cli.gcluster("deploy", str(blueprint), *deploy_args(names))
    assert result.code == 0, result.text
    # secretAccessor project-wide (the pipeline grants it on its secret alone): a read of a secret
    # that does not exist is then Secret Manager's 404, not the 403 "(or it may not exist)" that the
    # pod's read waits on for a grant to propagate.
    for account in ("np", "wl"):
        member = (
            f"serviceAccount:{names['cluster']}-gke-{account}-sa@{names['project']}.iam.gserviceaccount.com"
        )
        for role in ("roles/storage.admin", "roles/secretmanager.secretAccessor"):
            granted = cli.gcloud(
                "projects",
                "add-iam-policy-binding",
                names["project"],
                f"--member={member}",
                f"--role={role}",
                "--condition=None",
                "--quiet",
            )
            assert granted.code == 0, granted.text
    assert cli.gcloud("auth", "configure-docker", "gcr.io", "--quiet").code == 0
    assert cli.gcloud("auth", "configure-docker", f"{names['region']}-docker.pkg.dev", "--quiet").code == 0
    for key, value in (
        ("project", names["project"]),
        ("cluster", names["cluster"]),
        ("location", names["region"]),
    ):
        assert cli.gcluster("job", "config", "set", key, value).code == 0
    secret = "hf-token"
    created = cli.gcloud(
        "secrets",
        "create",
        secret,
        f"--project={names['project']}",
        "--replication-policy=automatic",
        "--data-file=-",
        stdin=b"hf_clear_test_value_123",
    )
    assert created.code == 0, created.text
    return Cluster(names, secret)


def submit_args(name: str, command: str, *extra: str) -> list[str]:
    """``gcluster job submit`` for a TPU job on the fixture cluster."""
    return [
        "job",
        "submit",
        "--name",
        name,
        "--image",
        "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4",
        "--compute-type",
        "ct6e-standard-4t",
        "--topology",
        "4x8",
        "--num-slices",
        "1",
        *extra,
        "--command",
        command,
    ]


def job_status(cli: Cli, cluster: Cluster, name: str) -> str | None:
    job = cli.job(cluster.project, cluster.region, cluster.name, name)
    return None if job is None else str(job["status"])
