"""What differs between the Airflow and provider versions the provider supports, decided in one place.

The version flags are computed here from the installed Airflow rather than imported from
``airflow.providers.common.compat.version_compat``, which older common-compat releases lack
(that module itself asks providers to keep their own copy).

The names of ``airflow.providers.common.compat.sdk`` that arrived after common-compat 1.8.0 (the
first release with the ``sdk`` module, the provider's lower bound) are imported from here: the
installed common-compat's when it has them, else Airflow's own (see ``SDK_FALLBACKS``).
"""

from __future__ import annotations

import importlib
import os
import re
from typing import TYPE_CHECKING, Any

from packaging.version import Version

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowPlugin,
        AirflowSkipException,
        ParamValidationError,
        TaskDeferred,
        TaskInstanceKey,
        conf,
        mask_secret,
    )
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from google.api_core.client_options import ClientOptions


def airflow_version() -> tuple[int, int, int]:
    """The installed Airflow's (major, minor, micro), pre-release suffixes ignored."""
    from airflow import __version__

    version = Version(__version__)
    return version.major, version.minor, version.micro


AIRFLOW_V_3_0_PLUS: bool = airflow_version() >= (3, 0, 0)
# Airflow 3.2 (task SDK 1.2) made ``retry_exponential_backoff`` the backoff multiplier: a number.
# Before it (Airflow 2.x and 3.0-3.1) BaseOperator type-checks it as a bool and a true value
# doubles the delay at each try.
AIRFLOW_V_3_2_PLUS: bool = airflow_version() >= (3, 2, 0)
# Airflow 3.3 calls ``BaseTrigger.on_kill`` when a user kills a deferred task; before it a trigger
# tells a kill from a triggerer restart by the task's state (``safe_to_cancel``).
AIRFLOW_V_3_3_PLUS: bool = airflow_version() >= (3, 3, 0)
# The part of the trigger form that is open when it loads. Airflow 3: the default section "Run
# Parameters" (params without a section go there too). Airflow 2's www/templates/airflow/trigger.html:
# the params without a section, in the "DAG conf Parameters" panel; every section starts collapsed.
FORM_OPEN_SECTION: str | None = "Run Parameters" if AIRFLOW_V_3_0_PLUS else None
# Whether the trigger form's dropdown can submit null. Airflow 2's trigger.html writes every enum
# option as its str(), so a null choice submits the string "None", which the enum then refuses: the
# untouched form could not be submitted. There a nullable choice is a text field proposing the choices.
FORM_NULL_CHOICE: bool = AIRFLOW_V_3_0_PLUS
# Whether a boolean field needs "null" in its type not to be marked required. Airflow 3's form marks
# every field whose schema type does not include "null" (FlexibleForm's isRequired) and renders a
# switch for a ["boolean", "null"] type (the first type that is not "null"); Airflow 2's
# trigger.html never marks a boolean and renders its checkbox only for the type "boolean" itself.
FORM_BOOLEAN_NULLABLE: bool = AIRFLOW_V_3_0_PLUS


def exponential_backoff(multiplier: float = 2.0) -> bool | float:
    """The ``retry_exponential_backoff`` argument for a delay growing ``multiplier``-fold per try.

    On Airflow 3.2 and later it is the multiplier itself, a float (a task's ``True`` would be
    read as 1, a constant delay, until the DAG is serialized). Earlier versions accept only a
    bool, and ``True`` doubles the delay, so only the default multiplier of 2 is available
    there: another one raises ValueError rather than silently doubling.
    """
    if AIRFLOW_V_3_2_PLUS:
        return float(multiplier)
    if multiplier != 2.0:
        raise ValueError(
            f"Airflow before 3.2 only doubles the retry delay; a multiplier of {multiplier} needs Airflow 3.2+"
        )
    return True


# Airflow 2 fails a task that raised SystemExit with the text "Task failed due to SystemExit(<code>)"
# (models/taskinstance.py, _run_raw_task), which its failure callbacks then get as the exception.
_AIRFLOW_2_SYSTEM_EXIT = re.compile(r"Task failed due to SystemExit\((.*)\)", re.DOTALL)


def task_error(error: BaseException | str | None) -> BaseException | str | None:
    """A failure callback's ``context["exception"]`` as the task raised it (Airflow 2's wrapper removed)."""
    if isinstance(error, str):
        found = _AIRFLOW_2_SYSTEM_EXIT.fullmatch(error)
        if found:
            return found.group(1)
    return error


