"""``promote_model``: the model card, the export check and the promotion gate after the export;
``publish_<preset>``: the model asset's event of a promoted model, ``publish_converted_<preset>``: the
converted checkpoint's (one task per preset of a pipeline, each)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.assets import (
    CONVERTED_EVENT_KEY,
    converted_checkpoint_asset_uri,
    emit_asset_events,
    model_asset_uri,
)
from airflow_provider_tpu_rl.compat import AirflowFailException, AirflowSkipException
from airflow_provider_tpu_rl.ledger.collect import (
    GKE_CLUSTER_TASK_IDS,
    capacity_served,
    collect_run_from_context,
    gke_cluster_of,
)
from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger
from airflow_provider_tpu_rl.ledger.model_card import (
    MAXTEXT_DEFAULT_DATASET,
    MODEL_CARD_FILE,
    CardFacts,
    base_model_facts,
    model_card,
)
from airflow_provider_tpu_rl.ledger.promotion import Promotion, decide
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    RunRecord,
    RunSummary,
    make_run_id,
    served_capacity,
)
from airflow_provider_tpu_rl.maxtext.layout import as_folder, parse_gs_uri, probe_hf_export
from airflow_provider_tpu_rl.operators.ledger import (
    curves_uri,
    default_usd_per_chip_hour,
    run_output_folder,
    run_settings,
)
from airflow_provider_tpu_rl.spec import SpecError
from airflow_provider_tpu_rl.spec.pipeline import min_reward_gain as check_min_reward_gain
from airflow_provider_tpu_rl.spec.presets import (
    GKE_MAXTEXT_VERSION,
    TPU_VM_MAXTEXT_VERSION,
    Runner,
    get_preset,
)

PROMOTION_XCOM_KEY = "promotion"
MAXTEXT_RELEASES = {"gke": GKE_MAXTEXT_VERSION, "tpu_vm": TPU_VM_MAXTEXT_VERSION}


def _number_or_text(value: Any) -> Any:
    """A templated number rendered as text (a DAG without native templates) back as a number."""
    if isinstance(value, str) and value.strip():
        try:
            return float(value)
        except ValueError:
            return value
    return value


def image_digest(image: str | None) -> str | None:
    """The ``sha256:…`` digest an image reference pins, or None (a tag only)."""
    if image and "@" in image:
        return image.rsplit("@", 1)[1]
    return None


def training_dataset(
    model: str, train_overrides: Mapping[str, Any] | None, runner: Runner | None = None
) -> str:
    """The Hub dataset the run trained on: its ``dataset_name`` override, the preset's (the
    ``runner``'s, for a model both pipelines offer), else MaxText's default."""
    try:
        own = dict(get_preset(model, runner=runner).train_overrides)
    except SpecError:
        own = {}
    own.update(dict(train_overrides or {}))
    return str(own.get("dataset_name") or MAXTEXT_DEFAULT_DATASET)


def asset_extra(
    summary: RunSummary, facts: CardFacts, *, run_name: str | None, steps: Any, card_uri: str
) -> dict[str, Any]:
    """The model asset event's ``extra``: flat, JSON-native, no secret (the ledger's values)."""
    return {
        "run_id": summary.run_id,
        "dag_id": summary.dag_id,
        "airflow_run_id": summary.airflow_run_id,
        "run_name": run_name,
        "model": facts.model,
        "export_uri": summary.export_uri,
        "model_card_uri": card_uri,
        "base_model": facts.base_model,
        "dataset": facts.dataset,
        "pre_mean_reward": summary.pre_mean_reward,
        "post_mean_reward": summary.post_mean_reward,
        "steps": steps,
        "tpu_chip_hours_billed": summary.chip_hours,
        "tpu_chip_hours_trained": summary.busy_chip_hours,
        "estimated_cost_usd": summary.estimated_cost_usd,
        "maxtext_release": facts.maxtext_release,
        "image": facts.image,
        "image_digest": image_digest(facts.image),
        "promotion": summary.promotion,
        # the capacity kind that served the TPUs (an ordered capacity's: after the kinds refused)
        "capacity": served_capacity(summary.settings),
        "capacity_refused": ", ".join(
            str(a.get("capacity")) for a in summary.settings.get("capacity_attempts") or ()
        )
        or None,
        # the GKE cluster (PROJECT/LOCATION/NAME) and whether the run created, was kept or named it
        "gke_cluster": summary.gke_cluster,
        "gke_cluster_origin": summary.gke_cluster_origin,
    }


class PromoteModelOperator(BaseOperator):
    """Card the run's export, check it, and decide whether the model is promoted, from the ledger.

    1. Records the run so far in the ledger (state ``running``: its steps, rewards, artifacts, TPU
       time; ``record_run`` completes it) and reads its row back.
    2. Applies the gate: with evaluation on and ``min_reward_gain`` set, a model whose mean reward
       gained less is *not promoted*. Evaluation off, or no threshold: no gate, said once.
    3. Writes the model card ``README.md`` beside the export (Hugging Face's format, from the
       ledger's row; ledger artifact ``model_card``) and checks the export again, card included.
    4. Records the decision (the ledger's ``promotion``, XCom key ``promotion``). A model that is
       not promoted **skips** the task: the run stays green and no asset event is emitted (a skipped
       task emits none on either Airflow line). A promoted one returns the asset event's ``extra``
       and gives it to the task's ``outlets``: an ``Asset`` gets it as its event's extra, an
       ``AssetAlias`` gets the model's asset (``tpu-rl://models/<preset>``) added with it.

    :param model: the model preset.
    :param export_uri: the run's Hugging Face export folder (``gs://…/``).
    :param min_reward_gain: the gate's threshold (a number; None or "" = no gate).
    :param runner: ``gke`` or ``tpu_vm``: which MaxText release ran (the card, the event).
    :param image: the image the jobs ran (None: MaxText installed from sources).
    :param hf_model_path: the checkpoint the run converted (None: the preset's).
    :param run_name: the training run's name; ``num_batches``: its steps.
    :param train_overrides: the run's own MaxText overrides (its dataset, when it names one).
    :param chips: the TPU chips the run trained on (the ledger's chip-hours).
    :param conn_id: the ledger's Airflow connection; ``gcp_conn_id``: the card's upload.
    :param cluster_task_ids: the tasks that create and destroy the billed TPU capacity.
    :param validate_task_id: the task whose XCom holds the resolved values (the run's settings).
    :param usd_per_chip_hour: the price the billed chip-hours are costed at; None = ``[tpu_rl]``.
    :param collect_options: more arguments of the ledger's collector (``train_task_id``, ...).
    """

    template_fields: Sequence[str] = (
        "model",
        "export_uri",
        "min_reward_gain",
        "chips",
        "image",
        "hf_model_path",
        "run_name",
        "num_batches",
        "train_overrides",
    )
    ui_color = "#f4ecd8"

    def __init__(
        self,
        *,
        model: str,
        export_uri: str,
        min_reward_gain: float | str | None = None,
        runner: str = "gke",
        image: str | None = None,
        hf_model_path: str | None = None,
        run_name: str | None = None,
        num_batches: int | str | None = None,
        train_overrides: Mapping[str, Any] | str | None = None,
        chips: int | str | None = None,
        conn_id: str = DEFAULT_CONN_ID,
        gcp_conn_id: str = "google_cloud_default",
        cluster_task_ids: Sequence[str] = GKE_CLUSTER_TASK_IDS,
        validate_task_id: str = "validate",
        usd_per_chip_hour: float | None = None,
        collect_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if runner not in MAXTEXT_RELEASES:
            raise ValueError(f"runner must be one of {sorted(MAXTEXT_RELEASES)}, got {runner!r}")
        self.model = model
        self.export_uri = export_uri
        self.min_reward_gain = min_reward_gain
        self.runner = runner
        self.image = image
        self.hf_model_path = hf_model_path
        self.run_name = run_name
        self.num_batches = num_batches
        self.train_overrides = train_overrides
        self.chips = chips
        self.conn_id = conn_id
        self.gcp_conn_id = gcp_conn_id
        self.cluster_task_ids = tuple(cluster_task_ids)
        self.validate_task_id = validate_task_id
        self.usd_per_chip_hour = usd_per_chip_hour
        self.collect_options = dict(collect_options or {})

    def execute(self, context: Context) -> dict[str, Any]:
        try:
            threshold = check_min_reward_gain(_number_or_text(self.min_reward_gain))
        except SpecError as err:
            raise AirflowFailException(str(err)) from err
        ledger = RunLedger(self.conn_id)
        derived = context["ti"].xcom_pull(task_ids=self.validate_task_id) or {}
        run, summary = self.record_so_far(context, ledger, derived)
        decision = decide(
            summary.pre_mean_reward, summary.post_mean_reward, summary.num_test_batches, threshold
        )
        run = dataclasses.replace(run, promotion=decision.line)
        summary = dataclasses.replace(summary, promotion=decision.line)
        facts = self.card_facts(derived)
        card_uri = self.write_card(summary, facts)
        ledger.record(run, artifacts=[ArtifactRecord("model_card", card_uri)])
        context["ti"].xcom_push(key=PROMOTION_XCOM_KEY, value=decision.line)
        self._say(decision)
        if not decision.promoted:
            raise AirflowSkipException(decision.line)
        extra = asset_extra(summary, facts, run_name=self.run_name, steps=self._steps(), card_uri=card_uri)
        for line in emit_asset_events(context, self.outlets or (), model_asset_uri(str(self.model)), extra):
            self.log.info("asset event: %s", line)
        return extra

    def _say(self, decision: Promotion) -> None:
        self.log.info("%s", f"promotion gate: {decision.line}" if not decision.gated else decision.line)

    def _steps(self) -> int | None:
        try:
            return None if self.num_batches in (None, "") else int(self.num_batches)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    def record_so_far(
        self, context: Context, ledger: RunLedger, derived: Mapping[str, Any]
    ) -> tuple[RunRecord, RunSummary]:
        """Upsert the run as it stands (``running``) and read its ledger row back."""
        dag_run = context["dag_run"]
        run_id = make_run_id(dag_run.dag_id, dag_run.run_id)
        chips = None if self.chips in (None, "") else int(self.chips)  # type: ignore[arg-type]
        settings = (
            run_settings(derived, capacity_served(context["ti"], self.cluster_task_ids[0]))
            if derived
            else None
        )
        run, steps, metrics, artifacts = collect_run_from_context(
            context,
            model=str(self.model),
            chips=chips,
            cluster_task_ids=(self.cluster_task_ids[0], self.cluster_task_ids[1]),
            recorded_steps=ledger.recorded_steps(run_id),
            usd_per_chip_hour=(
                default_usd_per_chip_hour(served_capacity(settings or {}))
                if self.usd_per_chip_hour is None
                else self.usd_per_chip_hour
            ),
            **self.collect_options,
        )
        cluster, origin = gke_cluster_of(context["ti"], derived)
        run = dataclasses.replace(
            run,
            state="running",
            ended_at=None,
            settings=settings,
            gke_cluster=cluster,
            gke_cluster_origin=origin,
        )
        ledger.record(run, steps, metrics, artifacts)
        summary = ledger.run_summary(run_id)
        if summary is None:  # the row was just written: only a ledger that lost it gets here
            raise RuntimeError(f"the ledger lost run {run_id} just recorded")
        return run, summary

    def card_facts(self, derived: Mapping[str, Any]) -> CardFacts:
        """What the card and the event say beside the ledger's row (``derived``: validate's values,
        for where record_run draws the curves)."""
        model = str(self.model)
        base = base_model_facts(model, str(self.hf_model_path) if self.hf_model_path else None)
        overrides = self.train_overrides if isinstance(self.train_overrides, Mapping) else None
        folder = run_output_folder(derived.get("actor_root"))
        return CardFacts(
            model=model,
            base_model=base.hub_id,
            license=base.license,
            pipeline_tag=base.pipeline_tag,
            dataset=training_dataset(model, overrides, Runner(self.runner)),
            maxtext_release=MAXTEXT_RELEASES[self.runner],
            image=str(self.image) if self.image else None,
            curves_uri=curves_uri(folder, derived.get("suffix")) if folder else None,
        )

    def write_card(self, summary: RunSummary, facts: CardFacts) -> str:
        """Upload ``README.md`` beside the export, then check the export whole, card included."""
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
        from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

        bucket, prefix = parse_gs_uri(as_folder(str(self.export_uri)))
        folder = as_folder(prefix)
        hook = gcs_hook(self.gcp_conn_id)
        hook.upload(
            bucket_name=bucket,
            object_name=folder + MODEL_CARD_FILE,
            data=model_card(summary, facts).encode(),
            mime_type="text/markdown",
        )
        checked = run_probe_sync(hook, bucket, probe_hf_export(folder, with_card=True))
        if checked.error or not checked.status.complete:
            raise AirflowFailException(
                f"the export at gs://{bucket}/{folder} is not whole: {checked.error or ', '.join(checked.status.missing)}"
            )
        uri = f"gs://{bucket}/{folder}{MODEL_CARD_FILE}"
        self.log.info("model card: %s", uri)
        return uri


def publish_task_id(preset: str) -> str:
    """``publish_<preset>`` (a dot, Airflow's group separator in the UI, becomes ``_``)."""
    return "publish_" + preset.replace(".", "_")


def publish_converted_task_id(preset: str) -> str:
    """``publish_converted_<preset>`` (a dot becomes ``_``, as in :func:`publish_task_id`)."""
    return "publish_converted_" + preset.replace(".", "_")


class _PresetAssetPublisher(BaseOperator):
    """Emit one preset's asset event with the ``extra`` another task left in XCom.

    A pipeline runs one of several presets (a run parameter), and a static outlet emits an event
    whenever its task succeeds: so each preset has its own publisher, with its own asset as its
    outlet. The one of the run's model emits; the others skip (no event), and all skip when the
    source task left no ``extra``.
    """

    template_fields: Sequence[str] = ("model",)
    ui_color = "#f4ecd8"
    source_key: str | None = None  # the source task's XCom key (None: its return value)
    nothing_left = "left no asset event"

    def __init__(self, *, model: str, preset: str, source_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.preset = preset
        self.source_task_id = source_task_id

    def asset_uri(self) -> str:
        raise NotImplementedError

    def execute(self, context: Context) -> dict[str, Any]:
        if str(self.model) != self.preset:
            raise AirflowSkipException(f"this run's model is {self.model}, not {self.preset}: no event")
        if self.source_key is None:
            extra = context["ti"].xcom_pull(task_ids=self.source_task_id)
        else:
            extra = context["ti"].xcom_pull(task_ids=self.source_task_id, key=self.source_key)
        if not isinstance(extra, Mapping) or not extra:
            raise AirflowSkipException(f"{self.source_task_id} {self.nothing_left}: no event")
        for line in emit_asset_events(context, self.outlets or (), self.asset_uri(), extra):
            self.log.info("asset event: %s", line)
        return dict(extra)


class PublishModelAssetOperator(_PresetAssetPublisher):
    """Emit a promoted model's asset event, for one preset: the pipelines' static outlet per preset.

    Each preset of a pipeline has this task, with its own asset
    (:func:`~airflow_provider_tpu_rl.assets.model_asset`) as its outlet, after ``promote_model``.
    The one of the run's model gives its outlets ``promote_model``'s ``extra``; the others skip (no
    event), and all skip when the model was not promoted (``promote_model`` skipped).

    :param model: the run's model preset (templated).
    :param preset: the preset this task announces.
    :param promote_task_id: the task whose return value is the event's ``extra``.
    """

    nothing_left = "promoted no model"

    def __init__(
        self, *, model: str, preset: str, promote_task_id: str = "promote_model", **kwargs: Any
    ) -> None:
        super().__init__(model=model, preset=preset, source_task_id=promote_task_id, **kwargs)
        self.promote_task_id = promote_task_id

    def asset_uri(self) -> str:
        return model_asset_uri(self.preset)


class PublishConvertedCheckpointOperator(_PresetAssetPublisher):
    """Emit a converted checkpoint's asset event, for one preset, once its commit is verified.

    Each preset of a pipeline has this task, with its own asset
    (:func:`~airflow_provider_tpu_rl.assets.converted_checkpoint_asset`) as its outlet, after
    ``wait_converted_checkpoint``. The one of the run's model gives its outlets the ``extra`` the
    conversion task left under :data:`~airflow_provider_tpu_rl.assets.CONVERTED_EVENT_KEY`
    (converted now or found complete); the others skip.

    :param model: the run's model preset (templated).
    :param preset: the preset this task announces.
    :param convert_task_id: the conversion task (``MaxTextConvertOperator`` or the TPU VM's
        ``convert`` stage).
    """

    source_key = CONVERTED_EVENT_KEY
    nothing_left = "left no converted checkpoint"

    def __init__(
        self, *, model: str, preset: str, convert_task_id: str = "convert_to_maxtext", **kwargs: Any
    ) -> None:
        super().__init__(model=model, preset=preset, source_task_id=convert_task_id, **kwargs)
        self.convert_task_id = convert_task_id

    def asset_uri(self) -> str:
        return converted_checkpoint_asset_uri(self.preset)


class CheckPromotedModelOperator(BaseOperator):
    """Downstream of a model asset: read the newest triggering event's ``extra``, check its export in
    GCS (weights, tokenizer and the model card), and say it in one line (the task's XCom).

    :param models: the presets whose model assets the DAG is scheduled on.
    :param gcp_conn_id: the Google Cloud connection the export is read with.
    """

    ui_color = "#f4ecd8"

    def __init__(
        self, *, models: Sequence[str], gcp_conn_id: str = "google_cloud_default", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.models = list(models)
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Context) -> str:
        from airflow_provider_tpu_rl.assets import model_asset, triggering_extras
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
        from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

        extras = triggering_extras(context, [model_asset(model) for model in self.models])
        if not extras:
            raise AirflowFailException(
                f"no event of the model assets of {', '.join(self.models)} triggered this run"
            )
        extra = extras[-1]
        export = str(extra.get("export_uri") or "")
        if not export.startswith("gs://"):
            raise AirflowFailException(f"the model asset event names no export: {extra}")
        bucket, prefix = parse_gs_uri(as_folder(export))
        checked = run_probe_sync(
            gcs_hook(self.gcp_conn_id), bucket, probe_hf_export(as_folder(prefix), with_card=True)
        )
        if checked.error or not checked.status.complete:
            raise AirflowFailException(
                f"the export {export} is not whole: {checked.error or ', '.join(checked.status.missing)}"
            )
        line = (
            f"new model {extra.get('model')} from {extra.get('run_id')}: mean reward "
            f"{extra.get('pre_mean_reward')} -> {extra.get('post_mean_reward')}, export {export} "
            f"({len(checked.status.weight_files)} weight file(s), model card {MODEL_CARD_FILE})"
        )
        if len(extras) > 1:
            line += f"; {len(extras) - 1} earlier event(s) in this run"
        self.log.info("%s", line)
        return line
