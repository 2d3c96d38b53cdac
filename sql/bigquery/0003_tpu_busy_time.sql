-- BigQuery variant of migrations/0004: the training span, its chip-hours and the
-- run's estimated cost.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS train_started_at TIMESTAMP,
ADD COLUMN IF NOT EXISTS train_ended_at TIMESTAMP,
ADD COLUMN IF NOT EXISTS busy_chip_hours FLOAT64,
ADD COLUMN IF NOT EXISTS usd_per_chip_hour FLOAT64,
ADD COLUMN IF NOT EXISTS estimated_cost_usd FLOAT64;
