-- BigQuery variant of migrations/0011: why the janitor closed a run's row, in one line.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS end_reason STRING;
