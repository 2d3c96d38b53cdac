"""Session-wide fixtures shared by the test packages (the sandbox, the GCS emulator, the parsed DAG
folder), and a hermetic home for the whole suite.

Before anything imports Airflow, the suite gets a home of its own: ``HOME`` and ``AIRFLOW_HOME``
point into one temporary folder per pytest invocation (shared by its xdist workers, which inherit
the environment), so nothing is written under ``~`` (caches and configs follow ``HOME``; the
``XDG_*`` variables are dropped, as a tool's test sets ``HOME`` to say where its cache goes) and a
stray ``~/airflow/airflow.cfg`` changes nothing. Tests that need a fresh Airflow (the
``airflow dags test`` runs, the real services) make their own ``AIRFLOW_HOME`` inside it.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HOME_ENV = "TPU_RL_TEST_HOME"


def _hermetic_home() -> None:
    home = os.environ.get(_HOME_ENV)
    if home is None:  # the first process of this invocation: make the folder, remove it at exit
        home = tempfile.mkdtemp(prefix="tpu-rl-tests-home-")
        os.environ[_HOME_ENV] = home
        atexit.register(shutil.rmtree, home, True)
    for name, sub in (("HOME", ""), ("AIRFLOW_HOME", "airflow")):
        folder = Path(home, sub)
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(folder)
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        os.environ.pop(name, None)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


_hermetic_home()

import pytest  # noqa: E402

from tests.support.dags import parse_dags_folder, serialize_dags  # noqa: E402
from tests.support.gcs_emulator import GcsEmulator, running_gcs_emulator  # noqa: E402
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo, sandbox_down, sandbox_up  # noqa: E402

# Each session ends with its costliest test files in CPU-seconds (what `make test` spends, and where).
pytest_plugins = ["tests.support.cpu_profile"]

# tests/maxtext_real runs MaxText's own converters (minutes, GBs of venvs): `make test-maxtext` only.
collect_ignore = [] if os.environ.get("TPU_RL_MAXTEXT_LEG") == "1" else ["maxtext_real"]

# The longest files first (the Makefile runs pytest-xdist with --dist loadfile and
# --no-loadscope-reorder): xdist hands whole files to its workers in collection order, one more as
# a worker runs low, so a long end-to-end file collected last would run alone at the end of a leg
# (by default xdist puts the files with the most tests first, which are the quick ones).
LONGEST_FIRST = (
    "tests/services/",
    "tests/e2e/test_gke_pipeline.py",
    "tests/e2e/",
    "tests/docs/test_operator_guide.py",
    "tests/triggers/test_jobset.py",
    "tests/triggers/test_jobset_recovery.py",
    "tests/operators/test_run_identity.py",
    "tests/operators/",
    "tests/dags/test_dag_runs.py",
    "tests/sandbox/",
    "tests/render/test_real_gcloud.py",
)


# Folders whose files share one expensive world per pytest-xdist worker: all of a folder's files go
# to the same worker, one after another (``tests/services``: one services stack for the browser
# and the REST modules, instead of one each).
SHARED_WORLD_FOLDERS = ("tests/services/",)


def work_unit(nodeid: str) -> str:
    """The unit ``--dist loadfile`` hands a worker whole: a file, or a folder of :data:`SHARED_WORLD_FOLDERS`."""
    path = nodeid.split("::", 1)[0]
    return next((folder for folder in SHARED_WORLD_FOLDERS if path.startswith(folder)), path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but a shared-world folder is one unit (:func:`work_unit`)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedWorldScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedWorldScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (Airflow, the providers, every test module: ~350,000 objects) is
    frozen out of the garbage collector's reach (``gc.freeze``): each full collection of a worker
    walked all of it again, about a tenth of a worker's CPU."""
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next(
            (i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxInfo]:
    """A running sandbox (fake-gcs-server + fake gcluster/gcloud shims) for the whole session.

    ``sandbox.env`` holds the variables a process needs (PATH prefix, STORAGE_EMULATOR_HOST,
    TPU_RL_SANDBOX_DIR, AIRFLOW_CONN_*). Tests must use their own project/cluster/bucket names:
    the state is shared by every test of the session.
    """
    info = sandbox_up(tmp_path_factory.mktemp("sandbox"))
    try:
        yield info
    finally:
        sandbox_down(info.root)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """fake-gcs-server on a free loopback port, Airflow's GCS hooks pointed at it, one bucket
    (``EMULATOR_BUCKET``) for the session: each test writes under names of its own."""
    with running_gcs_emulator(tmp_path_factory) as emulator:
        yield emulator


@pytest.fixture
def gcs_prefix() -> str:
    """A folder of its own for each test, so tests sharing the session's bucket never interfere."""
    return f"t-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(scope="session")
def dag_bag() -> Any:
    """The project's ``dags/`` folder, parsed once per session."""
    return parse_dags_folder()


@pytest.fixture(scope="session")
def serialized_dags(dag_bag: Any) -> dict[str, Any]:
    """The DAGs as the scheduler and the API server see them (serialized and read back)."""
    return serialize_dags(dag_bag)
