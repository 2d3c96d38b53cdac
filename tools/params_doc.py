"""Write ``docs/params.md``'s table of run parameters from the table in ``spec/params.py``.

A developer tool, not part of the provider wheel. From the repository root::

    python -m tools.params_doc          # print the table
    python -m tools.params_doc --write  # replace the table in docs/params.md

``tests/spec/test_params.py`` fails while the document's table differs from the table this
writes, so a parameter added to ``spec/params.py`` reaches the docs with the same change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from airflow_provider_tpu_rl.spec import params

DOC = Path(__file__).resolve().parents[1] / "docs" / "params.md"
BEGIN = "<!-- run parameters: written by `python -m tools.params_doc --write` from spec/params.py -->"
END = "<!-- end of run parameters -->"
PIPELINE_NAMES = {params.GKE: "GKE", params.TPU_VM: "TPU VM"}


def _value(value: Any) -> str:
    if value is None or value == "":
        return "empty"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def default_text(param: params.RunParam) -> str:
    """The table's default column: the row's own words, else its value(s) on each pipeline."""
    if param.doc_default is not None:
        return param.doc_default
    values = {pipeline: param.default_on(pipeline) for pipeline in param.pipelines}
    if len({json.dumps(v, sort_keys=True) for v in values.values()}) == 1:
        text = _value(next(iter(values.values())))
    else:
        text = " / ".join(f"{_value(v)} ({PIPELINE_NAMES[p]})" for p, v in values.items())
    return text + (" (an example: replace it)" if param.placeholder else "")


def table() -> str:
    """The markdown table: one row per run parameter, in the table's order."""
    lines = ["| key | pipelines | meaning | default |", "|---|---|---|---|"]
    for param in params.RUN_PARAMS:
        where = "both" if len(param.pipelines) == 2 else PIPELINE_NAMES[param.pipelines[0]]
        option = param.option_on(param.pipelines[-1]) or param.option_on(param.pipelines[0])
        prefill = f"; prefilled by `[tpu_rl] {option}`" if option else ""
        if isinstance(param.option, params.PerPipeline) and param.option.gke and param.option.tpu_vm:
            prefill = f"; prefilled by `[tpu_rl] {param.option.gke}` / `{param.option.tpu_vm}`"
        lines.append(f"| `{param.key}` | {where} | {param.doc}{prefill} | {default_text(param)} |")
    return "\n".join(lines) + "\n"


def document_with_table(document: str) -> str:
    """``document`` with the text between its markers replaced by :func:`table`."""
    start, end = document.index(BEGIN) + len(BEGIN), document.index(END)
    return document[:start] + "\n" + table() + document[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(document_with_table(DOC.read_text()))
    else:
        print(table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
