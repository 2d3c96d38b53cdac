-- TPU cost per run: chips x cluster lifetime, newest runs first.
-- Parameters: :any_model (1 = all models, 0 = only :model), :row_limit.
SELECT
    r.run_id,
    r.model,
    r.state,
    r.started_at,
    r.duration_seconds,
    r.chips,
    r.cluster_started_at,
    r.cluster_ended_at,
    r.chip_hours
FROM runs AS r
WHERE (:any_model = 1 OR r.model = :model)
ORDER BY COALESCE(r.started_at, r.recorded_at) DESC, r.run_id DESC
LIMIT :row_limit
