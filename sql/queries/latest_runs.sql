-- Newest runs first, with pre/post mean reward (and the evaluation's num_test_batches, which says
-- why a reward is missing), the Hugging Face export, the price its cost was estimated at,
-- what it was asked to do (settings_json), its billed TPU time from the machines' clocks
-- (chip_hours, billed_chip_seconds, billed_spans_json), the capacity it held (held_chip_hours),
-- the promotion gate's line (promotion) and the billed CPU seconds of its boot image's bake VM
-- (bake_billed_seconds, from run_vm_spans; NULL when it baked nothing), and why the janitor closed
-- a row its run never closed (end_reason), and the GKE cluster it ran on and where that came from
-- (gke_cluster, gke_cluster_origin: created, kept or existing).
-- Parameters: :any_model (1 = all models, 0 = only :model), :any_run (1 = all runs, 0 = only
-- :run_id), :row_limit.
WITH rewards AS (
    SELECT
        m.run_id,
        MAX(
            CASE WHEN m.phase = 'pre' AND m.metric_name = 'mean_reward' THEN m.metric_value END
        ) AS pre_mean_reward,
        MAX(
            CASE WHEN m.phase = 'post' AND m.metric_name = 'mean_reward' THEN m.metric_value END
        ) AS post_mean_reward,
        MAX(
            CASE WHEN m.phase = 'train' AND m.metric_name = 'num_test_batches' THEN m.metric_value END
        ) AS num_test_batches
    FROM run_metrics AS m
    WHERE
        (m.metric_name = 'mean_reward' AND m.phase IN ('pre', 'post'))
        OR (m.metric_name = 'num_test_batches' AND m.phase = 'train')
    GROUP BY m.run_id
),

exports AS (
    SELECT
        a.run_id,
        MAX(a.uri) AS export_uri
    FROM run_artifacts AS a
    WHERE a.kind = 'hf_export'
    GROUP BY a.run_id
),

bakes AS (
    SELECT
        v.run_id,
        SUM(v.billed_seconds) AS bake_billed_seconds
    FROM run_vm_spans AS v
    WHERE v.purpose = 'bake'
    GROUP BY v.run_id
)

SELECT
    r.run_id,
    r.dag_id,
    r.airflow_run_id,
    r.model,
    r.state,
    r.started_at,
    r.ended_at,
    r.duration_seconds,
    r.chips,
    r.chip_hours,
    r.busy_chip_hours,
    r.estimated_cost_usd,
    r.refusal,
    r.resumes,
    r.steps_lost,
    r.seconds_lost,
    r.usd_per_chip_hour,
    r.settings_json,
    r.promotion,
    r.billed_chip_seconds,
    r.held_chip_hours,
    r.billed_spans_json,
    r.end_reason,
    r.gke_cluster,
    r.gke_cluster_origin,
    rewards.pre_mean_reward,
    rewards.post_mean_reward,
    rewards.num_test_batches,
    exports.export_uri,
    bakes.bake_billed_seconds
FROM runs AS r
LEFT JOIN rewards ON r.run_id = rewards.run_id
LEFT JOIN exports ON r.run_id = exports.run_id
LEFT JOIN bakes ON r.run_id = bakes.run_id
WHERE
    (:any_model = 1 OR r.model = :model)
    AND (:any_run = 1 OR r.run_id = :run_id)
ORDER BY COALESCE(r.started_at, r.recorded_at) DESC, r.run_id DESC
LIMIT :row_limit
