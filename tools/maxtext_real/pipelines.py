"""What the real-converter leg runs for each pipeline: its MaxText releases and the converter calls
``tpu-rl plan`` renders, rewritten to run on this machine.

The release is the one the provider runs each pipeline with: the default run's
``preset.maxtext_version`` from the provider's own spec (``spec/pipeline.py``; with the default
runtime ``container`` the TPU VM pipeline's conversion, training and export all run in the workload
image, as the GKE jobs do: one MaxText release per run). ``python -m tools.maxtext_real.pipelines``
prints the releases, one a line (the Makefile builds a venv for each).

``converter_calls(dag_id)`` runs ``tpu-rl plan DAG_ID`` and returns the ``python3 -m maxtext.…`` argv
of ``convert_to_maxtext`` and ``export_to_huggingface`` (found in the TPU VM's SSH script or the GKE
job's ``--command``), split as bash would. ``localize`` swaps in the tiny model and local folders and
nothing else:

* ``model_name=<preset>`` -> ``model_name=qwen3-0.6b``;
* ``gs://BUCKET/…`` -> ``<bucket_root>/…`` (trailing slashes kept);
* ``--hf_model_path=<hub repo>`` -> the local snapshot folder (to_maxtext's lazy loader lists a hub
  repo with an API call, a folder with ``os.listdir``: maxtext-v0.2.4 to_maxtext.py l.136-141);
* ``load_parameters_path=…/actor/<N>/model_params`` -> step ``N`` = the step the leg writes.

Every other key and flag is passed as rendered.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_tpu_rl.spec.pipeline import (
    GKE_DAG_ID,
    TPU_VM_DAG_ID,
    gke_pipeline_from_conf,
    tpu_vm_pipeline_from_conf,
)

MODEL = "qwen3-0.6b"
TASKS = ("convert_to_maxtext", "export_to_huggingface")
MODULES = ("maxtext.checkpoint_conversion.to_maxtext", "maxtext.checkpoint_conversion.to_huggingface")


@dataclass(frozen=True)
class Pipeline:
    """One shipped pipeline as the leg runs it."""

    name: str
    dag_id: str
    pathways: bool  # training under Pathways: tunix's handlers without OCDBT and zarr3

    @property
    def release(self) -> str:
        """The MaxText release a default run converts, trains and exports with (the spec's)."""
        spec = gke_pipeline_from_conf(None) if self.dag_id == GKE_DAG_ID else tpu_vm_pipeline_from_conf(None)
        return spec.preset.maxtext_version


PIPELINES: dict[str, Pipeline] = {
    "tpu_vm": Pipeline("tpu_vm", TPU_VM_DAG_ID, False),
    "gke": Pipeline("gke", GKE_DAG_ID, True),
}


def releases() -> list[str]:
    """Every MaxText release the leg needs a venv of."""
    return sorted({p.release for p in PIPELINES.values()})


def _python_calls(script: str) -> list[list[str]]:
    calls = []
    for line in script.splitlines():
        words = shlex.split(line) if "python3" in line else []
        for i, word in enumerate(words):
            if word == "python3" and i + 2 < len(words) and words[i + 1] == "-m" and words[i + 2] in MODULES:
                end = i
                while end < len(words) and words[end] not in (";", "&&", "||", "}"):
                    end += 1
                calls.append([w.rstrip(";") for w in words[i:end] if w.rstrip(";")])
    return calls


def plan(dag_id: str) -> dict[str, Any]:
    """``tpu-rl plan DAG_ID`` (the project venv's), parsed."""
    tpu_rl = Path(sys.executable).with_name("tpu-rl")
    done = subprocess.run(
        [str(tpu_rl), "plan", dag_id], check=True, capture_output=True, text=True, timeout=300
    )
    return json.loads(done.stdout.splitlines()[0])


def step_texts(step: dict[str, Any]) -> list[str]:
    """The shell text a plan step runs: an SSH script's stdin, a GKE job's ``--command``."""
    return [step.get("stdin", "")] + [
        a[len("--command=") :] for a in step["argv"] if a.startswith("--command=")
    ]


def converter_calls(rendered: dict[str, Any]) -> dict[str, list[str]]:
    """Task id -> the ``python3 -m maxtext.checkpoint_conversion.…`` argv the plan renders for it."""
    found: dict[str, list[str]] = {}
    for step in rendered["steps"]:
        if step["task_id"] in TASKS:
            for text in step_texts(step):
                for call in _python_calls(text):
                    found[step["task_id"]] = call
    missing = set(TASKS) - set(found)
    if missing:
        raise LookupError(
            f"tpu-rl plan {rendered.get('dag_id')} renders no converter call for {sorted(missing)}"
        )
    return found


def localize(
    argv: list[str], bucket_root: str | Path, hf_snapshot: str | Path, step: int | None = None
) -> list[str]:
    """``argv`` with the model, the bucket and the hub repo swapped for local ones (nothing else)."""
    out = []
    for word in argv:
        if word.startswith("model_name="):
            word = f"model_name={MODEL}"
        elif word.startswith("--hf_model_path="):
            word = f"--hf_model_path={hf_snapshot}"
        word = re.sub(r"gs://[^/]+/", str(bucket_root).rstrip("/") + "/", word)
        if step is not None and word.startswith("load_parameters_path="):
            word = re.sub(r"/actor/\d+/", f"/actor/{step}/", word)
        out.append(word)
    return out


def value(argv: list[str], key: str) -> str:
    """The value of ``key=…`` in ``argv``."""
    prefix = key + "="
    (found,) = [word[len(prefix) :] for word in argv if word.startswith(prefix)]
    return found


if __name__ == "__main__":
    print("\n".join(releases()))
