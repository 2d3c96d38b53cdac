-- BigQuery variant of migrations/0007: what a run was asked to do, as JSON.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS settings_json STRING;
