"""What differs between the Airflow versions the provider supports, decided in one place.

The version flags are computed here from the installed Airflow rather than imported from
``airflow.providers.common.compat.version_compat``, which older common-compat releases lack
(that module itself asks providers to keep their own copy).
"""

from __future__ import annotations

from packaging.version import Version


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


__all__ = [
    "AIRFLOW_V_3_0_PLUS",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "airflow_version",
    "exponential_backoff",
]
