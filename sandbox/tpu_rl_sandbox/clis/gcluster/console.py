"""What every fake ``gcluster`` call needs before its command runs: gcluster's logging
(:class:`Console`), the errors that end a call (:class:`Fatal`, :class:`JobError`) and the stdin
line reader. Apart from :mod:`.deploy` and :mod:`.jobs`, which a call imports only when its command
is theirs (each fake call is a new interpreter; the suite makes thousands)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from tpu_rl_sandbox.world.timestamps import rfc3339


class Fatal(Exception):
    """``logging.Fatal``: ``<ts>: <message>`` on stderr, exit code (1 unless said otherwise)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class JobError(Exception):
    """A RunE error: cobra prints ``Error: <message>``, exit code 1."""


class Console:
    """gcluster's logging: ``<RFC3339>: msg`` on stdout (Info) or stderr (Error/Fatal)."""

    def __init__(self, out: Callable[[str], None], err: Callable[[str], None]) -> None:
        self.out = out
        self.err = err

    def info(self, message: str) -> None:
        self.out(f"{rfc3339()}: {message}\n")

    def error(self, message: str) -> None:
        self.err(f"{rfc3339()}: {message}\n")

    def terraform(self, text: str, stream: str = "out") -> None:
        """Terraform output through gcluster's timestamp writer (no stamp on indented/empty lines)."""
        write = self.out if stream == "out" else self.err
        for line in text.splitlines():
            if not line or line[0] in " \t":
                write(line + "\n")
            else:
                write(f"{rfc3339()} {line}\n")


def read_stdin_line() -> str | None:
    """One line from stdin, ``None`` at EOF (what Go's ``ReadString('\\n')`` reports as EOF)."""
    if sys.stdin is None:
        return None
    line = sys.stdin.readline()
    return line if line.endswith("\n") else None
