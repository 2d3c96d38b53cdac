"""Validation rules shared by the specs. Every check raises SpecError naming field and rule."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from airflow_provider_tpu_rl.spec.errors import SpecError, short_repr

GKE_CLUSTER_NAME = re.compile(r"^[a-z](?:[a-z0-9-]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z](?:[-a-z0-9]*[a-z0-9])?$")
PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
ZONE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
GCE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
GCS_OBJECT_PATH = re.compile(r"^[A-Za-z0-9._=+@,-]+(?:/[A-Za-z0-9._=+@,-]+)*/?$")
IMAGE = re.compile(
    r"^[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]+)?(?:/[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)+"
    r"(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAXTEXT_KEY = re.compile(r"^[a-z_][a-z0-9_.]*$")
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOPOLOGY = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
# Secret Manager ids are [A-Za-z0-9_-]{1,255}; one starting with "-" would reach gcloud's argv
# as a flag ("--help" prints help and exits 0), so the spec refuses it.
SECRET_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,254}$")
CONN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")
SERVICE_ACCOUNT = re.compile(
    r"^[a-z][a-z0-9-]{4,61}[a-z0-9]@[a-z0-9.-]+\.iam\.gserviceaccount\.com$|^[0-9]+-compute@developer\.gserviceaccount\.com$"
)
DURATION = re.compile(r"^[0-9]+(?:s|m|h)$")
# An Artifact Registry repository ID as the run names it: lowercase letters, digits and hyphens,
# a letter first, no hyphen last, 63 at most (the GCE-name form; Artifact Registry's create page
# asks for lowercase letters, numbers and hyphens: inference that the stricter form is accepted).
REPOSITORY_ID = GCE_NAME
# What the spec says when a value breaks a pattern: SpecError's rule, and the trigger form's
# description of the field (pipelines/form.py), so the form shows it next to the field.
GKE_CLUSTER_NAME_RULE = (
    "GKE cluster name must start with a lowercase letter, use only lowercase letters, digits and "
    "hyphens, and not end with a hyphen"
)
PROJECT_ID_RULE = (
    "project ID must be 6-30 lowercase letters, digits or hyphens, start with a letter and not end "
    "with a hyphen"
)
REGION_RULE = "region must look like 'us-east5' or 'europe-west4'"
ZONE_RULE = "zone must look like 'us-east5-b'"
BUCKET_CHARS_RULE = (
    "bucket name must use only lowercase letters, digits, dots, hyphens and underscores, and start "
    "and end with a letter or digit"
)
IMAGE_RULE = (
    "container image must be a lowercase registry/path, then an optional :tag and an optional "
    "@sha256: digest, like us-docker.pkg.dev/project/repo/image:1.0"
)
REPOSITORY_ID_RULE = (
    "Artifact Registry repository ID must be 1-63 lowercase letters, digits or hyphens, start with a "
    "letter and not end with a hyphen"
)
HF_REPO_ID_RULE = "Hugging Face repo id like org/model"
RUN_NAME_RULE = (
    "run name must be 1-63 letters, digits, dots, hyphens or underscores, starting with a letter or digit"
)
CONN_ID_RULE = "connection id must be letters, digits, dots, hyphens or underscores"
SECRET_ID_RULE = (
    "secret id must be 1-255 letters, digits, hyphens or underscores, not starting with a hyphen "
    "(gcloud would take it for a flag)"
)
SERVICE_ACCOUNT_RULE = "must be a service account e-mail"
# An account an impersonation chain names: a service account's e-mail (user-managed, a service
# agent, the default compute or App Engine one) or its numeric unique ID, as the IAM Credentials
# API takes it (``projects/-/serviceAccounts/{email or unique ID}``). No comma, space or control
# character: gcloud splits a chain on commas and strips spaces, the google provider does not.
IMPERSONATED_ACCOUNT = re.compile(
    r"^(?:[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com|[0-9]{1,30})$"
)
IMPERSONATION_CHAIN_RULE = (
    "must be a service account e-mail, or a delegation chain: a list of them (or one string of them "
    "separated by commas, as gcloud reads it), the last one impersonated"
)
MAXTEXT_KEY_RULE = (
    "MaxText override keys must be lowercase letters, digits, underscores and dots, starting with a "
    "letter or underscore"
)


def gce_name_rule(what: str) -> str:
    """The rule of a Compute Engine name (``what``: "VM name", "reservation name", ...)."""
    return (
        f"{what} must be 1-63 lowercase letters, digits or hyphens, start with a letter and not end "
        "with a hyphen"
    )


# C0/C1 controls and the Unicode line separators: YAML (the JobSet spec gcluster writes) and
# Python both break lines at \x85, \u2028 and \u2029, not only at \n.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def require_str(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SpecError(field, "must be a string", value)
    return value


def match(field: str, value: Any, pattern: re.Pattern[str], rule: str) -> str:
    text = require_str(field, value)
    if not pattern.fullmatch(text):
        raise SpecError(field, rule, value)
    return text


def max_len(field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise SpecError(field, f"must be at most {limit} characters, has {len(value)}", value)
    return value


def gke_cluster_name(field: str, value: Any) -> str:
    text = match(
        field,
        value,
        GKE_CLUSTER_NAME,
        GKE_CLUSTER_NAME_RULE,
    )
    return max_len(field, text, 20)


def job_name(field: str, value: Any) -> str:
    text = match(field, value, DNS_1035, "job name must be DNS-1035: [a-z]([-a-z0-9]*[a-z0-9])?")
    return max_len(field, text, 28)


def project_id(field: str, value: Any) -> str:
    return match(
        field,
        value,
        PROJECT_ID,
        PROJECT_ID_RULE,
    )


def region(field: str, value: Any) -> str:
    return match(field, value, REGION, REGION_RULE)


def zone(field: str, value: Any, in_region: str | None) -> str:
    text = match(field, value, ZONE, ZONE_RULE)
    if in_region is not None:
        found = ZONE.fullmatch(text)
        assert found is not None
        if found.group(1) != in_region:
            raise SpecError(field, f"zone must be inside region {in_region!r}", value)
    return text


def gce_name(field: str, value: Any, what: str) -> str:
    return match(field, value, GCE_NAME, gce_name_rule(what))


def bucket_name(field: str, value: Any) -> str:
    """Cloud Storage bucket naming rules."""
    text = require_str(field, value)
    if text.startswith("gs://"):
        raise SpecError(field, "give the bucket name without 'gs://'", value)
    if not BUCKET_CHARS.fullmatch(text):
        raise SpecError(
            field,
            BUCKET_CHARS_RULE,
            value,
        )
    if ".." in text or ".-" in text or "-." in text:
        raise SpecError(field, "bucket name must not contain '..', '.-' or '-.'", value)
    if "." in text:
        if len(text) > 222 or any(len(part) > 63 or not part for part in text.split(".")):
            raise SpecError(field, "dotted bucket names: at most 222 characters, 63 per part", value)
    elif not 3 <= len(text) <= 63:
        raise SpecError(field, "bucket name must be 3-63 characters", value)
    if text.startswith("goog") or "google" in text or "g00gle" in text:
        raise SpecError(field, "bucket name must not start with 'goog' or contain 'google'", value)
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        pass
    else:
        raise SpecError(field, "bucket name must not be an IP address", value)
    return text


def gs_uri(field: str, value: Any) -> str:
    """A well-formed ``gs://bucket/path`` URI with a safe object path."""
    text = require_str(field, value)
    if not text.startswith("gs://"):
        raise SpecError(field, "must be a gs:// URI", value)
    rest = text[5:]
    bucket, _, path = rest.partition("/")
    bucket_name(field, bucket)
    if path and (not GCS_OBJECT_PATH.fullmatch(path) or ".." in path.split("/")):
        raise SpecError(field, "object path may use only [A-Za-z0-9._=+@,-] segments separated by '/'", value)
    return text


