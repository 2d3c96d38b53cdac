"""Classify a failed command's output: capacity, transient, or a configuration error.

The kinds (:class:`~airflow_provider_tpu_rl.exceptions.FailureKind`) and the error a failed command
raises (:class:`~airflow_provider_tpu_rl.exceptions.CommandError`) live in
:mod:`airflow_provider_tpu_rl.exceptions`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from airflow_provider_tpu_rl.exceptions import FailureKind
from airflow_provider_tpu_rl.spec.preflight import gcloud_reason

__all__ = ["FailureKind", "capacity_refused", "classify_failure", "classify_workload", "error_line"]

_CAPACITY_PATTERNS = (
    re.compile(r"GCE_STOCKOUT"),
    re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED"),
    re.compile(r"INSUFFICIENT_CAPACITY"),
    re.compile(r"does not have enough resources available", re.IGNORECASE),
    re.compile(r"Quota '[^'\n]*' exceeded", re.IGNORECASE),
    re.compile(r"\bquota exceeded\b", re.IGNORECASE),
    re.compile(r"QUOTA_EXCEEDED"),
)

# A reservation with no room left for the request: Compute Engine's CONDITION_NOT_MET text, which
# kubernetes/autoscaler's gce client (cloudprovider/gce/autoscaling_gce_client.go,
# isReservationCapacityExceeded) reads as RESERVATION_CAPACITY_EXCEEDED. Not a retryable failure of
# a one-kind create (a full reservation stays full: preflight checks its room), but the reservation
# kind's refusal for a create that has other kinds to fall through to.
_RESERVATION_FULL = re.compile(r"Specified reservation \S+ does not have available resources for the request")

_TRANSIENT_PATTERNS = (
    # An HTTP status next to a word that says it is one: "Error 503", "HTTP 502", "status code: 429",
    # "googleapi: Error 500:", "429 Too Many Requests" ... but not "500GB" or "--port=502".
    re.compile(
        r"\b(?:error|http(?:/\d(?:\.\d)?)?|status(?:\s*code)?|code|response)\W{0,3}(?:429|500|502|503|504)\b",
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(?:429|500|502|503|504)\s+(?:Too Many Requests|Internal Server Error|Bad Gateway|"
        r"Service Unavailable|Gateway Time-?out)\b",
        re.IGNORECASE,
    ),
    re.compile(r"\b(?:user)?rateLimitExceeded\b", re.IGNORECASE),
    re.compile(r"\bToo Many Requests\b", re.IGNORECASE),
    re.compile(r"connection reset", re.IGNORECASE),
    re.compile(r"connection refused", re.IGNORECASE),
    # kubectl: "The connection to the server 34.1.2.3 was refused - did you specify the right host
    # or port?"; Terraform wraps its messages at 78 columns ("connect:\nconnection refused").
    re.compile(r"\bconnection to the server \S+ was refused", re.IGNORECASE),
    re.compile(r"\bconnect:\s+connection refused", re.IGNORECASE),
    # Terraform's state lock is held by another run (or an interrupted one, until it expires or
    # is unlocked): "Error: Error acquiring the state lock" (internal/command/clistate/state.go,
    # LockErrorMessage). gcluster plans with tfexec's "-lock-timeout=0s", so it fails at once.
    re.compile(r"Error acquiring the state lock", re.IGNORECASE),
    # apt or dpkg busy on a VM (its image's unattended-upgrades after boot): apt-pkg's GetLock says
    # "Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1033 (unattended-upgr)".
    re.compile(r"Could not get lock /var/(?:lib/(?:dpkg|apt/lists)|cache/apt/archives)/"),
    re.compile(r"i/o timeout", re.IGNORECASE),
    re.compile(r"TLS handshake timeout", re.IGNORECASE),
    re.compile(r"context deadline exceeded|DEADLINE_EXCEEDED", re.IGNORECASE),
    re.compile(r"timeout awaiting response headers", re.IGNORECASE),
    re.compile(r"service (?:is currently )?unavailable", re.IGNORECASE),
    re.compile(r"\bbackendError\b"),
    re.compile(r"server is currently unable to handle the request", re.IGNORECASE),
    re.compile(r"etcdserver: request timed out", re.IGNORECASE),
    re.compile(r"unexpected EOF", re.IGNORECASE),
    re.compile(r"temporary failure in name resolution", re.IGNORECASE),
    # SSH to a TPU VM that is still booting, or a dropped session (gcloud compute ssh exits 255).
    re.compile(
        r"ssh: connect to host .* (?:Connection timed out|Connection refused|No route to host)", re.IGNORECASE
    ),
    re.compile(
        r"Connection timed out during banner exchange|Connection closed by remote host", re.IGNORECASE
    ),
    # The keepalive of render/tpu_vm.SSH_FLAGS gave up (OpenSSH clientloop.c server_alive_check).
    re.compile(r"Timeout, server \S+ not responding", re.IGNORECASE),
    # Compute Engine operations racing each other ("The resource '…' is not ready").
    re.compile(r"The resource '[^'\n]*' is not ready", re.IGNORECASE),
    re.compile(r"\bresourceNotReady\b"),
    # Terraform destroy racing GCE's own cleanup: a network still used by a firewall rule or a
    # subnetwork is freed a moment later (gcluster destroy --robust retries the same way).
    re.compile(r"is already being used by", re.IGNORECASE),
)

# A workload that lost its TPUs, in its own words. JAX raises the runtime's status as
# ``jax.errors.JaxRuntimeError: <CODE>: …`` (``XlaRuntimeError`` before jax 0.4.36); a lost or
# restarting slice surfaces as DATA_LOSS, UNAVAILABLE or DEADLINE_EXCEEDED: pathwaysutils'
# ``elastic.py`` treats DATA_LOSS as a slice certainly down and DEADLINE_EXCEEDED as one that may
# be (AI-Hypercomputer/pathways-utils), and the TPU runtime reports an unreachable worker as
# UNAVAILABLE. GKE's kubelet ends a pod on a node being reclaimed with "Pod was terminated in
# response to imminent node shutdown." (kubernetes pkg/kubelet/nodeshutdown, a Spot/preempted VM).
_WORKLOAD_TRANSIENT_PATTERNS = (
    re.compile(r"\b(?:Jax|Xla)RuntimeError: (?:UNAVAILABLE|DATA_LOSS|DEADLINE_EXCEEDED|ABORTED)\b"),
    re.compile(r"\bslice became unhealthy\b", re.IGNORECASE),
    re.compile(r"terminated in response to imminent node shutdown", re.IGNORECASE),
    re.compile(r"\bpreempted\b", re.IGNORECASE),
)

# A line that says what went wrong: a Python exception's last line, gcloud's "ERROR: (gcloud…)",
# Terraform's "│ Error: …", apt's "E: …", a JAX status code, kubectl's "error: …".
_ERROR_LINE = re.compile(
    r"(?:^|[\s│|:])(?:[A-Za-z_][\w.]*(?:Error|Exception)\b|ERROR\b|Error\b|error:|FATAL\b|fatal:|E: )"
    r"|RESOURCE_EXHAUSTED|\bTraceback\b"
)
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*")


def error_line(lines: Sequence[str]) -> str | None:
    """The line that says what went wrong: the last one that looks like an error (a traceback's
    exception, ``ERROR:``, Terraform's ``│ Error:``), box drawing and blanks stripped, with gcloud's
    reason when its ``ERROR:`` line leaves it to the next lines (:func:`gcloud_reason`); None if none."""
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if _ERROR_LINE.search(line) and "Traceback (most recent call last)" not in line:
            text = line.strip().strip("│|").strip()
            if text.startswith("ERROR: (gcloud"):
                text = " ".join([text, *gcloud_reason(lines, index)])
            if text:
                return text if len(text) <= 400 else text[:397] + "..."
    return None


def classify_workload(lines: Sequence[str]) -> tuple[FailureKind, str | None]:
    """What a failed workload's last log lines say: TRANSIENT when they show lost capacity, a lost
    or restarting slice, a preempted node or a 5xx/429 (a retry may pass); CONFIG (the workload's
    own error: its config or code, a retry fails the same way) when they end in a Python
    traceback's exception without any of those; TRANSIENT when they say nothing clear.

    Returns the kind and the error line to quote.
    """
    text = "\n".join(lines)
    line = error_line(lines)
    if any(
        p.search(text) for p in (*_CAPACITY_PATTERNS, *_TRANSIENT_PATTERNS, *_WORKLOAD_TRANSIENT_PATTERNS)
    ):
        return FailureKind.TRANSIENT, line
    if _TRACEBACK in text:
        after = text.rsplit(_TRACEBACK, 1)[1].splitlines()
        if any(_EXCEPTION_LINE.match(item.strip()) for item in after):
            return FailureKind.CONFIG, line
    return FailureKind.TRANSIENT, line


def classify_failure(output: str) -> FailureKind:
    """Tell what kind of failure ``output`` (the combined stdout/stderr) shows.

    Capacity wins over transient (a stockout often comes with a 503 around it); anything not
    recognised is a configuration error, which must not burn retries.
    """
    if any(p.search(output) for p in _CAPACITY_PATTERNS):
        return FailureKind.CAPACITY
    if any(p.search(output) for p in (*_TRANSIENT_PATTERNS, *_WORKLOAD_TRANSIENT_PATTERNS)):
        return FailureKind.TRANSIENT
    return FailureKind.CONFIG


def capacity_refused(output: str) -> bool:
    """Whether a create was refused for lack of its kind of capacity: a stockout, a quota, a full
    reservation. Such a refusal moves an ordered ``capacity`` list to its next kind; anything else
    (a transient or a configuration failure) does not."""
    return any(p.search(output) for p in (*_CAPACITY_PATTERNS, _RESERVATION_FULL))
