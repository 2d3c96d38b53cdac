"""``record_run``: the pipelines' last teardown. It writes the run to the ledger and draws its curves."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseOperator, Context

from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger, record_run_from_context
from airflow_provider_tpu_rl.ledger.plots import (
    PLOT_EXTRA_HINT,
    figure_png,
    matplotlib_available,
    run_curves,
    run_curves_figure,
)
from airflow_provider_tpu_rl.links import GCSObjectLink
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

log = logging.getLogger(__name__)

ACTOR_FOLDER = "checkpoints/actor/"
CURVES_PREFIX = "tpu-rl-curves"

Upload = Callable[[str, bytes], None]


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


class RecordRunOperator(BaseOperator):
    """Record the DAG run in the run ledger, then draw its curves into a PNG next to its checkpoints.

    A teardown: it runs whatever happened to the run. The values it needs come from the
    ``validate`` task's XCom (model, chips, final step, actor checkpoint root, project); a run
    whose ``validate`` failed is still recorded (without curves). The curves (mean reward before,
    at each evaluation, after; train loss per step) are read back from the ledger, drawn with
    matplotlib (the optional extra ``plot``; without it the picture is skipped with one log line)
    and uploaded to ``<run folder>/tpu-rl-curves-<suffix>.png``; the *Run Curves* link opens it.
    A failed upload is logged, never raised: the ledger row is what this task is for.

    :param conn_id: the ledger's Airflow connection.
    :param cluster_task_ids: the tasks that create and destroy the billed resource.
    :param ignored_task_ids: tasks whose failure does not fail the recorded run (the watcher).
    :param teardown_task_ids: teardowns whose failure does not fail the recorded run.
    :param validate_task_id: the task whose XCom holds the resolved values.
    :param plot: draw and upload the curves.
    :param gcp_conn_id: the Google Cloud connection for the upload.
    """

    operator_extra_links = (GCSObjectLink(),)
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.cluster_task_ids = tuple(cluster_task_ids)
        self.ignored_task_ids = tuple(ignored_task_ids)
        self.teardown_task_ids = None if teardown_task_ids is None else tuple(teardown_task_ids)
        self.validate_task_id = validate_task_id
        self.plot = plot
        self.gcp_conn_id = gcp_conn_id
        self.collect_options = dict(collect_options or {})

    def execute(self, context: Context) -> dict[str, Any]:
        derived = context["ti"].xcom_pull(task_ids=self.validate_task_id) or {}
        run = record_run_from_context(
            context,
            model=str(derived.get("model") or context["params"].get("model")),
            chips=derived.get("chips"),
            conn_id=self.conn_id,
            cluster_task_ids=self.cluster_task_ids,
            teardown_task_ids=self.teardown_task_ids,
            ignored_task_ids=self.ignored_task_ids,
            **self.collect_options,
        )
        result: dict[str, Any] = {"run_id": run.run_id, "state": run.state}
        uri = self.publish_curves(context, run.run_id, derived, self.upload) if self.plot else None
        if uri:
            result["curves_uri"] = uri
        else:
            GCSObjectLink.persist_none(context)
        return result

    def upload(self, uri: str, data: bytes) -> None:
        """Write ``data`` to the ``gs://`` object ``uri`` (a PNG)."""
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

        bucket, name = parse_gs_uri(uri)
        gcs_hook(self.gcp_conn_id).upload(
            bucket_name=bucket, object_name=name, data=data, mime_type="image/png"
        )

    def publish_curves(
        self, context: Context, run_id: str, derived: Mapping[str, Any], upload: Upload
    ) -> str | None:
        """Draw the run's curves from the ledger, upload the PNG, persist the link; the URI or None."""
        if not matplotlib_available():
            log.info("run curves: matplotlib is not installed (%s); no picture drawn", PLOT_EXTRA_HINT)
            return None
        folder = run_output_folder(derived.get("actor_root"))
        if folder is None:
            log.info("run curves: the run has no output folder (validate did not run); no picture")
            return None
        final_step = derived.get("final_step")
        curves = run_curves(
            run_id, RunLedger(self.conn_id).run_metrics(run_id), int(final_step) if final_step else None
        )
        if curves.empty:
            log.info("run curves: the ledger holds no reward or loss for this run; no picture")
            return None
        uri = curves_uri(folder, derived.get("suffix"))
        png = figure_png(run_curves_figure(curves))
        try:
            upload(uri, png)
        except Exception:
            log.warning("run curves: could not upload %s; the run is recorded without it", uri, exc_info=True)
            return None
        GCSObjectLink.persist(context, uri=uri, project_id=derived.get("project") or None)
        log.info(
            "run curves: %s (%d reward points, %d loss points)",
            uri,
            len(curves.reward_points),
            len(curves.loss),
        )
        return uri
