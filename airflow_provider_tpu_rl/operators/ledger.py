"""``record_run``: the pipelines' last teardown. It writes the run to the ledger and draws its curves."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.compat import conf
from airflow_provider_tpu_rl.ledger.cli import format_cpu_minutes, format_resumes, format_tpu_time
from airflow_provider_tpu_rl.ledger.collect import (
    ERROR_XCOM_KEY,
    INVALID_CONF,
    capacity_served,
    gke_cluster_of,
    task_states,
)
from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger, record_run_from_context
from airflow_provider_tpu_rl.ledger.plots import (
    PLOT_EXTRA_HINT,
    figure_png,
    load_matplotlib,
    matplotlib_available,
    run_curves,
    run_curves_figure,
    run_timeline,
)
from airflow_provider_tpu_rl.ledger.records import (
    CLUSTER_EXISTING,
    CLUSTER_KEPT,
    ArtifactRecord,
    RunRecord,
    gke_cluster_text,
    served_capacity,
)
from airflow_provider_tpu_rl.links import RunDashboardLink
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri
from airflow_provider_tpu_rl.spec import SpecError
from airflow_provider_tpu_rl.spec.cluster import ON_DEMAND
from airflow_provider_tpu_rl.spec.presets import Runner, get_preset

log = logging.getLogger(__name__)

ACTOR_FOLDER = "checkpoints/actor/"
CURVES_PREFIX = "tpu-rl-curves"
PLOT_IMPORT_THREAD = "record_run-plot-import"

Upload = Callable[[str, bytes], None]

# Cloud TPU v6e (Trillium) on-demand list price per chip-hour, us-east1, as Google published it at
# v6e's general availability (December 2024); set [tpu_rl] usd_per_chip_hour for your region or
# your committed-use or spot price.
DEFAULT_USD_PER_CHIP_HOUR = 2.70


def default_usd_per_chip_hour(capacity: str | None = None) -> float:
    """``[tpu_rl] usd_per_chip_hour``: the price a run's billed chip-hours are costed at; for the
    capacity kind that served them, its own option where set (``spot_usd_per_chip_hour``,
    ``flex_start_usd_per_chip_hour``, ``reservation_usd_per_chip_hour``: no default, the prices of
    docs/tpu-prices.md other than on-demand's are derived, not read), else that one."""
    price = conf.getfloat("tpu_rl", "usd_per_chip_hour", fallback=DEFAULT_USD_PER_CHIP_HOUR)
    if capacity and capacity != ON_DEMAND:
        return conf.getfloat("tpu_rl", f"{capacity.replace('-', '_')}_usd_per_chip_hour", fallback=price)
    return price


def run_output_folder(actor_root: str | None) -> str | None:
    """The training run's folder (``…/<run_name>/``) from its actor checkpoint root, or None."""
    if not actor_root or not str(actor_root).startswith("gs://"):
        return None
    root = str(actor_root).rstrip("/") + "/"
    return root.removesuffix(ACTOR_FOLDER) if root.endswith(ACTOR_FOLDER) else root


def curves_uri(folder: str, suffix: str | None) -> str:
    """``<run folder>/tpu-rl-curves-<suffix>.png``: one picture per DAG run."""
    name = f"{CURVES_PREFIX}-{suffix}.png" if suffix else f"{CURVES_PREFIX}.png"
    return folder.rstrip("/") + "/" + name


def run_settings(derived: Mapping[str, Any], served: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run was asked to do, from ``validate``'s resolved values: the model, the TPU capacity
    (and its reservation), the training steps, the learning rate (the run's override, else the
    preset's; None: MaxText's own default), the run name, the TPU shape and the run's own MaxText
    overrides; with ``served`` (``collect.capacity_served``), the kind an ordered capacity got and
    the kinds refused before it. The dashboard's run page lists them; the ledger keeps them."""
    model = str(derived.get("model") or "")
    overrides = dict(derived.get("train_overrides") or {})
    # the pipeline the values are of: a TPU VM run names its VM (a model both offer has a preset each)
    runner = Runner.TPU_VM if derived.get("vm_name") else Runner.GKE
    try:
        preset_overrides = dict(get_preset(model, runner=runner).train_overrides)
    except SpecError:
        preset_overrides = {}
    learning_rate = overrides.get("learning_rate", preset_overrides.get("learning_rate"))
    settings = {
        "model": model,
        "capacity": derived.get("capacity"),
        "reservation": derived.get("reservation") or None,
        "steps": derived.get("num_batches"),
        "learning_rate": learning_rate,
        "run_name": derived.get("run_name"),
        "compute_type": derived.get("compute_type"),
        "topology": derived.get("topology"),
        "num_slices": derived.get("num_slices"),
        "runtime": derived.get("runtime"),
        "train_overrides": overrides,
        **dict(served or {}),
    }
    return {key: value for key, value in settings.items() if value is not None}


def tpu_time_line(run: RunRecord) -> str:
    """One line: billed (the machines' clocks) and training chip-hours, the idle share, the
    estimated cost and the capacity held."""
    return format_tpu_time(run.chip_hours, run.busy_chip_hours, run.estimated_cost_usd, run.held_chip_hours)


def cluster_line(cluster: str, origin: str | None) -> str:
    """The run's GKE cluster and where it came from; a kept or existing one's own cost is not the run's."""
    text = str(gke_cluster_text(cluster, origin))
    if origin in (CLUSTER_KEPT, CLUSTER_EXISTING):
        return f"{text}; its own cost (control plane, system pool) is not charged to this run"
    return text


class RecordRunOperator(BaseOperator):
    """Record the DAG run in the run ledger, then draw its curves into a PNG next to its checkpoints.

    A teardown: it runs whatever happened to the run. The values it needs come from the
    ``validate`` task's XCom (model, chips, final step, actor checkpoint root, project); a run
    whose ``validate`` failed is still recorded (without curves). The curves (mean reward before,
    at each evaluation, after; train loss per step) are read back from the ledger, drawn with
    matplotlib (the optional extra ``plot``; without it the picture is skipped with one log line)
    and uploaded to ``<run folder>/tpu-rl-curves-<suffix>.png``, which the ledger lists among the
    run's artifacts (kind ``curves``). The *Run Curves* link opens the run's page on the runs
    dashboard in Airflow, which shows that picture. A failed upload is logged, never raised: the
    ledger row is what this task is for.

    :param conn_id: the ledger's Airflow connection.
    :param cluster_task_ids: the tasks that create and destroy the TPU capacity (the capacity held
        runs from the first's start to the second's end); the second's return value holds the
        machines' billed spans (``billed``: ``TpuVmDeleteOperator``, ``GclusterDestroyOperator`` with
        ``only_groups=["tpu"]``), else the billed time is unknown (``collect_options``
        ``billing_task_id`` names another task).
    :param ignored_task_ids: tasks whose failure does not fail the recorded run (the watcher).
    :param teardown_task_ids: teardowns whose failure does not fail the recorded run.
    :param validate_task_id: the task whose XCom holds the resolved values.
    :param plot: draw and upload the curves.
    :param gcp_conn_id: the Google Cloud connection for the upload.
    :param collect_options: more arguments of the ledger's collector (``train_task_id``, ...).
    :param usd_per_chip_hour: the price the billed chip-hours are costed at; None =
        ``[tpu_rl] usd_per_chip_hour`` (default the v6e on-demand list price, 2.70).
    """

    operator_extra_links = (RunDashboardLink(),)
    ui_color = "#eef5e8"

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        cluster_task_ids: Sequence[str] = ("deploy_cluster", "destroy_cluster"),
        ignored_task_ids: Sequence[str] = (),
        teardown_task_ids: Sequence[str] | None = None,
        validate_task_id: str = "validate",
        plot: bool = True,
        gcp_conn_id: str = "google_cloud_default",
        collect_options: Mapping[str, Any] | None = None,
        usd_per_chip_hour: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.usd_per_chip_hour = usd_per_chip_hour
        self.conn_id = conn_id
        self.cluster_task_ids = tuple(cluster_task_ids)
        self.ignored_task_ids = tuple(ignored_task_ids)
        self.teardown_task_ids = None if teardown_task_ids is None else tuple(teardown_task_ids)
        self.validate_task_id = validate_task_id
        self.plot = plot
        self.gcp_conn_id = gcp_conn_id
        self.collect_options = dict(collect_options or {})

    def execute(self, context: Context) -> dict[str, Any]:
        loader = None
        if self.plot and matplotlib_available():
            # matplotlib's import (about half a second) runs while the run is being recorded. The task
            # waits for it before it ends: an import still running in a thread as the process exits
            # can abort the interpreter (numpy's and Pillow's C modules during finalization).
            loader = threading.Thread(target=load_matplotlib, name=PLOT_IMPORT_THREAD)
            loader.start()
        try:
            return self.record(context)
        finally:
            if loader is not None:
                loader.join()

    def record(self, context: Context) -> dict[str, Any]:
        """Record the run in the ledger, draw and upload its curves, persist its dashboard link."""
        derived = context["ti"].xcom_pull(task_ids=self.validate_task_id) or {}
        refusal = self.refusal(context)
        if refusal:
            self.log.info("The run was %s", refusal)
        settings = (
            run_settings(derived, capacity_served(context["ti"], self.cluster_task_ids[0]))
            if derived
            else None
        )
        run = record_run_from_context(
            context,
            model=str(derived.get("model") or context["params"].get("model")),
            chips=derived.get("chips"),
            conn_id=self.conn_id,
            refusal=refusal,
            settings=settings,
            gke_cluster=gke_cluster_of(context["ti"], derived),
            cluster_task_ids=self.cluster_task_ids,
            teardown_task_ids=self.teardown_task_ids,
            ignored_task_ids=self.ignored_task_ids,
            # the price of the kind that served the TPUs
            usd_per_chip_hour=(
                default_usd_per_chip_hour(served_capacity(settings or {}))
                if self.usd_per_chip_hour is None
                else self.usd_per_chip_hour
            ),
            **self.collect_options,
        )
        self.log.info("TPU time of this run: %s", tpu_time_line(run))
        if run.gke_cluster:
            self.log.info("GKE cluster: %s", cluster_line(run.gke_cluster, run.gke_cluster_origin))
        for span in run.vm_spans:
            self.log.info(
                "CPU VM %s (%s, %s): billed %s minutes",
                span.name,
                span.purpose,
                span.machine_type,
                format_cpu_minutes(span.billed_seconds),
            )
        if run.resume_loss is not None and run.resume_loss.resumes:
            loss = run.resume_loss
            self.log.info(
                "Training resumed %d time(s): %s",
                loss.resumes,
                format_resumes(loss.resumes, loss.steps_lost, loss.seconds_lost),
            )
        result: dict[str, Any] = {"run_id": run.run_id, "state": run.state}
        uri = self.publish_curves(run, derived, self.upload) if self.plot else None
        if uri:
            result["curves_uri"] = uri
        RunDashboardLink.persist(context, dag_id=run.dag_id, run_id=run.airflow_run_id)
        return result

    def refusal(self, context: Context) -> str | None:
        """``refused at validate: <its error's first line>`` when the validate task failed, else None."""
        if task_states(context).get(self.validate_task_id) != "failed":
            return None
        said = context["ti"].xcom_pull(task_ids=self.validate_task_id, key=ERROR_XCOM_KEY)
        reason = str(said).removeprefix(INVALID_CONF) if said else "see its log"
        return f"refused at {self.validate_task_id}: {reason}"

    def upload(self, uri: str, data: bytes) -> None:
        """Write ``data`` to the ``gs://`` object ``uri`` (a PNG)."""
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

        bucket, name = parse_gs_uri(uri)
        gcs_hook(self.gcp_conn_id).upload(
            bucket_name=bucket, object_name=name, data=data, mime_type="image/png"
        )

    def publish_curves(self, run: RunRecord, derived: Mapping[str, Any], upload: Upload) -> str | None:
        """Draw the run's curves and timeline from the ledger, upload the PNG, list it in the run's
        artifacts; the URI or None."""
        run_id = run.run_id
        if not matplotlib_available():
            log.info("run curves: matplotlib is not installed (%s); no picture drawn", PLOT_EXTRA_HINT)
            return None
        folder = run_output_folder(derived.get("actor_root"))
        if folder is None:
            log.info("run curves: the run has no output folder (validate did not run); no picture")
            return None
        final_step = derived.get("final_step")
        ledger = RunLedger(self.conn_id)
        curves = run_curves(run_id, ledger.run_metrics(run_id), int(final_step) if final_step else None)
        if curves.empty:
            log.info("run curves: the ledger holds no reward or loss for this run; no picture")
            return None
        uri = curves_uri(folder, derived.get("suffix"))
        timeline = run_timeline(run, ledger.recorded_steps(run_id).values(), ignored=(self.task_id,))
        png = figure_png(run_curves_figure(curves, timeline))
        try:
            upload(uri, png)
        except Exception:
            log.warning("run curves: could not upload %s; the run is recorded without it", uri, exc_info=True)
            return None
        ledger.record_artifacts(run_id, [ArtifactRecord("curves", uri)])
        log.info(
            "run curves: %s (%d reward points, %d loss points)",
            uri,
            len(curves.reward_points),
            len(curves.loss),
        )
        return uri
