"""The model card beside every export: Hub front matter that parses, the ledger's numbers, no secret."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.ledger.model_card import (
    CardFacts,
    base_model_facts,
    model_card,
    parse_front_matter,
)
from airflow_provider_tpu_rl.ledger.records import RunSummary

SUMMARY = RunSummary(
    run_id="tpu_rl_gke_pipeline/manual__1",
    dag_id="tpu_rl_gke_pipeline",
    airflow_run_id="manual__1",
    model="qwen3-30b-a3b",
    state="running",
    started_at=None,
    ended_at=None,
    duration_seconds=None,
    chips=32,
    chip_hours=4.25,
    pre_mean_reward=0.12,
    post_mean_reward=0.34,
    export_uri="gs://b/qwen3-30b-a3b/hf-trained/rl-ab12cd/",
    busy_chip_hours=1.5,
    estimated_cost_usd=11.475,
    settings_json='{"run_name": "rl-ab12cd", "steps": 50, "train_overrides": {"num_test_batches": 2}}',
    promotion="promoted: no gate (min_reward_gain not set); mean reward 0.12 -> 0.34",
)
FACTS = CardFacts(
    model="qwen3-30b-a3b",
    base_model="Qwen/Qwen3-30B-A3B-Instruct-2507",
    license="apache-2.0",
    pipeline_tag="text-generation",
    dataset="nvidia/OpenMathInstruct-2",
    maxtext_release="0.2.4",
    image="us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4",
    curves_uri="gs://b/qwen3-30b-a3b/trained/rl-ab12cd/tpu-rl-curves-ab12cd.png",
)


def test_the_front_matter_is_the_hubs_yaml() -> None:
    meta = parse_front_matter(model_card(SUMMARY, FACTS))
    assert meta["base_model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert meta["library_name"] == "transformers"
    assert meta["license"] == "apache-2.0"
    assert meta["datasets"] == ["nvidia/OpenMathInstruct-2"]
    assert "grpo" in meta["tags"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert [m["value"] for m in metrics] == [0.12, 0.34]
    assert meta["model-index"][0]["name"] == SUMMARY.run_id


def test_the_body_names_the_runs_numbers_from_the_ledger() -> None:
    text = model_card(SUMMARY, FACTS)
    for shown in (
        "| Ledger run id | tpu_rl_gke_pipeline/manual__1 |",
        "| Run name | rl-ab12cd |",
        "| Mean reward before RL | 0.12 |",
        "| Mean reward after RL | 0.34 |",
        "| MaxText release | 0.2.4 |",
        "| TPU billed (chip-hours) | 4.25 |",
        "| TPU trained (chip-hours) | 1.5 |",
        "| Estimated cost (USD) | 11.47 |",
        FACTS.curves_uri,
        FACTS.image,
    ):
        assert shown in text


def test_a_run_without_rewards_has_no_model_index_and_an_unknown_license_says_other() -> None:
    bare = RunSummary(**{**SUMMARY.__dict__, "pre_mean_reward": None, "post_mean_reward": None})
    facts = CardFacts(**{**FACTS.__dict__, "license": None, "pipeline_tag": None})
    meta = parse_front_matter(model_card(bare, facts))
    assert "model-index" not in meta
    assert "pipeline_tag" not in meta
    assert meta["license"] == "other"


def test_the_base_model_is_the_runs_checkpoint_or_the_presets() -> None:
    assert base_model_facts("llama3.1-8b-Instruct", None).hub_id == "meta-llama/Llama-3.1-8B-Instruct"
    assert base_model_facts("llama3.1-8b-Instruct", None).license == "llama3.1"
    assert base_model_facts("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B-Instruct-2507").license == "apache-2.0"
    own = base_model_facts("qwen3-30b-a3b", "my-org/my-qwen")
    assert (own.hub_id, own.license) == ("my-org/my-qwen", None)


@pytest.mark.parametrize("text", ["no front matter", "---\nbase_model: x\n", "---\n- a\n---\n"])
def test_a_card_without_front_matter_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"front matter|starts with"):
        parse_front_matter(text)


def test_the_card_names_the_capacity_that_served() -> None:
    settings = (
        '{"capacity": ["reservation", "spot"], "capacity_served": "spot", '
        '"capacity_attempts": [{"capacity": "reservation", "error": "full"}]}'
    )
    card = model_card(RunSummary(**{**SUMMARY.__dict__, "settings_json": settings}), FACTS)
    assert "| Capacity | spot (after reservation refused) |" in card


def test_the_card_names_the_gke_cluster_and_where_it_came_from() -> None:
    assert "GKE cluster" not in model_card(SUMMARY, FACTS)  # none recorded (a TPU VM run's)
    shared = RunSummary(
        **{**SUMMARY.__dict__, "gke_cluster": "p-1/us-east5/team-gke", "gke_cluster_origin": "existing"}
    )
    assert "| GKE cluster | p-1/us-east5/team-gke (existing) |" in model_card(shared, FACTS)
