"""The provider's own errors. Hooks raise these; operators decide what is fatal.

A hook never raises ``AirflowFailException``: an operator turns a :class:`ConfigurationError`,
or a :class:`CommandError` whose :attr:`~CommandError.retryable` is false, into one (see
``operators.base.fail_fast``), so a bad setting stops the task without burning its retries.
"""

from __future__ import annotations

import enum
from typing import Any

from airflow_provider_tpu_rl.compat import AirflowException


class FailureKind(enum.Enum):
    """Why a command failed, as far as its output tells."""

    CAPACITY = "capacity"  # stockout or quota: worth retrying later
    TRANSIENT = "transient"  # network, rate limit, 5xx, timeout: worth retrying
    CONFIG = "config"  # anything else: a retry would fail the same way

    @property
    def retryable(self) -> bool:
        return self is not FailureKind.CONFIG


class TpuRlError(AirflowException):
    """Base of every error this provider raises."""


class ConfigurationError(TpuRlError):
    """A setting, connection, secret or local tool is wrong or missing; a retry fails the same way."""


class ClusterNotFoundError(ConfigurationError):
    """The GKE API says the cluster does not exist (deleted, or never created there)."""


class ClassifiedError(TpuRlError):
    """An error that knows whether a retry may help (:attr:`kind`)."""

    def __init__(self, message: str, kind: FailureKind = FailureKind.CONFIG) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def retryable(self) -> bool:
        return self.kind.retryable


class CommandError(ClassifiedError):
    """A ``gcluster``/``gcloud`` command failed; :attr:`kind` says whether a retry may help."""


class OutputParseError(TpuRlError):
    """A command succeeded but printed something this provider cannot parse."""


class KubernetesApiError(ClassifiedError):
    """A GKE or Kubernetes API call failed; :attr:`kind` says whether a retry may help."""

    def __init__(self, message: str, kind: FailureKind = FailureKind.TRANSIENT) -> None:
        super().__init__(message, kind)


class LeaseHeldError(TpuRlError):
    """Another run holds the cluster's lease: ``cluster X is in use by run Y until <UTC time>``."""


class LeaseLostError(TpuRlError):
    """This run's cluster lease was released, taken over or keeps changing under it."""


class RunDirBusyError(TpuRlError):
    """Another live run's job claims the run directory (one writer per directory); ``writer`` is
    its :class:`~airflow_provider_tpu_rl.records.run_dirs.WriterClaim`."""

    def __init__(self, message: str, writer: Any) -> None:
        super().__init__(message)
        self.writer = writer
