"""``tpu-rl runs --plot``: the reward trend across the ledger's runs, written as a PNG."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from airflow_provider_tpu_rl.cli import build_parser, main
from airflow_provider_tpu_rl.ledger import cli as ledger_cli
from airflow_provider_tpu_rl.ledger import plots
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import MetricRecord, RunRecord
from tests.support.ledger_fakes import minutes
from tests.support.png import decoded_png

TPU_RL = str(Path(sys.executable).with_name("tpu-rl"))


@pytest.fixture
def ledger_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger with three runs of two models; AIRFLOW_CONN_TPU_RL_LEDGER points at it."""
    uri = sqlite_connection_uri(tmp_path / "ledger.db")
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", uri)
    ledger = RunLedger()
    for index, (model, pre, post) in enumerate(
        [("qwen3-30b-a3b", 0.1, 0.3), ("qwen3-30b-a3b", 0.2, 0.45), ("gemma4-26b", 0.05, 0.2)]
    ):
        run = RunRecord("tpu_rl_gke_pipeline", f"run{index}", model, "success", started_at=minutes(index))
        ledger.record(
            run,
            metrics=[
                MetricRecord("pre", 0, "mean_reward", pre),
                MetricRecord("post", 0, "mean_reward", post),
            ],
        )
    return uri


def test_plot_writes_the_trend_of_one_model(
    ledger_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[list[str]] = []
    real_figure = plots.reward_trend_figure

    def spy(series: list[plots.TrendSeries], title: str | None = None) -> object:
        drawn.append([f"{one.model}:{one.before}:{one.after}" for one in series])
        assert title == "Mean reward across runs"  # the PNG stands alone: it names itself
        return real_figure(series, title=title)

    monkeypatch.setattr(plots, "reward_trend_figure", spy)
    output = tmp_path / "trend.png"

    assert main(["runs", "--plot", "--model", "qwen3-30b-a3b", "--output", str(output)]) == 0

    assert drawn == [["qwen3-30b-a3b:(0.1, 0.2):(0.3, 0.45)"]]
    assert decoded_png(output.read_bytes()).size == (1000, 450)
    assert (
        capsys.readouterr().out.strip() == f"Wrote the reward trend of 2 run(s) (qwen3-30b-a3b) to {output}"
    )


def test_plot_without_runs_writes_nothing(
    ledger_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "trend.png"

    assert main(["runs", "--plot", "--model", "no-such-model", "--output", str(output)]) == 0

    assert not output.exists()
    assert "No runs of model no-such-model with a mean reward" in capsys.readouterr().out


def test_plot_without_matplotlib_says_which_extra(
    ledger_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plots, "matplotlib_available", lambda: False)

    assert main(["runs", "--plot", "--output", str(tmp_path / "x.png")]) == 1

    assert "airflow-provider-tpu-rl[plot]" in capsys.readouterr().err


def test_output_without_plot_is_refused(ledger_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--output", "x.png"]) == 2
    assert "--output goes with --plot" in capsys.readouterr().err


def test_plot_defaults_to_a_file_in_the_current_folder() -> None:
    args = build_parser().parse_args(["runs", "--plot"])

    assert (args.plot, args.output, args.model) == (True, None, None)
    assert ledger_cli.DEFAULT_PLOT_FILE == "tpu-rl-reward-trend.png"


def test_the_installed_command_writes_the_png(ledger_uri: str, tmp_path: Path) -> None:
    """The console script, in its own process, as a user runs it."""
    done = subprocess.run(
        [TPU_RL, "runs", "--plot"],
        cwd=tmp_path,
        env={**os.environ, "AIRFLOW_CONN_TPU_RL_LEDGER": ledger_uri},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    written = tmp_path / "tpu-rl-reward-trend.png"
    assert f"Wrote the reward trend of 3 run(s) (gemma4-26b, qwen3-30b-a3b) to {written.name}" in done.stdout
    image = decoded_png(written.read_bytes())
    assert image.size == (1000, 450)
    assert Image.open(io.BytesIO(written.read_bytes())).mode in ("RGB", "RGBA")
