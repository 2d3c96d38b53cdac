-- TPU time that trained beside the time billed: the training job's running span,
-- its chip-hours, and the price per chip-hour the run's cost was estimated with.
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN train_started_at TIMESTAMP WITH TIME ZONE;

ALTER TABLE runs ADD COLUMN train_ended_at TIMESTAMP WITH TIME ZONE;

ALTER TABLE runs ADD COLUMN busy_chip_hours DOUBLE PRECISION;

ALTER TABLE runs ADD COLUMN usd_per_chip_hour DOUBLE PRECISION;

ALTER TABLE runs ADD COLUMN estimated_cost_usd DOUBLE PRECISION;
