-- What failed: the failed tasks of the newest runs, with their last try and job.
-- Parameters: :any_model (1 = all models, 0 = only :model), :row_limit.
SELECT
    s.run_id,
    r.model,
    s.task_id,
    s.state,
    s.try_number,
    s.job_name,
    s.started_at,
    s.ended_at
FROM run_steps AS s
INNER JOIN runs AS r ON s.run_id = r.run_id
WHERE
    s.state IN ('failed', 'upstream_failed')
    AND (:any_model = 1 OR r.model = :model)
ORDER BY COALESCE(r.started_at, r.recorded_at) DESC, s.run_id DESC, s.task_id ASC
LIMIT :row_limit
