"""docker/compose.yaml: valid by the Compose specification's JSON schema (vendored), consistent with
itself, the images and README's "The local stack" tables; its entry point run for real."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.docker.dockerfile import DOCKER, REPO, instructions

SCHEMA_DIR = Path(__file__).parent / "schema"
README_SECTION = "## The local stack (`docker/compose.yaml`)"
AIRFLOW_SERVICES = ("airflow-init", "api-server", "scheduler", "dag-processor", "triggerer")
LONG_RUNNING = ("api-server", "scheduler", "dag-processor", "triggerer")
NOT_PUBLISHED = "—"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _schema() -> dict[str, Any]:
    schema = json.loads((SCHEMA_DIR / "compose-spec.json").read_text())
    assert isinstance(schema, dict)
    return schema


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment must be a mapping (NAME: value)"
    return {str(k): str(v) for k, v in env.items()}


# ------------------------------------------------------------------------------------------ schema
def test_vendored_schema_is_the_named_commit() -> None:
    readme = (SCHEMA_DIR / "README.md").read_text()
    assert "compose-spec/compose-spec" in readme
    assert "170098ba07d9f53c383a41bfd4c5166b0a4529a6" in readme
    digest = hashlib.sha256((SCHEMA_DIR / "compose-spec.json").read_bytes()).hexdigest()
    assert f"`{digest}`" in readme


def test_compose_file_is_valid() -> None:
    errors = list(jsonschema.Draft7Validator(_schema()).iter_errors(_compose()))
    assert [f"{e.json_path}: {e.message}" for e in errors] == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "scheduler", "restarts"), "always"),  # unknown key
        (("services", "api-server", "ports"), "8080"),  # a string, not a list
        (("services", "postgres", "depends_on"), {"x": {"condition": "sometimes"}}),
        (("volumes", "sandbox"), {"drivr": "local"}),
    ],
)
def test_the_schema_rejects_a_broken_file(path: tuple[str, ...], value: Any) -> None:
    broken = copy.deepcopy(_compose())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert list(jsonschema.Draft7Validator(_schema()).iter_errors(broken))


# ------------------------------------------------------------------------------- README agreement
def _readme_tables(readme: Path = REPO / "docs" / "docker.md") -> tuple[list[list[str]], list[list[str]]]:
    """The two tables of docs/docker.md's local-stack section: services, then the Airflow environment."""
    text = readme.read_text()
    heading = re.search(rf"^{re.escape(README_SECTION)}$", text, re.MULTILINE)
    assert heading is not None, f"{readme.name} has no {README_SECTION!r} section"
    section = text[heading.end() :]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in section.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    assert len(tables) == 2, f"expected 2 tables in {README_SECTION}, found {len(tables)}"
    return tables[0][1:], tables[1][1:]


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_readme_lists_exactly_the_services() -> None:
    services, _ = _readme_tables()
    assert [_code(row[0])[0] for row in services] == list(_compose()["services"])


def test_readme_gives_each_services_published_ports() -> None:
    services, _ = _readme_tables()
    compose = _compose()["services"]
    for row in services:
        name = _code(row[0])[0]
        published = [str(p) for p in compose[name].get("ports", [])]
        assert (_code(row[2]) if row[2] != NOT_PUBLISHED else []) == published, name


def test_readme_gives_each_services_environment() -> None:
    services, airflow_env = _readme_tables()
    compose = _compose()
    for row in services:
        name = _code(row[0])[0]
        env = _env(compose["services"][name])
        if row[3] == "the Airflow environment":
            assert name in AIRFLOW_SERVICES
            assert env == {_code(r[0])[0]: _code(r[1])[0] for r in airflow_env}, name
        else:
            assert sorted(_code(row[3])) == sorted(env), name


def test_readme_names_each_airflow_services_command() -> None:
    services, _ = _readme_tables()
    compose = _compose()["services"]
    for row in services:
        name = _code(row[0])[0]
        if name in AIRFLOW_SERVICES:
            assert " ".join(compose[name]["command"]) in _code(row[1]), name


# --------------------------------------------------------------------------------- consistency
def test_airflow_services_share_the_sandbox_namespaces() -> None:
    services = _compose()["services"]
    for name in AIRFLOW_SERVICES:
        service = services[name]
        assert service["network_mode"] == "service:fake-gcs-server", name
        assert service["image"] == services["fake-gcs-server"]["image"], name
        assert {"sandbox:/sandbox"} <= set(service["volumes"]), name
        assert service["depends_on"]["fake-gcs-server"]["condition"] == "service_healthy", name
    assert "healthcheck" in services["fake-gcs-server"]
    for name in LONG_RUNNING:
        assert services[name]["pid"] == "service:fake-gcs-server", name
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    assert services["scheduler"]["privileged"] is True
    assert not any(services[n].get("privileged") for n in services if n != "scheduler")


