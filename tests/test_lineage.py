"""OpenLineage of the MaxText jobs: dataset names, the operators' facets with the provider, no secret."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from airflow_provider_tpu_rl.lineage import (
    HF_NAMESPACE,
    Lineage,
    LineageDataset,
    gcs_dataset,
    hf_dataset_dataset,
    hf_model_dataset,
    operator_lineage,
)
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmStageOperator, stage_lineage
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from tests.support.finished_jobs import finish, job_operator

SECRET = "hf_SeCrEtToKeNvalue0123456789"


def test_gcs_folders_are_named_as_the_openlineage_spec_names_gcs() -> None:
    assert gcs_dataset("gs://b-1/qwen3-30b-a3b/max-text-format/") == LineageDataset(
        "gs://b-1", "qwen3-30b-a3b/max-text-format"
    )
    assert gcs_dataset("gs://b-1/x/0/items") == LineageDataset("gs://b-1", "x/0/items")
    assert gcs_dataset("gs://b-1/") == LineageDataset("gs://b-1", "/")
    with pytest.raises(ValueError, match="gs://"):
        gcs_dataset("/local/path")


def test_hub_repos_are_named_by_the_hub_and_their_repo_id() -> None:
    assert hf_model_dataset("Qwen/Qwen3-30B-A3B-Instruct-2507") == LineageDataset(
        "https://huggingface.co", "Qwen/Qwen3-30B-A3B-Instruct-2507"
    )
    assert hf_dataset_dataset("nvidia/OpenMathInstruct-2") == LineageDataset(
        HF_NAMESPACE, "datasets/nvidia/OpenMathInstruct-2"
    )


def test_the_operators_import_no_openlineage() -> None:
    """Without the OpenLineage provider nothing changes: only the provider's call imports it."""
    code = (
        "import sys, airflow_provider_tpu_rl.operators.gke_jobs, airflow_provider_tpu_rl.operators.tpu_vm;"
        "print(sorted(m for m in sys.modules if m.startswith(('openlineage', 'airflow.providers.openlineage.'))"
        " and not m.endswith('.get_provider_info')))"
    )  # (Airflow's providers manager reads every provider's get_provider_info by itself)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


# -- with the OpenLineage provider installed ------------------------------------------------------------
def facets(op: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]], str, str]:
    """(inputs, outputs, the sourceCode facet's code, the whole lineage as JSON) of a finished task."""
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is not installed")
    from openlineage.client.serde import Serde

    lineage = op.get_openlineage_facets_on_complete(None)
    inputs = [(d.namespace, d.name) for d in lineage.inputs]
    outputs = [(d.namespace, d.name) for d in lineage.outputs]
    source = lineage.job_facets["sourceCode"]
    assert source.language == "shell"
    everything = json.dumps(
        {
            "inputs": [json.loads(Serde.to_json(d)) for d in lineage.inputs],
            "outputs": [json.loads(Serde.to_json(d)) for d in lineage.outputs],
            "job": {k: json.loads(Serde.to_json(v)) for k, v in lineage.job_facets.items()},
            "run": {k: json.loads(Serde.to_json(v)) for k, v in lineage.run_facets.items()},
        }
    )
    return inputs, outputs, source.sourceCode, everything


def test_a_conversion_reads_the_hub_checkpoint_and_writes_the_converted_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    op = job_operator(MaxTextConvertOperator)
    finish(op, monkeypatch)
    inputs, outputs, code, everything = facets(op)
    assert inputs == [("https://huggingface.co", "Qwen/Qwen3-30B-A3B-Instruct-2507")]
    assert outputs == [("gs://b-1", "qwen3-30b-a3b/max-text-format")]
    assert code.startswith("python3 -m maxtext.checkpoint_conversion.to_maxtext model_name=qwen3-30b-a3b")
    assert "base_output_directory=gs://b-1/qwen3-30b-a3b/max-text-format/" in code
    assert SECRET not in everything
    assert "HF_TOKEN" not in everything
    assert "secretmanager" not in everything.lower()
    assert "gcluster" not in everything


def test_training_reads_the_converted_checkpoint_and_the_dataset_and_writes_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    op = job_operator(PathwaysRLTrainOperator)
    finish(op, monkeypatch)
    inputs, outputs, code, everything = facets(op)
    assert inputs == [
        ("gs://b-1", "qwen3-30b-a3b/max-text-format/0/items"),
        ("https://huggingface.co", "datasets/nvidia/OpenMathInstruct-2"),
    ]
    assert outputs == [("gs://b-1", "qwen3-30b-a3b/trained/rl-1")]
    assert code.startswith("python3 -m maxtext.trainers.post_train.rl.train_rl ")
    assert "num_batches=3" in code
    assert "run_name=rl-1" in code
    assert SECRET not in everything
    assert "HF_TOKEN" not in everything


