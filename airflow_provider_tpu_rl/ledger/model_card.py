"""A trained model's card: the ``README.md`` written beside every Hugging Face export (no Airflow import).

The Hub's model-card format (https://huggingface.co/docs/hub/model-cards): YAML front matter
(``base_model``, ``library_name``, ``license``, ``datasets``, ``tags``, ``pipeline_tag``), then
Markdown. Written from the ledger's row of the run (:class:`RunSummary`) and the preset's facts;
the run's settings are validate's resolved values, which hold no secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from airflow_provider_tpu_rl.ledger.records import RunSummary, capacity_text
from airflow_provider_tpu_rl.maxtext.layout import HF_MODEL_CARD_FILE

MODEL_CARD_FILE: Final = HF_MODEL_CARD_FILE
# MaxText's RL default dataset when a preset names none (maxtext-v0.2.3/v0.2.4
# src/maxtext/configs/post_train/rl.yml: dataset_name 'openai/gsm8k').
MAXTEXT_DEFAULT_DATASET: Final = "openai/gsm8k"


@dataclass(frozen=True)
class BaseModelFacts:
    """What the card says of a preset's base model: its Hub id, license and pipeline tag."""

    hub_id: str
    license: str | None  # a Hub license identifier; None: not known, the card says "other"
    pipeline_tag: str | None = "text-generation"


# Base model per preset. Llama's preset converts MaxText's own checkpoint (no hf_model_path):
# MaxText's HF_IDS names it (maxtext-v0.2.3 src/maxtext/utils/globals.py). Licenses: the Hub's
# identifiers (hub-docs repositories-licenses.md): Qwen3 and Gemma 4 are Apache-2.0; Llama 3.1 has
# its own community license. Gemma 4's Hub pipeline is image-text-to-text: left to the Hub.
BASE_MODELS: Final[Mapping[str, BaseModelFacts]] = {
    "qwen3-30b-a3b": BaseModelFacts("Qwen/Qwen3-30B-A3B-Instruct-2507", "apache-2.0"),
    "gemma4-26b": BaseModelFacts("google/gemma-4-26b-a4b-it", "apache-2.0", None),
    "llama3.1-8b-Instruct": BaseModelFacts("meta-llama/Llama-3.1-8B-Instruct", "llama3.1"),
    # the rehearsal's (MaxText's HF_IDS: "qwen3-0.6b": "Qwen/Qwen3-0.6B"), Apache-2.0 as Qwen3
    "qwen3-0.6b": BaseModelFacts("Qwen/Qwen3-0.6B", "apache-2.0"),
}
TAGS: Final = ("tpu-rl", "maxtext", "grpo", "reinforcement-learning", "tpu-v6e")


@dataclass(frozen=True)
class CardFacts:
    """What the card needs beside the ledger's row."""

    model: str  # the preset
    base_model: str  # the Hub id the run converted
    license: str | None
    pipeline_tag: str | None
    dataset: str
    maxtext_release: str
    image: str | None
    curves_uri: str | None = None  # where record_run draws the run's curves


def base_model_facts(model: str, hf_model_path: str | None) -> BaseModelFacts:
    """The base model of ``model``: the run's ``hf_model_path`` when it named one, else the preset's."""
    known = BASE_MODELS.get(model)
    if hf_model_path and (known is None or hf_model_path != known.hub_id):
        return BaseModelFacts(hf_model_path, None)  # a checkpoint of the user's: its license is theirs
    return known or BaseModelFacts(model, None)


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def front_matter(summary: RunSummary, facts: CardFacts) -> dict[str, Any]:
    """The card's YAML metadata."""
    meta: dict[str, Any] = {
        "base_model": facts.base_model,
        "library_name": "transformers",
        "license": facts.license or "other",
        "datasets": [facts.dataset],
        "tags": list(TAGS),
    }
    if facts.pipeline_tag:
        meta["pipeline_tag"] = facts.pipeline_tag
    results = [
        {"name": f"mean reward {when} RL", "type": "mean_reward", "value": value}
        for when, value in (("before", summary.pre_mean_reward), ("after", summary.post_mean_reward))
        if value is not None
    ]
    if results:
        meta["model-index"] = [
            {
                "name": summary.run_id,
                "results": [
                    {
                        "task": {"type": "text-generation"},
                        "dataset": {"name": facts.dataset, "type": facts.dataset},
                        "metrics": results,
                    }
                ],
            }
        ]
    return meta


def model_card(summary: RunSummary, facts: CardFacts) -> str:
    """The ``README.md`` text: front matter, then the run's settings, rewards, TPU time and cost."""
    settings = summary.settings
    rows = [
        ("Ledger run id", summary.run_id),
        ("Model preset", facts.model),
        ("Base model", facts.base_model),
        ("Dataset", facts.dataset),
        ("Run name", str(settings.get("run_name", "-"))),
        ("Training steps", str(settings.get("steps", "-"))),
        ("Learning rate", str(settings.get("learning_rate", "MaxText's default"))),
        ("TPU", f"{settings.get('compute_type', '-')} {settings.get('topology', '')}".strip()),
        ("Capacity", capacity_text(settings) or "-"),
        # a GKE run's cluster and where it came from (created, kept, existing); none on a TPU VM
        *((("GKE cluster", summary.cluster_text),) if summary.cluster_text else ()),
        (
            "MaxText overrides",
            yaml.safe_dump(settings.get("train_overrides") or {}, default_flow_style=True).strip(),
        ),
        ("Mean reward before RL", _number(summary.pre_mean_reward)),
        ("Mean reward after RL", _number(summary.post_mean_reward)),
        ("MaxText release", facts.maxtext_release),
        ("Image", facts.image or "-"),
        ("TPU billed (chip-hours)", _number(summary.chip_hours, 3)),
        ("TPU trained (chip-hours)", _number(summary.busy_chip_hours, 3)),
        (
            "Estimated cost (USD)",
            "-" if summary.estimated_cost_usd is None else f"{summary.estimated_cost_usd:.2f}",
        ),
        ("Export", summary.export_uri or "-"),
        ("Promotion", summary.promotion or "-"),
    ]
    table = "\n".join(f"| {name} | {str(value).replace('|', '/')} |" for name, value in rows)
    curves = (
        f"\n\n## Curves\n\nMean reward and train loss: `{facts.curves_uri}` (drawn when the run is recorded).\n"
        if facts.curves_uri
        else "\n"
    )
    return (
        "---\n"
        + yaml.safe_dump(front_matter(summary, facts), sort_keys=False)
        + "---\n\n"
        + f"# {facts.base_model}, post-trained with GRPO (MaxText on TPU v6e)\n\n"
        + "Trained and exported by airflow-provider-tpu-rl; every number below is the run ledger's.\n\n"
        + "| | |\n|---|---|\n"
        + table
        + curves
    )


def parse_front_matter(text: str) -> dict[str, Any]:
    """The card's YAML metadata, read back (the Hub's own rule: the block between the first two ``---``)."""
    if not text.startswith("---\n"):
        raise ValueError("a model card starts with a '---' line")
    block = text[4:].split("\n---\n", 1)
    if len(block) != 2:
        raise ValueError("the model card's front matter is not closed by a '---' line")
    found = yaml.safe_load(block[0])
    if not isinstance(found, dict):
        raise ValueError("the model card's front matter is not a mapping")
    return found