def test_the_ui_port_is_the_api_servers_and_the_execution_apis() -> None:
    services = _compose()["services"]
    command = services["api-server"]["command"]
    port = command[command.index("--port") + 1]
    assert services["fake-gcs-server"]["ports"] == [f"127.0.0.1:{port}:{port}"]
    for name in AIRFLOW_SERVICES:
        url = _env(services[name])["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
        assert url == f"http://localhost:{port}/execution/", name


def test_databases_match_postgres_and_its_init_script() -> None:
    services = _compose()["services"]
    pg = _env(services["postgres"])
    user, password, db = pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]
    env = _env(services["scheduler"])
    assert (
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        == f"postgresql+psycopg2://{user}:{password}@postgres:5432/{db}"
    )
    ledger = env["AIRFLOW_CONN_TPU_RL_LEDGER"]
    prefix = f"postgresql://{user}:{password}@postgres:5432/"
    assert ledger.startswith(prefix)
    init = (DOCKER / "postgres-init.sql").read_text()
    assert f"CREATE DATABASE {ledger.removeprefix(prefix)} OWNER {user};" in init
    mounted = [v for v in services["postgres"]["volumes"] if v.startswith("./postgres-init.sql:")]
    assert mounted == ["./postgres-init.sql:/docker-entrypoint-initdb.d/10-tpu-rl-ledger.sql:ro"]


def test_sandbox_folder_and_env_file_agree_everywhere() -> None:
    services = _compose()["services"]
    sandbox = services["fake-gcs-server"]
    root = _env(sandbox)["TPU_RL_SANDBOX_DIR"]
    assert f"sandbox:{root}" in sandbox["volumes"]
    for name in AIRFLOW_SERVICES:
        assert _env(services[name])["TPU_RL_SANDBOX_DIR"] == root
    envs = [i.args for i in instructions(DOCKER / "sandbox.Dockerfile") if i.keyword == "ENV"]
    assert any(f"TPU_RL_SANDBOX_DIR={root}" in e for e in envs)
    assert sandbox["command"] == ["sandbox"]
    assert sandbox["healthcheck"]["test"] == ["CMD", "test", "-s", f"{root}/compose.env"]
    assert 'env_file="$root/compose.env"' in (DOCKER / "sandbox-entrypoint.sh").read_text()


def test_the_build_points_at_the_sandbox_image() -> None:
    build = _compose()["services"]["fake-gcs-server"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).is_file()
    assert build["dockerfile"] == "docker/sandbox.Dockerfile"
    entry = [i.args for i in instructions(DOCKER / "sandbox.Dockerfile") if i.keyword == "ENTRYPOINT"]
    assert entry == ['["/usr/bin/dumb-init", "--", "/opt/tpu-rl/sandbox-entrypoint.sh"]']


# ------------------------------------------------------------------------- the entry point, run
ENTRYPOINT = DOCKER / "sandbox-entrypoint.sh"


def _entry_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "TPU_RL_SANDBOX"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TPU_RL_SANDBOX_DIR"] = str(root)
    env.update(extra)
    return env


@pytest.fixture
def running_sandbox(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    root = tmp_path / "sandbox"
    log = (tmp_path / "entrypoint.log").open("w")
    process = subprocess.Popen(
        [str(ENTRYPOINT), "sandbox"],
        env=_entry_env(root),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (root / "compose.env").is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (root / "compose.env").is_file(), (tmp_path / "entrypoint.log").read_text()
        yield root, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        subprocess.run(
            [sys.executable, "-m", "tpu_rl_sandbox.cli", "down", "--dir", str(root)],
            capture_output=True,
            timeout=60,
            check=False,
        )
        log.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=5) as response:  # noqa: S310 (the emulator)
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_entrypoint_starts_the_sandbox_and_airflow_commands_see_it(
    running_sandbox: tuple[Path, subprocess.Popen[str]],
) -> None:
    root, process = running_sandbox
    probe = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
        "('STORAGE_EMULATOR_HOST', 'AIRFLOW_CONN_GCLUSTER_DEFAULT', 'PATH', 'KEEP')}))"
    )
    result = subprocess.run(
        [str(ENTRYPOINT), sys.executable, "-c", probe],
        env=_entry_env(root, KEEP="kept"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["KEEP"] == "kept"
    assert seen["PATH"].split(os.pathsep)[0] == str(root / "bin")
    assert json.loads(seen["AIRFLOW_CONN_GCLUSTER_DEFAULT"])["extra"]["gcluster_path"] == str(
        root / "bin" / "gcluster"
    )
    assert _answers(seen["STORAGE_EMULATOR_HOST"])

    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert not (root / "compose.env").exists()
    assert not _answers(seen["STORAGE_EMULATOR_HOST"])


def test_airflow_commands_wait_for_the_sandbox_then_give_up(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(ENTRYPOINT), "true"],
        env=_entry_env(tmp_path / "never-started", TPU_RL_SANDBOX_WAIT_SECONDS="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "is the fake-gcs-server service running?" in result.stderr
