"""Building the few shell strings the tools require (gcluster ``--command``, SSH stage scripts).

Fixed fragments are constants; every value is passed through ``shlex.quote``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# Reads one Secret Manager secret version with the workload's own credentials (workload identity
# on GKE). Runs inside the workload image, which has google-auth and requests (MaxText needs both
# for GCS), so the token never travels through Airflow, argv or the JobSet spec.
# It holds no single quote, so ``shlex.quote`` wraps it in plain single quotes.
_READ_SECRET_PY = (
    "import sys,base64,google.auth,google.auth.transport.requests as r;"
    'c,_=google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"]);'
    'x=r.AuthorizedSession(c).get("https://secretmanager.googleapis.com/v1/"+sys.argv[1]+":access");'
    'x.raise_for_status();sys.stdout.write(base64.b64decode(x.json()["payload"]["data"]).decode())'
)


def quote_all(tokens: Iterable[str]) -> str:
    return " ".join(shlex.quote(t) for t in tokens)


def key_values(pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [f"{key}={value}" for key, value in pairs]


def hf_token_from_secret_manager(secret_resource: str) -> str:
    """``HF_TOKEN=…`` read in the pod; fails the chain when the secret cannot be read."""
    fetch = f"python3 -c {shlex.quote(_READ_SECRET_PY)} {shlex.quote(secret_resource)}"
    # An assignment is not word-split, so $(...) needs no double quotes around it.
    return f"HF_TOKEN=$({fetch}) && export HF_TOKEN"


# The shell variable (never exported) that holds the token in a TPU VM stage script.
HF_TOKEN_VAR = "tpu_rl_hf_token"


def hf_token_from_gcloud(secret_id: str, project: str) -> list[str]:
    """The same on a TPU VM, where the gcloud CLI is installed: into a shell variable that is not
    exported, so only the command given it by :func:`with_hf_token` sees it (not ``gcloud storage``
    or anything else the script runs)."""
    access = quote_all(
        ["gcloud", "secrets", "versions", "access", "latest", f"--secret={secret_id}", f"--project={project}"]
    )
    return [f"{HF_TOKEN_VAR}=$({access})"]


def with_hf_token(command: str) -> str:
    """``command`` (a quoted command line) run with ``HF_TOKEN`` in its environment alone."""
    return f'HF_TOKEN="${HF_TOKEN_VAR}" {command}'


def on_first_pod_only(body: str) -> str:
    """Run ``body`` only on pod index 0, as the tutorials' conversion jobs do."""
    return f'[ "$JOB_COMPLETION_INDEX" != "0" ] || {{ {body} ; }}'
