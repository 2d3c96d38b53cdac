"""Real Airflow services for the ``services`` marker: one stack (PostgreSQL, sandbox, four services)
for the whole folder, shared by its modules (tests/conftest.py sends the folder to one xdist worker).

Select or skip these tests with ``-m services`` / ``-m "not services"``. The stack is torn down
even when a test or the start-up fails, and the teardown errors if any process it started
(service, task runner, sandbox job worker) is still alive afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tests.services.airflow_stack import (
    AirflowApi,
    AirflowStack,
    kill_leftovers,
    leftover_processes,
    new_marker,
    process_alive,
    start_stack,
)
from tests.services.form_runs import PIPELINE_DAG_IDS, BrowserRuns, chromium, logged_in_page, run_forms
from tests.support.dags import CONSUMER_DAG_ID
from tests.support.pg_server import INSTALL_HINT, PostgresServer, find_postgres_bin
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo, sandbox_down, sandbox_env, sandbox_up
from tpu_rl_sandbox.machines.maxtext_sim import HOLD_FILE_ENV, STEP_SECONDS_ENV
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings

# Simulated seconds per MaxText step: long enough that `train` is seen deferred, short enough for
# a whole run in about a minute on two cores.
STEP_SECONDS = "0.3"
# The longest a held job waits (sandbox setting hold_seconds): the tests' waits on a hold stay below.
HOLD_SECONDS = 1500.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "services: real Airflow services (api-server or webserver, scheduler, dag-processor, triggerer) "
        "on PostgreSQL "
        "with the sandbox (minutes, not seconds)",
    )
    config.addinivalue_line(
        "markers",
        "browser: drives the services stack's UI with Chromium (Playwright; make chromium installs it)",
    )


@dataclass(frozen=True)
class ServicesWorld:
    """A running stack, its REST client and the sandbox it uses."""

    stack: AirflowStack
    api: AirflowApi
    sandbox: SandboxInfo
    hold_file: Path

    @property
    def layout(self) -> SandboxLayout:
        return SandboxLayout(self.sandbox.root)


@pytest.fixture(scope="package")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServicesWorld]:
    """PostgreSQL + sandbox + the four Airflow services, started once for the folder; both pipelines
    unpaused. Each module's runs use names of their own (cluster, bucket, run ids), so the runs of one
    module never decide what another sees."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.fail(f"PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin: {INSTALL_HINT}")
    root = tmp_path_factory.mktemp("services")
    hold_file = root / "hold"
    stack: AirflowStack | None = None
    marker = new_marker()
    with PostgresServer(bin_dir) as postgres:
        info = sandbox_up(root / "sandbox")
        try:
            update_settings(SandboxLayout(info.root), hold_seconds=HOLD_SECONDS)
            stack, api = start_stack(
                root,
                postgres,
                sandbox_env(info.root),
                (*PIPELINE_DAG_IDS, CONSUMER_DAG_ID),
                marker,
                # the fake gcluster copies both into the job it submits (sandbox/.../clis/gcluster/jobs.py)
                extra_env={STEP_SECONDS_ENV: STEP_SECONDS, HOLD_FILE_ENV: str(hold_file)},
            )
            # the model asset's downstream example too: a promoted model's event queues it
            for dag_id in (*PIPELINE_DAG_IDS, CONSUMER_DAG_ID):
                api.unpause(dag_id)
            yield ServicesWorld(stack=stack, api=api, sandbox=info, hold_file=hold_file)
        finally:
            hold_file.unlink(missing_ok=True)
            if stack is not None:
                stack.stop()
            sandbox_down(info.root)
            left = leftover_processes(marker)
            sandbox_left = [pid for pid in (info.emulator_pid,) if process_alive(pid)]
            kill_leftovers(marker)
    assert not left, "processes left running after the stack was stopped:\n" + "\n".join(left)
    assert not sandbox_left, f"the sandbox's emulator is still running: {sandbox_left}"


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, through Playwright (which never downloads a browser here)."""
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="package")
def user_page(browser: Browser, services: ServicesWorld) -> Iterator[Page]:
    """One logged-in tab for the dashboard checks."""
    with logged_in_page(browser, services) as page:
        yield page


@pytest.fixture(scope="package")
def runs(services: ServicesWorld, user_page: Page, tmp_path_factory: pytest.TempPathFactory) -> BrowserRuns:
    """The folder's runs (tests/services/form_runs.py), each asserted on by every test that reads it;
    their forms are submitted in the logged-in user's session (``user_page``'s)."""
    return run_forms(services, user_page, tmp_path_factory.mktemp("screenshots"))
