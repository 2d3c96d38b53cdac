"""Parse a DAG folder in a fresh interpreter with the network and process spawning cut off.

Usage: ``python parse_guard.py DAG_FOLDER``. Prints one JSON object: the DagBag's import errors and
DAG ids, every socket operation and every process spawn attempted while Airflow, the provider and
the DAG files were imported. Run it with PATH pointing at fake cloud tools only (see the test).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any

attempts: list[str] = []


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        attempts.append(f"{what}{args[1:] if what.startswith('socket.') else args}")
        raise OSError(f"parse guard: {what} is not allowed while parsing DAGs")

    return refused


for method in ("connect", "connect_ex", "sendto", "sendmsg"):
    setattr(socket.socket, method, _refuse(f"socket.{method}"))
for function in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "create_connection"):
    setattr(socket, function, _refuse(function))

spawned: list[list[str]] = []
_real_popen_init = subprocess.Popen.__init__


def _record_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    spawned.append([str(args)] if isinstance(args, str | bytes) else [str(arg) for arg in args])
    _real_popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _record_popen  # type: ignore[method-assign]


def main(folder: str) -> None:
    try:
        from airflow.dag_processing.dagbag import DagBag

        options: dict[str, bool] = {}
    except ImportError:  # Airflow 2, which also reads its example DAGs unless told not to
        from airflow.models.dagbag import DagBag

        options = {"include_examples": False}

    bag = DagBag(dag_folder=folder, **options)
    print(
        json.dumps(
            {
                "import_errors": bag.import_errors,
                "dag_ids": sorted(bag.dags),
                "attempts": attempts,
                "spawned": spawned,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
