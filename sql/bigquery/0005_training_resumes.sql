-- BigQuery variant of migrations/0006: what restarting a run's training cost.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS resumes INT64,
ADD COLUMN IF NOT EXISTS steps_lost INT64,
ADD COLUMN IF NOT EXISTS seconds_lost FLOAT64;