def image(field: str, value: Any) -> str:
    return match(field, value, IMAGE, IMAGE_RULE)


def one_of(field: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value``, one of ``choices``."""
    if value not in choices:
        raise SpecError(field, f"must be one of {list(choices)}", value)
    return str(value)


def cidr(field: str, value: Any) -> str:
    text = require_str(field, value)
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as err:
        raise SpecError(field, f"must be an IP network in CIDR form ({err})", value) from None
    if "/" not in text or str(net) != text:
        raise SpecError(field, "must be an IP network in canonical CIDR form like 0.0.0.0/0", value)
    return text


def int_range(field: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, "must be an integer", value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise SpecError(field, f"must be {bound}", value)
    return value


def integer(field: str, value: Any, low: int, high: int | None = None) -> int:
    """``int_range`` that also takes the text a Jinja template renders an integer to."""
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        value = int(value.strip())
    return int_range(field, value, low, high)


def boolean(field: str, value: Any) -> bool:
    """A boolean, or the text a Jinja template renders one to (``True``/``false``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise SpecError(field, "must be true or false", value)


def fraction(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, "must be a number", value)
    if not 0 < value <= 1:
        raise SpecError(field, "must be in (0, 1]", value)
    return float(value)


def single_line(field: str, value: str) -> str:
    """Values end up in a one-line shell command pasted into YAML: no control characters or line breaks."""
    if _CONTROL.search(value):
        raise SpecError(field, "must not contain control characters or newlines", value)
    return value


def maxtext_key(field: str, key: Any) -> str:
    return match(field, key, MAXTEXT_KEY, MAXTEXT_KEY_RULE)


def impersonation_accounts(field: str, value: Any) -> tuple[str, ...]:
    """The accounts of an ``impersonation_chain``, read as gcloud and the google provider both
    read them; () when empty (``None``, ``""``, ``[]``).

    gcloud reads ``CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT`` as a comma-separated chain, each
    item stripped, the last the target (googlecloudsdk/core/credentials/store.py
    ``ParseImpersonationAccounts``); the google provider reads a string argument as one account
    and a list as delegates then the target (``credentials_provider._get_target_principal_and_delegates``).
    So a string is split on commas here, and every account must be one service account (no comma,
    space, or empty item between commas), so both read the same chain. A blank string is none, and
    so are a list's blank items (templates rendered empty).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        items: list[Any] = [item.strip() for item in value.split(",")]
    elif isinstance(value, list | tuple):
        # a rendered list of templates: an item left empty (an empty param) is no account
        items = [item.strip() if isinstance(item, str) else item for item in value]
        items = [item for item in items if item != ""]
    else:
        raise SpecError(field, IMPERSONATION_CHAIN_RULE, value)
    for item in items:
        if not isinstance(item, str) or not IMPERSONATED_ACCOUNT.fullmatch(item):
            raise SpecError(field, f"{IMPERSONATION_CHAIN_RULE}; {_short_item(item)} is not one", value)
    return tuple(items)


def _short_item(item: Any) -> str:
    return "an empty item" if item == "" else short_repr(item, 80)
