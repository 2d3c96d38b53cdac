"""OpenLineage for the MaxText jobs: what a conversion, training or export read and wrote.

The operators keep a :class:`Lineage` (plain data, no OpenLineage import) when they resolve their
job, and ``get_openlineage_facets_on_complete`` turns it into the OpenLineage provider's
``OperatorLineage``. Dataset names follow the OpenLineage naming spec: a GCS folder is namespace
``gs://<bucket>``, name = its object path (no trailing ``/``); the Hugging Face Hub, which the spec
does not list, is namespace ``https://huggingface.co`` (the datasource) with the repo id as name
(``datasets/<id>`` for a dataset), so namespace + ``/`` + name is the repo's page. The job facet
``sourceCode`` holds the MaxText command (argv without secrets: the HF token is read from Secret
Manager inside the job, never an argument). Imports go through
``airflow.providers.common.compat.openlineage`` and happen only when the provider asks, so nothing
changes without the OpenLineage provider.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_tpu_rl.ledger.model_card import MAXTEXT_DEFAULT_DATASET, base_model_facts
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri
from airflow_provider_tpu_rl.render import maxtext
from airflow_provider_tpu_rl.spec.workloads import ConversionSpec, ExportSpec, TrainingSpec

HF_NAMESPACE: Final = "https://huggingface.co"


@dataclass(frozen=True)
class LineageDataset:
    """One OpenLineage dataset: its namespace and name."""

    namespace: str
    name: str


def gcs_dataset(uri: str) -> LineageDataset:
    """``gs://bucket/a/b/`` → namespace ``gs://bucket``, name ``a/b`` (``/`` for the bucket itself)."""
    bucket, path = parse_gs_uri(uri)
    return LineageDataset(f"gs://{bucket}", path.strip("/") or "/")


def hf_model_dataset(repo_id: str) -> LineageDataset:
    """A Hub model repo: namespace ``https://huggingface.co``, name the repo id."""
    return LineageDataset(HF_NAMESPACE, repo_id.strip("/"))


def hf_dataset_dataset(repo_id: str) -> LineageDataset:
    """A Hub dataset repo: name ``datasets/<repo id>`` (its page's path)."""
    return LineageDataset(HF_NAMESPACE, f"datasets/{repo_id.strip('/')}")


@dataclass(frozen=True)
class Lineage:
    """What one MaxText job read and wrote, and the command it ran (no secret in it)."""

    inputs: tuple[LineageDataset, ...]
    outputs: tuple[LineageDataset, ...]
    command: tuple[str, ...] = ()

    @property
    def source_code(self) -> str:
        return shlex.join(self.command)


def lineage_of(
    inputs: Sequence[LineageDataset], outputs: Sequence[LineageDataset], command: Sequence[str]
) -> Lineage:
    return Lineage(tuple(inputs), tuple(outputs), tuple(command))


def conversion_lineage(conversion: ConversionSpec, *, machine: str) -> Lineage:
    """``to_maxtext``: the Hub checkpoint in, the converted MaxText checkpoint out."""
    repo = base_model_facts(conversion.model_name, conversion.hf_model_path).hub_id
    return lineage_of(
        [hf_model_dataset(repo)],
        [gcs_dataset(conversion.output_directory)],
        maxtext.to_maxtext_argv(conversion, machine=machine),
    )


def training_lineage(training: TrainingSpec, command: Sequence[str]) -> Lineage:
    """GRPO training: the parameters it starts from and the Hub dataset in, the run's folder out."""
    dataset = dict(training.overrides).get("dataset_name") or MAXTEXT_DEFAULT_DATASET
    run_folder = f"{training.base_output_directory.rstrip('/')}/{training.run_name}"
    return lineage_of(
        [gcs_dataset(training.load_parameters_path), hf_dataset_dataset(dataset)],
        [gcs_dataset(run_folder)],
        command,
    )


def export_lineage(export: ExportSpec, *, machine: str, override_architecture: bool) -> Lineage:
    """``to_huggingface``: the trained parameters in, the Hugging Face export out."""
    return lineage_of(
        [gcs_dataset(export.load_parameters_path)],
        [gcs_dataset(export.output_directory)],
        maxtext.to_huggingface_argv(export, machine=machine, override_architecture=override_architecture),
    )


def _source_enabled() -> bool:
    """``[openlineage] disable_source_code`` honoured as the provider's own extractors do."""
    try:
        from airflow.providers.openlineage.conf import is_source_enabled
    except ImportError:  # an older provider: no switch
        return True
    return bool(is_source_enabled())


def operator_lineage(lineage: Lineage | None) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` of ``lineage`` (empty when None).

    Called only by the OpenLineage provider (so it is installed); the facet classes come through
    common.compat.
    """
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    if lineage is None:
        return OperatorLineage()
    job_facets: dict[str, Any] = {}
    if lineage.command and _source_enabled():
        try:
            from openlineage.client.generated.source_code_job import SourceCodeJobFacet
        except ImportError:  # pragma: no cover - every client the provider allows has it
            pass
        else:
            job_facets["sourceCode"] = SourceCodeJobFacet(language="shell", sourceCode=lineage.source_code)
    return OperatorLineage(
        inputs=[Dataset(namespace=d.namespace, name=d.name) for d in lineage.inputs],
        outputs=[Dataset(namespace=d.namespace, name=d.name) for d in lineage.outputs],
        job_facets=job_facets,
    )


class LineageMixin:
    """``get_openlineage_facets_on_complete`` from the :class:`Lineage` the task kept while running."""

    _lineage: Lineage | None = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return operator_lineage(self._lineage)
