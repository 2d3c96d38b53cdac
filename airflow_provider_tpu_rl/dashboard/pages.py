"""The dashboard's HTML pages, from the ledger's rows (no Airflow import; every value escaped)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote

from airflow_provider_tpu_rl.ledger.cli import RUNS_COLUMNS, UNKNOWN, runs_table_rows
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, RunSummary

TITLE = "TPU RL runs"
_STYLE = """
body { font-family: sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3rem 0.6rem; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state-success { color: #1a7f37; } .state-failed { color: #cf222e; } .state-running { color: #9a6700; }
img { max-width: 100%; border: 1px solid #eee; }
"""
_NUMERIC = {"DURATION", "TPU CHIP-H", "TRAINED", "IDLE", "COST $"}


def _path(value: str) -> str:
    return quote(value, safe="")


def run_href(root: str, dag_id: str, run_id: str) -> str:
    """The run's page under the dashboard's root path."""
    return f"{root}/runs/{_path(dag_id)}/{_path(run_id)}"


def curves_href(root: str, dag_id: str, run_id: str) -> str:
    """The run's curves PNG under the dashboard's root path."""
    return f"{root}/curves/{_path(dag_id)}/{_path(run_id)}"


def _document(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def _runs_table(root: str, runs: Sequence[RunSummary]) -> str:
    head = "".join(f"<th>{escape(name)}</th>" for name in RUNS_COLUMNS)
    lines = []
    for run, cells in zip(runs, runs_table_rows(runs), strict=True):
        tds = []
        for name, cell in zip(RUNS_COLUMNS, cells, strict=True):
            if name == "RUN":
                href = run_href(root, run.dag_id, run.airflow_run_id)
                tds.append(f"<td><a href='{escape(href)}'>{escape(cell)}</a></td>")
            elif name == "STATE":
                tds.append(f"<td class='state-{escape(cell)}'>{escape(cell)}</td>")
            else:
                css = " class='num'" if name in _NUMERIC else ""
                tds.append(f"<td{css}>{escape(cell)}</td>")
        lines.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(lines) + "\n</tbody></table>"


def runs_page(root: str, runs: Sequence[RunSummary]) -> str:
    """The dashboard's front page: the reward trend across runs and the table of the newest runs."""
    if runs:
        table = _runs_table(root, runs)
        trend = f"<h2>Mean reward across runs</h2>\n<img src='{escape(root)}/trend.png' alt='reward trend'>"
    else:
        table, trend = "<p>The run ledger holds no run of a DAG you can read.</p>", ""
    body = f"<h1>{TITLE}</h1>\n{trend}\n<h2>Newest runs</h2>\n{table}"
    return _document(TITLE, body)


def run_page(root: str, run: RunSummary, artifacts: Sequence[ArtifactRecord]) -> str:
    """One run: its row of the table, where its outputs are, and its curves."""
    rows = "".join(
        f"<tr><th>{escape(name)}</th><td>{escape(cell)}</td></tr>"
        for name, cell in zip(RUNS_COLUMNS, runs_table_rows([run])[0], strict=True)
    )
    outputs = "".join(
        f"<tr><th>{escape(a.kind)}</th><td>{escape(a.uri)}"
        f"{'' if a.step is None else f' (step {a.step})'}</td></tr>"
        for a in artifacts
    )
    has_curves = any(a.kind == "curves" for a in artifacts)
    curves = (
        f"<img src='{escape(curves_href(root, run.dag_id, run.airflow_run_id))}' alt='run curves'>"
        if has_curves
        else "<p>No curves were recorded for this run (it did not train, or matplotlib is missing).</p>"
    )
    body = (
        f"<p><a href='{escape(root)}/'>{TITLE}</a></p>\n<h1>{escape(run.run_id)}</h1>\n"
        f"<table>{rows}</table>\n<h2>Curves</h2>\n{curves}\n"
        f"<h2>Outputs</h2>\n<table>{outputs or f'<tr><td>{UNKNOWN}</td></tr>'}</table>"
    )
    return _document(f"{run.run_id} - {TITLE}", body)


def message_page(message: str) -> str:
    """A page of one line (a run that is not in the ledger, a ledger that cannot be read)."""
    return _document(TITLE, f"<h1>{TITLE}</h1>\n<p>{escape(message)}</p>")
