-- BigQuery variant of migrations/0005: why a run was refused before anything was spent.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS refusal STRING;