def test_an_export_reads_the_trained_parameters_and_writes_the_hf_export(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    op = job_operator(MaxTextExportOperator)
    finish(op, monkeypatch)
    inputs, outputs, code, everything = facets(op)
    assert inputs == [("gs://b-1", "qwen3-30b-a3b/trained/rl-1/checkpoints/actor/3/model_params")]
    assert outputs == [("gs://b-1", "qwen3-30b-a3b/hf-trained/rl-1")]
    assert code.startswith("python3 -m maxtext.checkpoint_conversion.to_huggingface ")
    assert "--override_model_architecture" in code
    assert SECRET not in everything
    assert "HF_TOKEN" not in everything


def test_a_task_that_never_resolved_its_job_reports_no_datasets() -> None:
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is not installed")
    lineage = job_operator(MaxTextExportOperator).get_openlineage_facets_on_complete(None)
    assert (lineage.inputs, lineage.outputs, lineage.job_facets) == ([], [], {})


def test_the_source_code_facet_follows_openlineages_disable_source_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is not installed")
    import airflow.providers.openlineage.conf as ol_conf

    if not hasattr(ol_conf, "is_source_enabled"):
        pytest.skip("this OpenLineage provider has no disable_source_code switch")
    monkeypatch.setattr(ol_conf, "is_source_enabled", lambda: False)
    lineage = operator_lineage(Lineage((gcs_dataset("gs://b/a"),), (), ("python3", "-m", "x")))
    assert lineage.job_facets == {}
    assert [(d.namespace, d.name) for d in lineage.inputs] == [("gs://b", "a")]


@pytest.mark.parametrize(
    ("stage", "inputs", "outputs", "program"),
    [
        (
            "convert",
            [("https://huggingface.co", "meta-llama/Llama-3.1-8B-Instruct")],
            [("gs://b-1", "llama3.1-8b-Instruct/mt-format")],
            "maxtext.checkpoint_conversion.to_maxtext",
        ),
        (
            "train",
            [
                ("gs://b-1", "llama3.1-8b-Instruct/mt-format/0/items"),
                ("https://huggingface.co", "datasets/openai/gsm8k"),
            ],
            [("gs://b-1", "llama3.1-8b-Instruct/post-train/rl-1")],
            "maxtext.trainers.post_train.rl.train_rl",
        ),
        (
            "export",
            [("gs://b-1", "llama3.1-8b-Instruct/post-train/rl-1/checkpoints/actor/50/model_params")],
            [("gs://b-1", "llama3.1-8b-Instruct/hf-trained/rl-1")],
            "maxtext.checkpoint_conversion.to_huggingface",
        ),
    ],
)
def test_the_tpu_vm_stages_report_what_they_read_and_write(
    stage: str, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], program: str
) -> None:
    conf = {"project": "p-123456", "bucket": "b-1", "zone": "us-east5-b", "run_name": "rl-1"}
    p = tpu_vm_pipeline_from_conf(conf, run_id="manual__1")
    lineage = stage_lineage(p, stage)
    assert lineage is not None
    op = TpuVmStageOperator(task_id=stage, stage=stage, bucket="b-1", vm_name="vm-1", zone="us-east5-b")
    op._lineage = lineage  # what execute keeps once it resolved the run's spec
    got_inputs, got_outputs, code, everything = facets(op)
    assert (got_inputs, got_outputs) == (inputs, outputs)
    assert code.startswith(f"python3 -m {program} ")
    assert "HF_TOKEN" not in everything
    assert "secrets" not in everything


def test_the_tpu_vm_install_stage_moves_no_data() -> None:
    p = tpu_vm_pipeline_from_conf(
        {"project": "p-123456", "bucket": "b-1", "zone": "us-east5-b"}, run_id="m__1"
    )
    assert stage_lineage(p, "install") is None


def test_the_openlineage_providers_extractor_takes_the_operators_facets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the provider's listener calls when the task completes (its DefaultExtractor finds the method)."""
    pytest.importorskip("airflow.providers.openlineage", reason="the OpenLineage provider is not installed")
    from types import SimpleNamespace

    from airflow.providers.openlineage.extractors.manager import ExtractorManager
    from airflow.utils.state import TaskInstanceState

    op = job_operator(MaxTextExportOperator)
    finish(op, monkeypatch)
    lineage = ExtractorManager().extract_metadata(
        SimpleNamespace(run_id="manual__1"), op, TaskInstanceState.SUCCESS, None
    )
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("gs://b-1", "qwen3-30b-a3b/hf-trained/rl-1")]
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("gs://b-1", "qwen3-30b-a3b/trained/rl-1/checkpoints/actor/3/model_params")
    ]
    assert "to_huggingface" in lineage.job_facets["sourceCode"].sourceCode
