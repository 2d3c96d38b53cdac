"""What ``gcloud`` prints: its errors (``ERROR: (gcloud.x) ...``, an API's error text)."""

from __future__ import annotations

from collections.abc import Callable

Write = Callable[[str], None]


class GcloudError(Exception):
    """An API/tool error: ``ERROR: (gcloud.x) <message>``, exit code 1 (or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def api_error_text(problem: str, account: str = "") -> str:
    """How gcloud prints an API error: ``NOT_FOUND: ...`` / ``PERMISSION_DENIED: ...``; for a 403
    it appends who the command ran as (googlecloudsdk/api_lib/util/exceptions.py
    HttpErrorPayload + core/credentials/store.py CredentialInfo.GetInfoString)."""
    message = problem
    if message.startswith("google.api_core.exceptions."):
        message = message.split(": ", 1)[-1].replace("404 ", "NOT_FOUND: ", 1)
    if message.startswith("PERMISSION_DENIED") and account:
        info = f"This command is authenticated as {account} which is the active account specified by the [core/account] property."
        message = message + " " + info if message.endswith(".") else message + ". " + info[:-1]
    return message
