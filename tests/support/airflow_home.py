"""A migrated SQLite metadata database for a test's own ``AIRFLOW_HOME``, built once per session.

``airflow db migrate`` costs several seconds of CPU, and every end-to-end module, the DAG runs and
the operator guide's run each need a fresh metadata database. The first caller of a pytest
invocation (its xdist workers included: they share ``TPU_RL_TEST_HOME``) migrates a template for
the running Airflow install under a file lock; every caller then gets a copy of its file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
_HOME_ENV = "TPU_RL_TEST_HOME"  # set by tests/conftest.py before anything imports Airflow
_DB = "airflow.db"


def _template_dir() -> Path:
    install = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    return Path(os.environ[_HOME_ENV]) / "migrated-metadata" / install


def migrate_into(home: Path, env: Mapping[str, str]) -> None:
    """Give ``home`` (an ``AIRFLOW_HOME``) a migrated SQLite metadata database.

    ``env`` is the environment the home's Airflow processes run with; the template is migrated
    with it, its ``AIRFLOW_HOME`` pointing at the template's own folder.
    """
    template = _template_dir()
    template.mkdir(parents=True, exist_ok=True)
    with open(template / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / _DB).is_file():
            airflow_home = template / "home"
            airflow_home.mkdir(exist_ok=True)
            subprocess.run(
                [AIRFLOW, "db", "migrate"],
                env={**env, "AIRFLOW_HOME": str(airflow_home)},
                capture_output=True,
                check=True,
                timeout=300,
            )
            # Published whole: a reader never sees a half-copied file.
            shutil.copyfile(airflow_home / _DB, template / f"{_DB}.part")
            (template / f"{_DB}.part").rename(template / _DB)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template / _DB, home / _DB)
