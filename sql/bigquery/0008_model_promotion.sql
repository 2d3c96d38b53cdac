-- BigQuery variant of migrations/0009: the promotion gate's decision in one line.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS promotion STRING;
