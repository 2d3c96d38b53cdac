"""A throwaway PostgreSQL server for tests, from Debian's ``postgresql`` package binaries.

``PostgresServer`` runs ``initdb`` into a fresh temporary folder, starts the server on a free
port of 127.0.0.1 with trust authentication, hands out databases, and stops and deletes it all.
PostgreSQL refuses to run as root: as root, the folder is given to the ``postgres`` OS user
(created when missing) and the binaries run through ``runuser -u postgres``.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

INSTALL_HINT = "run `make test` (it installs postgresql), or `apt-get install -y postgresql`"
_DATABASE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
OS_USER = "postgres"


def find_postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that has initdb, pg_ctl and postgres."""
    candidates = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        folder = Path(initdb).parent
        version = folder.parent.name
        if version.isdigit() and all((folder / tool).exists() for tool in ("pg_ctl", "postgres")):
            candidates.append((int(version), folder))
    return max(candidates)[1] if candidates else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _ensure_os_user() -> None:
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OS_USER],
            check=True,
            capture_output=True,
        )


class PostgresServer:
    """A PostgreSQL server in a temporary folder; use as a context manager."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = 0
        self.user = OS_USER
        self._root: Path | None = None
        self._as_root = os.geteuid() == 0
        self._started = False

    @property
    def data_dir(self) -> Path:
        assert self._root is not None, "server not started"
        return self._root / "data"

    @property
    def log_file(self) -> Path:
        assert self._root is not None, "server not started"
        return self._root / "server.log"

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if self._as_root:
            argv = ["runuser", "-u", OS_USER, "--", *argv]
        return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)

    def _check(self, argv: list[str]) -> None:
        result = self._run(argv)
        if result.returncode != 0:
            log = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
            raise RuntimeError(
                f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{log}"
            )

    def start(self) -> None:
        """initdb, then start the server; retries on another port if the chosen one was taken."""
        self._root = Path(tempfile.mkdtemp(prefix="tpu-rl-pg-"))
        if self._as_root:
            _ensure_os_user()
            shutil.chown(self._root, user=OS_USER, group=None)
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        self._check(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata",
                str(self.data_dir),
                "--username",
                self.user,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ]
        )
        last_error: RuntimeError | None = None
        for _attempt in range(3):
            self.port = free_port()
            options = (
                f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self._root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                self._check(
                    [
                        str(self.bin_dir / "pg_ctl"),
                        "--pgdata",
                        str(self.data_dir),
                        "--log",
                        str(self.log_file),
                        "--options",
                        options,
                        "--wait",
                        "--timeout",
                        "60",
                        "start",
                    ]
                )
            except RuntimeError as error:
                last_error = error
                continue
            self._started = True
            return
        raise last_error or RuntimeError("PostgreSQL did not start")

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        if self._started:
            self._run(
                [
                    str(self.bin_dir / "pg_ctl"),
                    "--pgdata",
                    str(self.data_dir),
                    "--mode",
                    "immediate",
                    "--wait",
                    "stop",
                ]
            )
            self._started = False
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def dsn(self, database: str = "postgres") -> str:
        """A libpq/SQLAlchemy-style URI; it is also an Airflow connection URI (conn_type postgres)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database; returns its URI."""
        if not _DATABASE_NAME.match(name):
            raise ValueError(f"not a plain database name: {name!r}")
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
