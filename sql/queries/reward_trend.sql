-- Reward trend per model: every run with a pre or post mean reward, oldest first.
-- Parameters: :any_model (1 = all models, 0 = only :model).
WITH rewards AS (
    SELECT
        m.run_id,
        MAX(
            CASE WHEN m.phase = 'pre' AND m.metric_name = 'mean_reward' THEN m.metric_value END
        ) AS pre_mean_reward,
        MAX(
            CASE WHEN m.phase = 'post' AND m.metric_name = 'mean_reward' THEN m.metric_value END
        ) AS post_mean_reward
    FROM run_metrics AS m
    WHERE m.metric_name = 'mean_reward' AND m.phase IN ('pre', 'post')
    GROUP BY m.run_id
)

SELECT
    r.model,
    r.run_id,
    r.state,
    r.started_at,
    rewards.pre_mean_reward,
    rewards.post_mean_reward,
    rewards.post_mean_reward - rewards.pre_mean_reward AS reward_delta
FROM runs AS r
INNER JOIN rewards ON r.run_id = rewards.run_id
WHERE (:any_model = 1 OR r.model = :model)
ORDER BY r.model ASC, COALESCE(r.started_at, r.recorded_at) ASC, r.run_id ASC