# name -> where Airflow itself has it (Airflow 3 task SDK first, then Airflow 2), for a
# common-compat older than the release that added the name to its ``sdk`` module.
SDK_FALLBACKS: dict[str, tuple[str, ...]] = {
    "AirflowFailException": ("airflow.sdk.exceptions", "airflow.exceptions"),  # common-compat 1.10.0
    "AirflowSkipException": ("airflow.sdk.exceptions", "airflow.exceptions"),  # 1.10.0
    "TaskDeferred": ("airflow.sdk.exceptions", "airflow.exceptions"),  # 1.10.0
    "ParamValidationError": ("airflow.sdk.exceptions", "airflow.exceptions"),  # 1.10.0
    "AirflowException": ("airflow.sdk.exceptions", "airflow.exceptions"),  # 1.11.0
    "AirflowNotFoundException": ("airflow.sdk.exceptions", "airflow.exceptions"),  # 1.11.0
    "AirflowPlugin": ("airflow.sdk.plugins_manager", "airflow.plugins_manager"),  # not in 1.8.0
    "conf": ("airflow.sdk.configuration", "airflow.configuration"),  # 1.12.0
    "TaskInstanceKey": ("airflow.sdk.types", "airflow.models.taskinstancekey"),  # 1.13.0
    "mask_secret": (  # 1.22.0
        "airflow.sdk.log",
        "airflow.sdk.execution_time.secrets_masker",
        "airflow.utils.log.secrets_masker",
    ),
}


def sdk_name(name: str) -> Any:
    """``airflow.providers.common.compat.sdk.<name>``, or Airflow's own when that release lacks it."""
    from airflow.providers.common.compat import sdk

    try:
        return getattr(sdk, name)
    except (AttributeError, ImportError):
        pass
    for module in SDK_FALLBACKS.get(name, ()):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(f"neither common.compat.sdk nor Airflow has {name!r}")


def __getattr__(name: str) -> Any:
    """The ``SDK_FALLBACKS`` names, resolved on first use (importing them loads Airflow)."""
    if name not in SDK_FALLBACKS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = sdk_name(name)
    globals()[name] = value
    return value


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (default false): the default ``deferrable`` of every job
    operator and sensor of this provider, read as the google provider's operators read it
    (``conf.getboolean("operators", "default_deferrable", fallback=False)``)."""
    return bool(sdk_name("conf").getboolean("operators", "default_deferrable", fallback=False))


def web_base_url() -> str:
    """The Airflow UI's URL without a trailing slash: ``[api] base_url`` on Airflow 3 (the API
    server serves the UI), ``[webserver] base_url`` on Airflow 2; empty when not set."""
    section = "api" if AIRFLOW_V_3_0_PLUS else "webserver"
    value = sdk_name("conf").get(section, "base_url", fallback="") or ""
    return str(value).rstrip("/")


def client_options(hook: GoogleBaseHook, api_endpoint_override: str | None = None) -> ClientOptions:
    """``hook.get_client_options(...)``, which the google provider has only since 22.0.0.

    Before it: the same choice, written out (an endpoint override, else the universe domain of
    ``GOOGLE_CLOUD_UNIVERSE_DOMAIN``, else the defaults).
    """
    get_client_options = getattr(hook, "get_client_options", None)
    if get_client_options is not None:
        return get_client_options(api_endpoint_override=api_endpoint_override)
    from google.api_core.client_options import ClientOptions

    if api_endpoint_override:
        return ClientOptions(api_endpoint=api_endpoint_override)
    universe_domain = os.getenv("GOOGLE_CLOUD_UNIVERSE_DOMAIN")
    if universe_domain:
        return ClientOptions(universe_domain=universe_domain)
    return ClientOptions()


__all__ = [
    "AIRFLOW_V_3_0_PLUS",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "FORM_BOOLEAN_NULLABLE",
    "FORM_NULL_CHOICE",
    "FORM_OPEN_SECTION",
    "SDK_FALLBACKS",
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowPlugin",
    "AirflowSkipException",
    "ParamValidationError",
    "TaskDeferred",
    "TaskInstanceKey",
    "airflow_version",
    "client_options",
    "conf",
    "default_deferrable",
    "exponential_backoff",
    "mask_secret",
    "sdk_name",
    "task_error",
    "web_base_url",
]
