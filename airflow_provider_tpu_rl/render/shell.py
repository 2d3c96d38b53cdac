"""Building the few shell strings the tools require (gcluster ``--command``, SSH stage scripts).

Fixed fragments are constants; every value is passed through ``shlex.quote``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# How long the pod waits for the HF token secret to become readable: a 403 on the read is retried
# until then. The grant (HfTokenSecretOperator) can only come after the deploy, which creates the
# service accounts the pods run as, and a new IAM grant is not effective at once: "Changes to allow
# or deny policies typically propagate in 2 minutes, but could potentially take 7 minutes or
# longer" (Google Cloud IAM docs, "Access change propagation",
# https://cloud.google.com/iam/docs/access-change-propagation). Only the pod's own identity can
# observe when its grant took effect, so the pod waits, not an Airflow worker (the job operators are
# deferred meanwhile); 10 minutes covers the documented 7 with room; a grant still missing by then
# fails the read with the 403 as before.
SECRET_GRANT_WAIT_SECONDS = 600

# Reads one Secret Manager secret version with the workload's own credentials (workload identity
# on GKE). Runs inside the workload image, which has google-auth and requests (MaxText needs both
# for GCS), so the token never travels through Airflow, argv or the JobSet spec.
# Two answers mean "not yet" and are asked again, after a pause of half the time waited so far (1 s
# at least, 15 s at most), until SECRET_GRANT_WAIT_SECONDS, each wait one line on stderr naming the
# secret (never its value):
# - a 403 (PERMISSION_DENIED: the secret's new grant has not propagated yet);
# - google-auth's RefreshError or TransportError: the pod's own token could not be had, as while
#   the cluster's Workload Identity binding (made by the deploy minutes earlier) is not in effect:
#   the GKE metadata server's 403 is not an HTTP error of the read but google-auth's TransportError
#   ("Failed to retrieve ... Status: 403", compute_engine/_metadata.py, not retried there) raised as
#   RefreshError (compute_engine/credentials.py _perform_refresh_token; google-auth 2.63.0).
# The read runs on a one-thread pool so that its outcome, an answer or an exception, is a value
# (``Future.exception()``) the one-line filter can look at. Any other outcome ends the loop:
# raise_for_status fails the && chain on an error (404, or a 403 past the wait), an exception past
# the wait is raised; each request has a 60 s timeout.
# One line (pathways_jobset.tmpl puts the command in a YAML block scalar), so the loop is
# ``next()`` over ``iter(submit, 0)`` (a sentinel never returned) with the wait as its filter.
# It holds no single quote, so ``shlex.quote`` wraps it in plain single quotes.
_READ_SECRET_PY = (
    "import sys,time,base64,concurrent.futures as f,google.auth,google.auth.exceptions as e,"
    "google.auth.transport.requests as r;"
    'c,_=google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"]);'
    's=r.AuthorizedSession(c);u="https://secretmanager.googleapis.com/v1/"+sys.argv[1]+":access";'
    f"p=f.ThreadPoolExecutor(1);t=time.monotonic();d=t+{SECRET_GRANT_WAIT_SECONDS};"
    'y=lambda x:("403 PERMISSION_DENIED: a new IAM grant takes minutes to take effect" '
    'if x.result().status_code==403 else "") if x.exception() is None else '
    '(type(x.exception()).__name__+": the pod has no token yet; a new Workload Identity binding takes '
    'minutes to take effect" if isinstance(x.exception(),(e.RefreshError,e.TransportError)) else "");'
    'w=lambda x:y(x)!="" and time.monotonic()<d and sys.stderr.write('
    '"HF token secret "+sys.argv[1]+" not readable yet ("+y(x)+"); waited %d of %d s, retrying\\n"'
    "%(time.monotonic()-t,d-t))>=0 and time.sleep(min(15,max(1,(time.monotonic()-t)/2))) is None;"
    "x=next(x for x in iter(lambda:p.submit(s.get,u,timeout=60),0) if not w(x)).result();"
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
