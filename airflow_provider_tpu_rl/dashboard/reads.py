"""What the dashboard shows, read through the provider's hooks: the ledger's runs and artifacts, the
run's curves PNG from GCS (bounded), the reward trend drawn from the ledger.

Every read is filtered by the DAG ids the viewer may read, which the web app passes in.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger
from airflow_provider_tpu_rl.ledger.plots import (
    PLOT_EXTRA_HINT,
    figure_png,
    matplotlib_available,
    reward_trend_figure,
    reward_trend_series,
)
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, RunSummary, StepRecord, make_run_id
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

log = logging.getLogger(__name__)

RUNS_SHOWN = 100
CURVES_READ_TIMEOUT_SECONDS = 30
CURVES_KIND = "curves"


class NotFound(LookupError):
    """What the page asks for is not in the ledger (or not among the viewer's DAGs)."""


@dataclass(frozen=True)
class RunView:
    """One run's page: its summary, where its outputs are and its stages (latest try of each task)."""

    run: RunSummary
    artifacts: tuple[ArtifactRecord, ...]
    steps: tuple[StepRecord, ...] = ()

    @property
    def curves_uri(self) -> str | None:
        """The ``gs://`` URI of the run's curves PNG, if one was recorded."""
        return next((a.uri for a in self.artifacts if a.kind == CURVES_KIND), None)


@dataclass(frozen=True)
class DashboardReader:
    """The dashboard's reads: the ledger behind ``conn_id``, GCS behind ``gcp_conn_id``."""

    conn_id: str = DEFAULT_CONN_ID
    gcp_conn_id: str = "google_cloud_default"

    def _ledger(self) -> RunLedger:
        return RunLedger(self.conn_id)

    def runs(self, dag_ids: Collection[str], limit: int = RUNS_SHOWN) -> list[RunSummary]:
        """The newest runs of the DAGs in ``dag_ids``."""
        return [run for run in self._ledger().latest_runs(limit=limit) if run.dag_id in dag_ids]

    def run(self, dag_id: str, run_id: str) -> RunView:
        """One run of ``dag_id``; :class:`NotFound` when the ledger does not hold it."""
        ledger = self._ledger()
        key = make_run_id(dag_id, run_id)
        summary = ledger.run_summary(key)
        if summary is None:
            raise NotFound(f"the run ledger holds no run {key}")
        return RunView(summary, tuple(ledger.run_artifacts(key)), tuple(ledger.recorded_steps(key).values()))

    def curves_png(self, dag_id: str, run_id: str) -> bytes:
        """The run's curves PNG, read from GCS within :data:`CURVES_READ_TIMEOUT_SECONDS`."""
        view = self.run(dag_id, run_id)
        uri = view.curves_uri
        if uri is None:
            raise NotFound(f"no curves were recorded for run {view.run.run_id}")
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

        bucket, name = parse_gs_uri(uri)
        return bytes(
            gcs_hook(self.gcp_conn_id).download(
                bucket_name=bucket, object_name=name, timeout=CURVES_READ_TIMEOUT_SECONDS
            )
        )

    def trend_png(self, dag_ids: Collection[str]) -> bytes:
        """The reward trend of the runs of ``dag_ids``: before and after, on a time axis, per model."""
        if not matplotlib_available():
            raise NotFound(f"matplotlib is not installed ({PLOT_EXTRA_HINT})")
        rows = [row for row in self._ledger().reward_trend() if str(row["run_id"]).split("/")[0] in dag_ids]
        return figure_png(reward_trend_figure(reward_trend_series(rows)))
