"""What a DAG file pulls in at parse time: nothing heavier than the operator classes.

The shipped DAG files are parsed with ``DagBag``, as the DAG processor would, one after the other
in ONE fresh interpreter under ``tests/dags/parse_guard.py`` (sockets refuse to connect, process
spawns are recorded). After each file, ``sys.modules`` must hold none of the heavy client
libraries: those are imported inside ``execute``, the hook methods or a trigger's ``run``. Every
provider module a DAG file imports is imported while it is parsed, so a heavy import anywhere on
that path is caught, and named after the first DAG file that reached it.

To cover more, add to :data:`PARSE_TIME_MODULES`: a dotted module name is imported, a path ending
in ``.py`` (relative to the repository root) is parsed with ``DagBag``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

ROOT = Path(__file__).resolve().parents[1]
PARSE_GUARD = ROOT / "tests" / "dags" / "parse_guard.py"

# Modules imported while a DAG file is parsed (or DAG files, as paths ending in .py).
PARSE_TIME_MODULES: list[str] = [
    "dags/tpu_rl_gke_pipeline.py",
    "dags/tpu_rl_tpu_vm_pipeline.py",
    "dags/tpu_rl_janitor.py",
    "dags/tpu_rl_sweep_example.py",
    "dags/tpu_rl_model_consumer_example.py",
]
# Airflow (3 and 2.11) loads every provider's asset URI handlers when the first asset (dataset) is
# built, whatever its URI's scheme, and the google provider's handler imports its GCS hook: a DAG
# file with an asset (the pipelines' model assets, their consumer) cannot avoid these
# (test_building_an_asset_loads_them; aiohttp is already loaded by Airflow 2.11 itself).
ASSET_HANDLER_IMPORTS: tuple[str, ...] = (
    "airflow.providers.google.cloud.hooks.gcs",
    "google.cloud.storage",
    "googleapiclient",
    "aiohttp",
)

# Must not be in sys.modules after importing one of the modules above.
FORBIDDEN_AT_PARSE: tuple[str, ...] = (
    "airflow.providers.google.cloud.hooks.gcs",
    "google.cloud.storage",
    "googleapiclient",
    "kubernetes",
    "aiohttp",
    "google.cloud.bigquery",
    "google.cloud.secretmanager",
    "airflow.providers.google.cloud.hooks.secret_manager",
    "airflow.providers.sqlite.hooks.sqlite",
    "airflow.providers.common.sql.hooks.sql",
)

# Runs in the fresh interpreter: load the parse guard (it patches socket and Popen on import), then
# import or parse each module in turn and report what each one added to sys.modules, connected to
# and spawned: one JSON object per module, in order.
PROBE = """
import importlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import parse_guard
modules, forbidden = json.loads(sys.argv[2]), json.loads(sys.argv[3])
import airflow  # what Airflow itself loads is not the module's doing
preloaded = [name for name in forbidden if name in sys.modules]
try:
    from airflow.dag_processing.dagbag import DagBag
    options = {}
except ImportError:  # Airflow 2, which also reads its example DAGs unless told not to
    from airflow.models.dagbag import DagBag
    options = {"include_examples": False}
results = []
for module in modules:
    before = set(sys.modules)
    attempts, spawned = len(parse_guard.attempts), len(parse_guard.spawned)
    import_errors = {}
    started = time.perf_counter()
    if module.endswith(".py"):
        bag = DagBag(dag_folder=module, **options)
        import_errors = {k: str(v)[-2000:] for k, v in bag.import_errors.items()}
    else:
        importlib.import_module(module)
    results.append({
        "import_errors": import_errors,
        "preloaded": preloaded,
        "loaded": [name for name in forbidden if name in sys.modules and name not in before],
        "attempts": parse_guard.attempts[attempts:],
        "spawned": parse_guard.spawned[spawned:],
        "seconds": time.perf_counter() - started,
    })
