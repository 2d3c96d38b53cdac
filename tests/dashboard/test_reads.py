"""What the runs dashboard reads (dashboard/reads.py): the runs of the DAGs a viewer may read from the
ledger (SQLite here), a run with its curves, the curves' PNG from GCS (faked at the hook) within a
bound, and the reward trend; the pages drawn from them."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.dashboard import reads
from airflow_provider_tpu_rl.dashboard.pages import Airflow3Ui, run_page, runs_page
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader, NotFound
from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from airflow_provider_tpu_rl.ledger.records import RunRecord
from tests.dashboard.conftest import CURVES, GKE, VM
from tests.support.ledger_fakes import minutes
from tests.support.png import decoded_png


def test_the_runs_page_lists_runs_with_rewards_before_after_and_links_each_run(ledger: RunLedger) -> None:
    runs = DashboardReader().runs({GKE})

    page = runs_page("/tpu-rl", runs)

    assert [run.run_id for run in runs] == [f"{GKE}/<b>odd</b>", f"{GKE}/manual__a+1"]  # newest first
    assert format_reward(0.0884, 0.245) in page  # the `tpu-rl runs` cell: before→after
    assert "01:15:00" in page  # Airflow's own duration format
    assert "gs://bkt/qwen/hf-trained/rl/" in page
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in page
    assert "<b>odd</b>" not in page  # escaped
    assert "&lt;b&gt;odd&lt;/b&gt;" in page
    assert "<img src='/tpu-rl/trend.png'" in page
    assert VM not in page  # a DAG the viewer may not read


def test_a_run_refused_at_validate_does_not_break_the_front_page(ledger: RunLedger) -> None:
    """One run left on the form's placeholder project, refused at validate, made the front page
    (and so every earlier run) a bare 500: its shortened row was zipped strictly with the columns."""
    refusal = "refused at validate: project: set project to your GCP project"
    ledger.record(
        RunRecord(GKE, "placeholder", "qwen3-30b-a3b", "failed", started_at=minutes(200), refusal=refusal)
    )

    page = runs_page("/tpu-rl", DashboardReader().runs({GKE}))

    assert refusal in page
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in page  # the earlier runs are still reachable


def test_a_runs_page_shows_its_curves_only_when_they_were_recorded(ledger: RunLedger) -> None:
    reader = DashboardReader()
    with_curves = reader.run(GKE, "manual__a+1")
    without = reader.run(GKE, "<b>odd</b>")

    assert with_curves.curves_uri == CURVES
    page = run_page("/tpu-rl", with_curves.run, with_curves.artifacts, ui=Airflow3Ui())
    assert f"<img src='/tpu-rl/curves/{GKE}/manual__a%2B1' alt='run curves'>" in page
    assert CURVES in page
    assert without.curves_uri is None
    assert "alt='run curves'" not in run_page("/tpu-rl", without.run, without.artifacts, ui=Airflow3Ui())
    with pytest.raises(NotFound):
        reader.run(GKE, "never")


def test_the_curves_are_read_from_gcs_within_a_bound(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    class FakeGcs:
        def download(self, **kwargs: Any) -> bytes:
            calls.append(kwargs)
            return b"\x89PNG..."

    import airflow_provider_tpu_rl.hooks.credentials as credentials

    monkeypatch.setattr(credentials, "gcs_hook", lambda conn_id: FakeGcs())

    assert DashboardReader().curves_png(GKE, "manual__a+1") == b"\x89PNG..."
    assert calls == [
        {"bucket_name": "bkt", "object_name": "qwen/trained/rl/tpu-rl-curves-ab.png", "timeout": 30}
    ]
    with pytest.raises(NotFound, match="no curves"):
        DashboardReader().curves_png(GKE, "<b>odd</b>")


def test_the_trend_holds_only_the_readable_dags_runs(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[list[str]] = []
    real = reads.reward_trend_series
    monkeypatch.setattr(
        reads, "reward_trend_series", lambda rows: drawn.append([r["run_id"] for r in rows]) or real(rows)
    )

    png = DashboardReader().trend_png({VM})

    assert drawn == [[f"{VM}/vm1"]]
    assert decoded_png(png).size == (1000, 450)