print(json.dumps(results))
"""

# croniter calls platform.architecture(), which runs `file -b <python>`: not a cloud call.
ALLOWED_SPAWNS = ("file",)


def probe_imports(
    modules: Sequence[str], forbidden: Sequence[str] = FORBIDDEN_AT_PARSE, home: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Import or parse ``modules`` in turn in one fresh guarded interpreter; per module, what it
    added to ``sys.modules``, connected to and spawned."""
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONDONTWRITEBYTECODE": "1"}
    if home is not None:
        env["AIRFLOW_HOME"] = str(home)
    argv = [sys.executable, "-c", PROBE, str(PARSE_GUARD.parent), json.dumps(list(modules))]
    done = subprocess.run(
        [*argv, json.dumps(list(forbidden))], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"importing {list(modules)} failed:\n{done.stderr[-3000:]}"
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    for module, result in zip(modules, results, strict=True):
        assert result["import_errors"] == {}, f"{module} did not parse: {result['import_errors']}"
    return dict(zip(modules, results, strict=True))


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every module of :data:`PARSE_TIME_MODULES`, in one interpreter."""
    return probe_imports(PARSE_TIME_MODULES, home=tmp_path_factory.mktemp("airflow-home"))


@pytest.mark.parametrize("module", PARSE_TIME_MODULES)
def test_parse_time_module_imports_no_heavy_client(module: str, probes: dict[str, dict[str, Any]]) -> None:
    result = probes[module]
    assert [name for name in result["loaded"] if name not in ASSET_HANDLER_IMPORTS] == [], (
        f"importing {module} loads {result['loaded']} ({result['seconds']:.2f}s): import them inside "
        "execute / the hook method / the trigger's run, and use TYPE_CHECKING for annotations"
    )


@pytest.mark.parametrize("module", PARSE_TIME_MODULES)
def test_parse_time_module_neither_connects_nor_spawns(
    module: str, probes: dict[str, dict[str, Any]]
) -> None:
    result = probes[module]
    assert result["attempts"] == []
    assert [argv for argv in result["spawned"] if Path(argv[0]).name not in ALLOWED_SPAWNS] == []


# Airflow 2.11's airflow.settings imports the cncf.kubernetes provider's pod_generator (the pod
# mutation hook), which loads the Kubernetes client and aiohttp before any DAG file is read.
AIRFLOW_2_PRELOADS = ("kubernetes", "aiohttp")


def test_airflow_itself_preloads_only_what_is_known(probes: dict[str, dict[str, Any]]) -> None:
    """On Airflow 3 nothing is excused; on Airflow 2 only what ``import airflow`` is known to load."""
    excused = () if AIRFLOW_V_3_0_PLUS else AIRFLOW_2_PRELOADS
    for module, result in probes.items():
        assert set(result["preloaded"]) <= set(excused), module


def test_the_forbidden_modules_are_installed_so_the_check_means_something() -> None:
    for name in FORBIDDEN_AT_PARSE:
        assert importlib.util.find_spec(name) is not None, f"{name} is not installed"


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    (result,) = probe_imports(["airflow.providers.google.cloud.hooks.gcs"], home=tmp_path).values()
    assert {"airflow.providers.google.cloud.hooks.gcs", "google.cloud.storage"} <= set(result["loaded"])


def test_building_an_asset_loads_them(tmp_path: Path) -> None:
    dag_file = tmp_path / "asset_dag.py"
    dag_file.write_text(
        "from datetime import datetime\n"
        "from airflow.providers.common.compat.sdk import DAG, Asset\n"
        "with DAG('asset_only', schedule=Asset('tpu-rl://models/x'), start_date=datetime(2026, 1, 1)):\n"
        "    pass\n"
    )
    (result,) = probe_imports([str(dag_file)], home=tmp_path).values()
    preloaded = () if AIRFLOW_V_3_0_PLUS else AIRFLOW_2_PRELOADS
    assert set(ASSET_HANDLER_IMPORTS) - set(preloaded) <= set(result["loaded"])


def test_the_probe_parses_a_dag_file_given_as_a_path(tmp_path: Path) -> None:
    dag_file = tmp_path / "heavy_dag.py"
    dag_file.write_text(
        "from datetime import datetime\n"
        "from airflow.providers.common.compat.sdk import DAG\n"
        "from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor\n"
        "with DAG('heavy', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    GCSObjectExistenceSensor(task_id='wait', bucket='b', object='o')\n"
    )
    (result,) = probe_imports([str(dag_file)], home=tmp_path).values()
    assert "google.cloud.storage" in result["loaded"]
